"""n samples of one prompt: one prefill, shared by copying sample 0's prompt K/V, and each sample exactly what a
single request with seed + i gives. The negative control copies one position too few and is caught."""

from __future__ import annotations

from dataclasses import replace

import pytest

from specdecode import LLM, SamplingParams
from specdecode.config import ConfigError
from specdecode.kv import KVCache

PROMPT = [20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 20, 21, 22, 23, 24, 25, 40, 41, 20, 21, 22]
SAMPLED = SamplingParams(temperature=0.9, top_p=0.95, max_tokens=20, seed=11, ignore_eos=True, n=4)


def make(tiny_target, tiny_draft, method: str = "ngram", batch: int = 4) -> LLM:
    draft = str(tiny_draft) if method == "draft" else None
    return LLM(target=str(tiny_target), draft=draft, method=method, num_speculative_tokens=3, max_num_seqs=batch)


def singles(llm: LLM, params: SamplingParams) -> list[list[int]]:
    one = replace(params, n=1)
    return [llm.generate([PROMPT], replace(one, seed=one.seed + i))[0].token_ids for i in range(params.n)]


# One-hot drafters: their tokens are the target's own samples (the race), so a seeded sample's tokens do not
# depend on the batch. Sampled drafts (the draft model) reproduce only under the same K schedule (streams.py).
@pytest.mark.parametrize("method", ["ngram", "ngram_tree", "suffix_tree"])
def test_each_sample_equals_a_single_request_with_its_seed(method, tiny_target, tiny_draft):
    llm = make(tiny_target, tiny_draft, method)
    out = llm.generate([PROMPT], SAMPLED)[0]
    samples = [o.token_ids for o in out.outputs]
    assert [o.index for o in out.outputs] == [0, 1, 2, 3]
    assert len(set(map(tuple, samples))) > 1  # different seeds, different samples
    assert samples == singles(llm, SAMPLED)
    assert out.token_ids == samples[0]


def test_n_samples_cost_one_prefill(tiny_target, tiny_draft):
    llm = make(tiny_target, tiny_draft)
    llm.generate([PROMPT], SAMPLED)
    cached = len(PROMPT) - 1  # the last prompt token is fed with the first drafts
    assert llm.engine.num_prefill_tokens == cached
    assert llm.engine.num_shared_prefill_tokens == 3 * cached


def test_samples_wait_for_a_slot_and_still_share(tiny_target, tiny_draft):
    """Two slots for four samples: the later ones are admitted as slots free up, copying while sample 0 lives,
    prefilling on their own once it has gone; the output is the same either way."""
    llm = make(tiny_target, tiny_draft, batch=2)
    out = llm.generate([PROMPT], SAMPLED)[0]
    assert [o.token_ids for o in out.outputs] == singles(make(tiny_target, tiny_draft), SAMPLED)


def prompt_kv_error(llm: LLM) -> float:
    """Largest difference between each later sample's prompt K/V and sample 0's, once all are decoding."""
    seqs = llm.engine.add_samples("r", PROMPT, SAMPLED)
    while any(s.metrics.num_generated == 0 for s in seqs):
        llm.engine.step()
    n = len(PROMPT) - 1
    cache = llm.engine.cache
    err = max(
        float((cache.k[:, s.slot, :, :n] - cache.k[:, seqs[0].slot, :, :n]).abs().max())
        + float((cache.v[:, s.slot, :, :n] - cache.v[:, seqs[0].slot, :, :n]).abs().max())
        for s in seqs[1:]
    )
    llm.engine.abort("r")
    return err


def test_samples_decode_from_sample_0s_prompt_cache(tiny_target, tiny_draft):
    assert prompt_kv_error(make(tiny_target, tiny_draft)) == 0.0


def test_a_wrong_copy_is_caught(tiny_target, tiny_draft, monkeypatch):
    """Fault: only the first half of the shared prefix is copied (the rest of the K/V stays zero)."""
    real = KVCache.copy_prefix
    monkeypatch.setattr(KVCache, "copy_prefix", lambda self, src, dst, n: real(self, src, dst, n // 2))
    assert prompt_kv_error(make(tiny_target, tiny_draft)) > 0.1  # intact: exactly 0


def test_greedy_samples_are_identical(tiny_target, tiny_draft):
    out = make(tiny_target, tiny_draft).generate([PROMPT], replace(SAMPLED, temperature=0.0))[0]
    assert all(o.token_ids == out.outputs[0].token_ids for o in out.outputs[1:])


def test_abort_ends_every_sample_and_frees_them(tiny_target, tiny_draft):
    llm = make(tiny_target, tiny_draft)
    seqs = llm.engine.add_samples("r", PROMPT, SAMPLED)
    llm.engine.step()
    llm.engine.step()
    llm.engine.abort("r")
    assert all(s.finish_reason == "abort" and s.slot == -1 for s in seqs)
    assert not llm.engine.has_work() and llm.engine.cache.num_free == 4


def test_too_many_samples_is_a_clear_error(tiny_target, tiny_draft):
    with pytest.raises(ConfigError, match="n must be in 1..16"):
        replace(SAMPLED, n=17)
    llm = make(tiny_target, tiny_draft, batch=2)
    with pytest.raises(ConfigError, match="use add_samples"):
        llm.engine.add_request("x", PROMPT, SAMPLED)
