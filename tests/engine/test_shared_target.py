"""LLMs sharing one loaded target (a benchmark's arms): each keeps its own engine and cache, the outputs stay
exact, and a target is only shared between LLMs that would have loaded the same one."""

from __future__ import annotations

import pytest

from specdecode import LLM
from specdecode.config import ConfigError
from tests.engine.test_greedy import GREEDY, PROMPTS


def test_arms_on_one_target_decode_exactly(tiny_target):
    base = LLM(target=str(tiny_target), method="none", max_num_seqs=1)
    reference = [base.generate([p], GREEDY)[0].token_ids for p in PROMPTS]
    arms = [
        LLM(target=str(tiny_target), method=m, num_speculative_tokens=4, max_num_seqs=1, share_target=base)
        for m in ("ngram", "suffix_tree")
    ]
    assert all(arm.target is base.target for arm in arms)  # the weights are held once
    for p, ref in zip(PROMPTS, reference, strict=True):  # interleaved per prompt, as the bench runs its arms
        for llm in (base, *arms):
            assert llm.generate([p], GREEDY)[0].token_ids == ref
    assert LLM(target=str(tiny_target), method="ngram", max_num_seqs=1).target is not base.target


@pytest.mark.parametrize("change", [{"dtype": "bfloat16"}, {"enforce_eager": True}, {"target": "other"}])
def test_a_different_target_is_not_shared(tiny_target, change):
    base = LLM(target=str(tiny_target), method="none", max_num_seqs=1, enforce_eager=False)
    kwargs = {"target": str(tiny_target), "method": "ngram", "enforce_eager": False, **change}
    if kwargs["target"] == "other":
        kwargs["target"] = str(tiny_target) + "/"  # the same files by another name: still refused
    with pytest.raises(ConfigError, match=f"whose {next(iter(change))} differs"):
        LLM(share_target=base, **kwargs)
