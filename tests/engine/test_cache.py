"""After a step with rejections the cache holds exactly the K/V of the kept tokens, as a fresh prefill would."""

from __future__ import annotations

import torch

from specdecode import LLM, SamplingParams
from specdecode.engine.engine import Engine
from specdecode.step.runner import prefill
from specdecode.step.sequence import Sequence, Status

PROMPT = [7, 8, 9, 10, 11, 12]


def step_until_rejection(engine: Engine) -> Sequence:
    seq = engine.add_request("r", PROMPT, SamplingParams(max_tokens=60, ignore_eos=True))
    while engine.has_work():
        engine.step()
        stats = engine.last_step
        if stats and stats.num_accepted[0] < stats.num_proposed[0]:
            return seq
    raise AssertionError("the draft never got rejected; the test would check nothing")


def cache_matches_fresh_prefill(model, cache, slot: int, tokens: list[int]) -> bool:
    """Do the first cache.lengths[slot] positions hold the K/V a fresh prefill of `tokens` gives?"""
    n = cache.lengths[slot]
    if n > len(tokens):
        return False
    fresh = model.new_cache(1, 128)
    with torch.inference_mode():
        prefill(model, fresh, 0, tokens[:n], chunk=512)
    return torch.allclose(cache.k[:, slot, :, :n], fresh.k[:, 0, :, :n], atol=1e-5) and torch.allclose(
        cache.v[:, slot, :, :n], fresh.v[:, 0, :, :n], atol=1e-5
    )


def draft_llm(tiny_target, tiny_draft) -> LLM:
    return LLM(target=str(tiny_target), draft=str(tiny_draft), method="draft", num_speculative_tokens=4)


def test_kept_kv_equals_fresh_prefill(tiny_target, tiny_draft):
    llm = draft_llm(tiny_target, tiny_draft)
    seq = step_until_rejection(llm.engine)
    assert llm.engine.cache.lengths[seq.slot] == len(seq.token_ids) - 1  # all but the pending token
    assert cache_matches_fresh_prefill(llm.target, llm.engine.cache, seq.slot, seq.token_ids)
    drafter = llm.engine.drafter  # the draft's own cache was rolled back to kept tokens too
    d_slot = drafter.slots["r"]
    assert drafter.cache.lengths[d_slot] <= len(seq.token_ids) - 1
    assert cache_matches_fresh_prefill(llm.draft_model, drafter.cache, d_slot, seq.token_ids)


def test_missing_rollback_is_detected(tiny_target, tiny_draft):
    """Negative control: a commit that keeps one rejected position must fail the same check."""
    llm = draft_llm(tiny_target, tiny_draft)
    engine = llm.engine
    original = engine._after_commit

    def no_rollback(seqs, verified):
        original(seqs, verified)
        for s in seqs:
            if s.status is Status.RUNNING:
                engine.cache.set_length(s.slot, s.num_cached + 1)  # keeps the first rejected draft's K/V

    engine._after_commit = no_rollback
    seq = step_until_rejection(engine)
    assert not cache_matches_fresh_prefill(llm.target, engine.cache, seq.slot, seq.token_ids)
