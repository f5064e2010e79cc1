"""End to end under penalties, logit_bias and a grammar mask: the joint of the first two generated tokens under
speculative sampling equals the target's own, adjusted at each position for the tokens before it (computed
exactly, with the adjustments written out by hand here and the sampling filters by tests/stats.reference_probs,
not the engine's process_logits). The negative controls forget the drafted prefix when
the target adjusts a verify position, in a chain and in a tree, and the same assertion fails.

(A penalty applied to p but not to the drafter's q is *not* a fault: rejection sampling is exact for whatever
q the drafts were drawn from, so that case only lowers acceptance; the engine applies it to both anyway.)
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import specdecode.engine.engine
from specdecode import LLM
from specdecode.step.runner import prefill
from tests.engine.test_distribution import PARAMS, REPEATING, SHORT, VOCAB, make, models  # noqa: F401
from tests.engine.test_penalties import penalise
from tests.stats import assert_follows, reference_probs

N = 2000
PENALISED = replace(PARAMS, frequency_penalty=2.0, presence_penalty=1.0, repetition_penalty=1.5, logit_bias={3: 1.5})


class NoRepeat:
    """A toy grammar: token 0 never, and no token twice in a row. Which tokens it allows depends on the path."""

    def __init__(self, last: int) -> None:
        self.last = last

    def _ok(self, last: int, tok: int) -> bool:
        return tok != 0 and tok != last

    def allowed(self, paths: list[list[int]]) -> tuple[torch.Tensor, list[bool]]:
        masks, valid = torch.zeros((len(paths), VOCAB), dtype=torch.bool), []
        for i, path in enumerate(paths):
            last, ok = self.last, True
            for tok in path:
                ok, last = ok and self._ok(last, tok), tok
            valid.append(ok)
            if ok:
                masks[i] = torch.tensor([self._ok(last, t) for t in range(VOCAB)])
        return masks, valid

    def advance(self, tokens: list[int]) -> None:
        self.last = tokens[-1]  # a token outside the grammar is left for the joint's check to catch

    @property
    def is_terminated(self) -> bool:
        return False


def adjusted(logits: torch.Tensor, prompt: list[int], output: list[int], grammar: bool) -> torch.Tensor:
    """[vocab] logits after logit_bias, the penalties and the toy grammar, by hand."""
    logits = penalise(logits, prompt, output, PENALISED)
    if grammar:
        last = (prompt + output)[-1]
        for token in range(VOCAB):
            if token == 0 or token == last:
                logits[token] = float("-inf")
    return logits.float()


def exact_joint(llm: LLM, prompt: list[int], grammar: bool) -> torch.Tensor:
    """[vocab, vocab] P(x1, x2 | prompt) under the adjusted, processed target distribution."""
    model = llm.target
    cache = model.new_cache(1, 32)
    with torch.inference_mode():
        first = adjusted(prefill(model, cache, 0, prompt, 64)[0, 0], prompt, [], grammar)
        p1 = reference_probs(first, PENALISED)  # [vocab]
        rows = []
        for x1 in range(VOCAB):
            cache.set_length(0, len(prompt))
            second = adjusted(prefill(model, cache, 0, [x1], 64)[0, 0], prompt, [x1], grammar)
            rows.append(reference_probs(second, PENALISED))
    return p1[:, None] * torch.stack(rows)  # [vocab, vocab]


def sampled_joint(llm: LLM, prompt: list[int], grammar: bool) -> tuple[torch.Tensor, int]:
    seqs = []
    for i in range(N):
        seq = llm.engine.add_request(f"r{i}", prompt, replace(PENALISED, seed=i if i % 2 else None))
        seq.grammar = NoRepeat(prompt[-1]) if grammar else None
        seqs.append(seq)
    while llm.engine.has_work():
        llm.engine.step()
    counts = torch.zeros(VOCAB, VOCAB)
    for s in seqs:
        counts[s.output_ids[0], s.output_ids[1]] += 1
    return counts, sum(s.metrics.num_drafted for s in seqs)


def forget_drafted_prefix(mp: pytest.MonkeyPatch) -> None:
    """Fault: every verify position is adjusted as if no draft came before it (chains and trees)."""
    for name in ("chain_paths", "tree_paths"):
        real = getattr(specdecode.engine.engine, name)
        mp.setattr(specdecode.engine.engine, name, lambda *a, real=real: torch.full_like(real(*a), -1))


# (method, prompt, grammar, faulty): one-hot chain and tree (the race), sampled drafts (rejection sampling). A
# forgotten prefix moves only the samples whose first draft was accepted, which the n-gram chain's rarely is
# here; the self-draft's always is (q = p), so it carries the chain's controls.
CASES = [
    ("ngram", REPEATING, True, False),  # a chain cut at its first draft outside the grammar
    ("ngram_tree", REPEATING, True, False),
    ("draft", SHORT[:1], True, False),
    ("self", SHORT, False, False),
    ("self", SHORT, True, True),
    ("ngram_tree", REPEATING, True, True),
    ("self", SHORT, False, True),  # q = p: the first draft is always accepted, so position 1 always decides
]


@pytest.mark.parametrize(("method", "prompt", "grammar", "faulty"), CASES)
def test_first_two_tokens_follow_the_adjusted_target(models, method, prompt, grammar, faulty, monkeypatch):  # noqa: F811
    llm = make(models, method)
    if faulty:
        forget_drafted_prefix(monkeypatch)
    counts, drafted = sampled_joint(llm, prompt, grammar)
    assert_follows(counts, exact_joint(llm, prompt, grammar), "forget_drafted_prefix" if faulty else None)
    assert drafted >= N // 2  # speculation really ran
