"""The suffix drafters through the engine: lossless (greedy and sampled), drafts really come from the corpus and
from finished requests, the cache of finished outputs stays bounded, and per-request state is freed."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from specdecode import LLM, SamplingParams
from specdecode.config import ConfigError
from specdecode.drafters.none import NoDrafter
from specdecode.drafters.suffix import OutputCache, SuffixDrafter
from specdecode.verify import streams
from specdecode.verify import tree as verify_tree
from tests.drafters.test_suffix_index import write_corpus
from tests.engine.test_distribution import SHORT as PROMPT
from tests.engine.test_distribution import VOCAB, exact_joint, sampled_joint
from tests.stats import fits
from tests.tiny import write_tiny_model

GREEDY = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
_rng = random.Random(0)
PROMPTS = [[_rng.randrange(3, 96) for _ in range(_rng.randint(2, 8))] for _ in range(8)]


@pytest.fixture(scope="module")
def reference(tiny_target) -> list[list[int]]:
    llm = LLM(target=str(tiny_target), method="none", max_num_seqs=len(PROMPTS))  # batched = unbatched
    return [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, reference) -> str:
    """The target's own greedy responses to the first 6 prompts, plus a copy of each with one token changed
    halfway: continuations branch, so some drafts are rejected and trees have wrong siblings."""
    rng = np.random.default_rng(0)
    records = []
    for prompt, out in zip(PROMPTS[:6], reference[:6], strict=True):
        wrong = list(out)
        wrong[len(out) // 2] = int(rng.integers(3, 96))
        records += [(prompt, out), (prompt, wrong)]
    return str(write_corpus(tmp_path_factory.mktemp("corpus") / "responses.npz", records))


def suffix_llm(target, method: str, batch: int, corpus: tuple[str, ...] = (), cache: int = 0, **kw) -> LLM:
    return LLM(
        target=str(target),
        method=method,
        num_speculative_tokens=8,
        controller="fixed",
        max_num_seqs=batch,
        suffix_corpus=corpus,
        suffix_cache_max_tokens=cache,
        **kw,
    )


def tau(outs) -> float:
    """Tokens per target forward over all outputs (1.0 = plain decoding)."""
    return sum(o.metrics["num_generated"] for o in outs) / sum(o.metrics["num_target_forwards"] for o in outs)


@pytest.mark.parametrize("method", ["suffix", "suffix_tree"])
@pytest.mark.parametrize("batch", [1, 4])
def test_greedy_equals_plain_greedy(tiny_target, reference, corpus, method, batch):
    outs = suffix_llm(tiny_target, method, batch, (corpus,)).generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == reference
    accepted = sum(o.metrics["num_accepted"] for o in outs)
    drafted = sum(o.metrics["num_drafted"] for o in outs)
    assert 0 < accepted < drafted  # drafts were accepted and rejected: commit and rollback both ran


def test_corpus_drives_the_drafts(tiny_target, corpus):
    """The first 16 tokens of each response: too early for the request to repeat itself, so the speed-up
    comes from the corpus. Negative control: the same requests without the corpus."""
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    with_corpus = tau(suffix_llm(tiny_target, "suffix", 4, (corpus,)).generate(PROMPTS[:6], params))
    without = tau(suffix_llm(tiny_target, "suffix", 4).generate(PROMPTS[:6], params))
    assert with_corpus > 2.0  # 3.4 when written
    assert not without > 2.0  # 1.0: nothing to draft from


def test_finished_requests_feed_later_ones(tiny_target):
    """In a server, a request like an earlier one is drafted from that one's output. Negative control: the
    same two requests with the cache off."""
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    second = {}
    for cache in (4096, 0):
        llm = suffix_llm(tiny_target, "suffix_tree", 1, cache=cache)
        llm.generate([PROMPTS[0]], params)
        second[cache] = tau(llm.generate([PROMPTS[0]], params))
    assert second[4096] > 2.0  # 4.8 when written
    assert not second[0] > 2.0  # 1.04


@pytest.mark.parametrize("method", ["suffix", "suffix_tree"])
def test_proposals_carry_their_continuation_frequencies(tiny_target, reference, corpus, method):
    """Goodput sets a suffix chain's verify width from its confidences (control/goodput.py), so the chain must
    say they are frequencies; a response the corpus holds twice, identical up to its middle, is drafted with
    confidence 1 there."""
    from specdecode.step.sequence import Sequence

    drafter = suffix_llm(tiny_target, method, 1, (corpus,)).engine.drafter
    seq = Sequence("r", PROMPTS[0] + reference[0][:4], GREEDY, max_len=256)
    drafter.add_sequence(seq)
    proposal = drafter.propose([seq], [4], None)
    assert proposal.confidence_sets_width == (method == "suffix")
    assert proposal.num_tokens.tolist() == [4]
    assert proposal.token_ids[0].tolist() == reference[0][4:8]
    assert proposal.confidence[0].tolist() == [1.0] * 4


def run_many(llm: LLM, num: int) -> list[int]:
    """Cache sizes (tokens) after each finished request, over `num` requests of 8 tokens."""
    drafter = llm.engine.drafter
    sizes = []
    remove = drafter.remove_sequence

    def recording_remove(seq):
        remove(seq)
        sizes.append(sum(len(o) for o in drafter.cache.outputs))

    drafter.remove_sequence = recording_remove
    params = SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True, seed=0)
    llm.generate([[5 + i, 6, 7] for i in range(num)], params)
    return sizes


def test_cache_of_finished_outputs_stays_bounded(tiny_target):
    sizes = run_many(suffix_llm(tiny_target, "suffix", 8, cache=30), 24)
    assert len(sizes) == 24 and max(sizes) <= 30
    assert sizes[-1] > 30 - 8  # it is used up to the bound, evicting whole outputs


def test_missing_eviction_is_detected(tiny_target, monkeypatch):
    """Negative control: with eviction disabled the same run holds every output (192 tokens, 6x the bound)."""
    monkeypatch.setattr(OutputCache, "evict", lambda self: None)
    sizes = run_many(suffix_llm(tiny_target, "suffix", 8, cache=30), 24)
    assert max(sizes) == 192


def test_request_state_is_freed(tiny_target):
    llm = suffix_llm(tiny_target, "suffix_tree", 4, cache=4096)
    drafter = llm.engine.drafter
    assert isinstance(drafter, SuffixDrafter)
    engine = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    seqs = [engine.add_request(f"r{i}", p, params) for i, p in enumerate(PROMPTS[:4])]
    for _ in range(3):
        engine.step()
    assert set(drafter.requests) == {s.request_id for s in seqs}
    engine.abort("r1")
    assert set(drafter.requests) == {"r0", "r2", "r3"}
    while engine.has_work():
        engine.step()
    assert drafter.requests == {}
    assert drafter.cache.num_tokens == sum(len(s.output_ids) for s in seqs)  # the aborted output included


def test_corpus_outside_the_vocabulary_is_refused(tiny_target, tmp_path):
    path = write_corpus(tmp_path / "other_tokenizer.npz", [([1, 2, 3], [4, 5, 500])])
    with pytest.raises(ConfigError, match="other_tokenizer.npz.*outside the target's vocabulary"):
        suffix_llm(tiny_target, "suffix", 1, (str(path),))


def test_missing_corpus_is_refused():
    with pytest.raises(ConfigError, match="suffix corpus /nonexistent/responses.npz: no such file"):
        LLM(method="suffix", suffix_corpus=["/nonexistent/responses.npz"])


@pytest.fixture(scope="module")
def small_target(tmp_path_factory, smollm2_tokenizer):
    """The distribution test's target (8 tokens), and a corpus of 300 of its own sampled responses."""
    path = write_tiny_model(tmp_path_factory.mktemp("t12"), seed=0, vocab_size=VOCAB, embed_scale=8.0)
    smollm2_tokenizer.save_pretrained(path)
    sampled = SamplingParams(temperature=1.0, max_tokens=6, ignore_eos=True, seed=1)
    outs = LLM(target=str(path), method="none", max_num_seqs=300).generate([PROMPT] * 300, sampled)
    corpus = write_corpus(path / "responses.npz", [(PROMPT, o.token_ids) for o in outs])
    return path, str(corpus)


def sampled_tree_llm(small_target) -> LLM:
    target, corpus = small_target
    return LLM(
        target=str(target),
        method="suffix_tree",
        num_speculative_tokens=4,
        controller="fixed",
        max_num_seqs=1024,
        max_num_batched_tokens=8192,
        suffix_corpus=[corpus],
        suffix_spec_factor=4.0,  # trees of up to K nodes from a short match: siblings to reject and accept
        suffix_min_prob=0.02,
    )


def test_sampled_trees_keep_the_target_distribution(small_target):
    llm = sampled_tree_llm(small_target)
    counts, drafted = sampled_joint(llm, PROMPT, 4000)
    ok, stat, crit = fits(counts, exact_joint(llm, PROMPT))
    assert ok, f"chi2 {stat:.1f} >= {crit:.1f}"
    assert drafted >= 4000  # trees were really verified, several nodes per request


def test_noise_shared_across_depths_is_detected(small_target, monkeypatch):
    """Negative control: the target's sample below every depth of a tree drawn from one noise vector (a keying
    bug of the race that decides one-hot drafts). Tokens decided in one step are then correlated."""

    def shared_noise(st, purpose, columns, width):
        return streams.exponentials(st, purpose, range(1), width).expand(-1, len(columns), -1)

    monkeypatch.setattr(verify_tree, "exponentials", shared_noise)
    llm = sampled_tree_llm(small_target)
    ok, stat, crit = fits(sampled_joint(llm, PROMPT, 4000)[0], exact_joint(llm, PROMPT))
    assert not ok, f"chi2 {stat:.1f} < {crit:.1f}"


DISTILL = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "distill"
PART2 = DISTILL / "smollm2_135m_instruct_responses_part2.npz"


@pytest.mark.skipif(not PART2.is_file(), reason="the distillation corpus is not on this machine")
def test_real_target_with_real_corpus(smollm2_dir):
    """SmolLM2 on a prompt of the corpus whose greedy response our fp32 decoding reproduces (the corpus was
    generated in bf16 on a GPU; on the first such record ours parts from it after 24 tokens): lossless, and
    the corpus makes each target forward yield several tokens."""
    with np.load(PART2) as d:
        offsets, prompt_len, response_len, sampled = d["offsets"], d["prompt_len"], d["response_len"], d["sampled"]
        i = int(np.flatnonzero((sampled == 0) & (prompt_len <= 64) & (response_len >= 48))[1])
        prompt = d["tokens"][offsets[i] : offsets[i] + prompt_len[i]].tolist()
    llm = LLM(
        target=str(smollm2_dir),
        method="suffix",
        num_speculative_tokens=8,
        controller="fixed",
        max_num_seqs=1,
        suffix_corpus=[str(PART2)],
    )
    params = SamplingParams(temperature=0.0, max_tokens=32)
    out = llm.generate([prompt], params)[0]
    llm.engine.drafter = NoDrafter()
    assert out.token_ids == llm.generate([prompt], params)[0].token_ids
    assert out.metrics["mean_accepted_tokens"] > 3.0
