"""The fast arithmetic (int8 activations, models/quant_int8.py) as a named setting: `LLM(arithmetic="fast")` puts
it on the target's compiled step and on the draft model, and speculation stays exact with respect to it: every
drafter's greedy tokens equal fast K = 0's, and the compiled step calls the int8 kernel."""

from __future__ import annotations

import pytest
import torch

from specdecode import LLM, SamplingParams
from specdecode.huge_pages import MIN_BYTES
from specdecode.models import kv_dtype, quant_int8
from specdecode.step.runner import prefill
from tests.test_huge_pages import advised

TARGET = "smollm2-135m-instruct"
CHATS = [
    [{"role": "user", "content": "Write a Python function that reverses a string, then explain it."}],
    [{"role": "user", "content": "List three uses of a hash map."}],
]
GREEDY = SamplingParams(temperature=0.0, max_tokens=32)


@pytest.fixture(scope="module")
def fast_plain() -> tuple[LLM, list[list[int]]]:
    # The fixed controller: K = 0 reads no cost model, and the default one would first probe this compiled int8
    # step's times, a fingerprint no other test's model has (on a fresh cache, every CI run).
    llm = LLM(target=TARGET, method="none", controller="fixed", max_num_seqs=2, arithmetic="fast", enforce_eager=False)
    return llm, [o.token_ids for o in llm.chat(CHATS, GREEDY)]


def _int8_linears(model: torch.nn.Module) -> int:
    return sum(isinstance(m, quant_int8.Int8QuantLinear) for m in model.modules())


def test_the_setting_reaches_the_compiled_step(fast_plain):
    llm, _ = fast_plain
    assert llm.engine_config.arithmetic == "fast" and llm.target.step.compiled
    assert _int8_linears(llm.target) > 0
    # and its KV cache is bf16 (models/kv_dtype.py) where the bf16 attention kernel serves
    assert llm.engine.cache.k.dtype == (torch.bfloat16 if kv_dtype.bf16_serves(llm.target) else torch.float32)


def test_the_compiled_steps_weights_and_cache_are_on_advised_pages(fast_plain):
    """The quantized loader moves the weights to huge pages before the compiled step takes their addresses, and the
    engine's KV cache is allocated there (specdecode/huge_pages.py; tests/test_huge_pages.py checks the mover)."""
    llm, _ = fast_plain
    large = [t for t in [*llm.target.parameters(), *llm.target.buffers()] if t.numel() * t.element_size() >= MIN_BYTES]
    assert len(large) >= 10 and all(advised(t) for t in large)
    assert advised(llm.engine.cache.k) and advised(llm.engine.cache.v)


@pytest.mark.parametrize("method,k", [("ngram", 4), ("suffix", 6), ("draft", 2)])
def test_greedy_speculation_equals_fast_plain_decoding(fast_plain, method, k):
    llm, want = fast_plain
    spec = LLM(
        target=TARGET,
        method=method,
        num_speculative_tokens=k,
        controller="fixed",
        max_num_seqs=2,
        arithmetic="fast",
        enforce_eager=False,
        share_target=llm,
    )
    outs = spec.chat(CHATS, GREEDY)
    assert [o.token_ids for o in outs] == want
    assert sum(o.metrics["num_drafted"] for o in outs) > 0


def _logits(model, ids: list[int]) -> torch.Tensor:
    cache = model.new_cache(1, 256)
    with torch.inference_mode():
        return prefill(model, cache, 0, ids, 16)  # [1, 1, vocab] after the prompt, in chunks of 16 tokens


def test_the_compiled_step_runs_the_int8_kernel(fast_plain):
    """A fault injected into the int8 kernel (one sub-block scale misread) changes the compiled step's logits, and
    clearing it gives the same bits back: the package calls that op. (Compiled and eager fast logits are not
    bitwise equal: their attention kernels sum in other orders, and the int8 rounding of the next layer's
    activations magnifies the difference.)"""
    llm, _ = fast_plain
    text = llm.tokenizer.apply_chat_template(CHATS[0], add_generation_prompt=True, tokenize=False)
    ids = llm.tokenizer.encode(text, add_special_tokens=False)
    before = _logits(llm.target, ids)
    quant_int8.set_fault(quant_int8.FAULT_SCALE)
    try:
        faulty = _logits(llm.target, ids)
    finally:
        quant_int8.set_fault(quant_int8.FAULT_NONE)
    assert not torch.equal(before, faulty)
    assert torch.equal(before, _logits(llm.target, ids))


def test_a_bad_arithmetic_is_one_clear_error():
    from specdecode.config import ConfigError

    with pytest.raises(ConfigError, match="arithmetic='int4'"):
        LLM(target=TARGET, method="none", arithmetic="int4")
