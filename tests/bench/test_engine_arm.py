"""Our bench arm reports its decoding part as llama.cpp's tools report theirs: the first token comes from the
prompt's forward, so decoding is the other tokens over the time after it."""

from __future__ import annotations

import pytest

from specdecode.bench.specbench import ArmResult, EngineArm
from specdecode.config import SamplingParams
from specdecode.llm import LLM

TEXT = "0123456789" * 8  # digits: token ids the tiny model's 96-token vocabulary has


@pytest.fixture
def tiny_llm(tiny_target) -> LLM:
    return LLM(target=str(tiny_target), method="none", max_num_seqs=1, enforce_eager=True)


def test_metrics_time_to_first_token_is_the_prompts_share(tiny_llm):
    m = tiny_llm.generate([TEXT], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))[0].metrics
    assert 0 < m["time_to_first_token_s"] < m["elapsed_s"]


def test_engine_arm_splits_prompt_and_decoding(tiny_llm):
    sample = EngineArm("ours K=0", tiny_llm).run(TEXT, max_tokens=12)
    assert sample.decode_tokens == sample.tokens - 1 > 0
    assert 0 < sample.decode_seconds < sample.seconds
    row = ArmResult.summarise([sample])
    assert row["decode_tokens_per_s"] == pytest.approx(sample.decode_tokens / sample.decode_seconds)
