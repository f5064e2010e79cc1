"""Tree proposals through the engine: greedy output equals plain greedy, and the cache keeps only the path.

A scripted drafter builds trees from the known greedy continuation: the right token hides among wrong
siblings at a random place, right branches continue deeper, wrong ones grow wrong subtrees. So acceptance
needs the path-following walk, and the kept K/V must be the accepted path's, moved behind the pending token.
"""

from __future__ import annotations

import random

import pytest
import torch

from specdecode import LLM, SamplingParams
from specdecode.drafters.base import DrafterBase, Proposal
from specdecode.kv import KVCache
from specdecode.step.sequence import Sequence
from specdecode.verify.sampling import PAD_TOKEN_ID, SamplingTensors
from tests.engine.test_cache import cache_matches_fresh_prefill

GREEDY = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
PROMPTS = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [11, 12, 13], [20, 21, 22, 23, 24, 25, 26], [3, 4]]
VOCAB = 96


class ScriptedTreeDrafter(DrafterBase):
    """Trees of up to k nodes around the true continuation (`answers[request_id]` = the greedy output)."""

    def __init__(self, answers: dict[str, list[int]], seed: int, branch: int = 3) -> None:
        self.answers = answers
        self.rng = random.Random(seed)
        self.branch = branch
        self.prompt_len: dict[str, int] = {}

    def add_sequence(self, seq: Sequence) -> None:
        self.prompt_len[seq.request_id] = len(seq.prompt_ids)

    def remove_sequence(self, seq: Sequence) -> None:
        self.prompt_len.pop(seq.request_id, None)

    def _tree(self, seq: Sequence, k: int) -> tuple[list[int], list[int]]:
        truth = self.answers[seq.request_id][len(seq.token_ids) - self.prompt_len[seq.request_id] :]
        tokens: list[int] = []
        parents: list[int] = []
        frontier = [(0, True, 0)]  # (tree position, on the true path, depth)
        while frontier and len(tokens) < k:
            pos, right, depth = frontier.pop(0)
            width = self.rng.randint(1, self.branch)
            true_at = self.rng.randrange(width) if right and self.rng.random() < 0.8 else -1
            for i in range(width):
                if len(tokens) >= k:
                    break
                is_true = i == true_at and depth < len(truth)
                tok = truth[depth] if is_true else self.rng.randrange(3, VOCAB)
                tokens.append(tok)
                parents.append(pos)
                frontier.append((len(tokens), is_true, depth + 1))
        return tokens, parents

    def propose(self, seqs: list[Sequence], num_tokens: list[int], st: SamplingTensors) -> Proposal:
        k = max(num_tokens, default=0)
        ids = torch.full((len(seqs), max(k, 1)), PAD_TOKEN_ID, dtype=torch.long)
        parents = torch.zeros((len(seqs), max(k, 1)), dtype=torch.long)
        counts = []
        for b, (seq, n) in enumerate(zip(seqs, num_tokens, strict=True)):
            tokens, par = self._tree(seq, n)
            ids[b, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
            parents[b, : len(par)] = torch.tensor(par, dtype=torch.long)
            counts.append(len(tokens))
        return Proposal(ids[:, :k], torch.tensor(counts), None, None, parents[:, :k])


@pytest.fixture(scope="module")
def reference(tiny_target) -> list[list[int]]:
    llm = LLM(target=str(tiny_target), method="none", max_num_seqs=1)
    return [llm.generate([p], GREEDY)[0].token_ids for p in PROMPTS]


def tree_llm(tiny_target, reference, k: int, batch: int, seed: int = 0) -> LLM:
    llm = LLM(target=str(tiny_target), method="none", num_speculative_tokens=0, controller="fixed", max_num_seqs=batch)
    answers = {f"req-{i}": ref for i, ref in enumerate(reference)}
    llm.engine.drafter = ScriptedTreeDrafter(answers, seed)
    llm.engine.k_max = k  # the fixed controller asks every row for k nodes
    return llm


@pytest.mark.parametrize("k", [1, 4, 12])
@pytest.mark.parametrize("batch", [1, 4])
def test_tree_greedy_equals_plain_greedy(tiny_target, reference, k, batch):
    llm = tree_llm(tiny_target, reference, k, batch)
    outs = llm.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == reference
    accepted = sum(o.metrics["num_accepted"] for o in outs)
    drafted = sum(o.metrics["num_drafted"] for o in outs)
    assert 0 < accepted < drafted  # trees really had right and wrong branches
    if k == 12:  # deeper than a chain of first candidates would reach: the walk follows non-first siblings
        assert max(o.metrics["mean_accepted_tokens"] for o in outs) > 2.0


def test_tree_cache_holds_the_path(tiny_target, reference):
    llm = tree_llm(tiny_target, reference, 12, 1)
    engine = llm.engine
    seq = engine.add_request("req-0", PROMPTS[0], GREEDY)
    moved = 0
    while engine.has_work() and len(seq.output_ids) < 30:
        engine.step()
        moved += engine.last_step is not None and engine.last_step.num_accepted[0] > 0
    assert moved > 0
    assert cache_matches_fresh_prefill(llm.target, engine.cache, seq.slot, seq.token_ids)


def test_missing_compaction_is_detected(tiny_target, reference, monkeypatch):
    """Negative control: keeping tree K/V where the nodes sat (no move onto the path) changes the output."""
    monkeypatch.setattr(KVCache, "compact", lambda self, slot, start, offsets: None)
    llm = tree_llm(tiny_target, reference, 12, 1)
    outs = llm.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] != reference
