"""The fast arithmetic (int8 activations, models/quant_int8.py) as a named setting: `LLM(arithmetic="fast")` puts
it on the target's compiled step and on the draft model, and speculation stays exact with respect to it: every
drafter's greedy tokens equal fast K = 0's. The tokens must also differ somewhere from the exact arithmetic's
over these prompts' logits (else the setting would not have reached the step), and the compiled fast step must
give what the eager fast model gives, bit for bit."""

from __future__ import annotations

import pytest
import torch

from specdecode import LLM, SamplingParams
from specdecode.models import quant_int8
from specdecode.models.gguf_quantized import gguf_file, load_gguf_quantized
from specdecode.step.runner import prefill

TARGET = "smollm2-135m-instruct"
CHATS = [
    [{"role": "user", "content": "Write a Python function that reverses a string, then explain it."}],
    [{"role": "user", "content": "List three uses of a hash map."}],
]
GREEDY = SamplingParams(temperature=0.0, max_tokens=32)


@pytest.fixture(scope="module")
def fast_plain() -> tuple[LLM, list[list[int]]]:
    llm = LLM(target=TARGET, method="none", max_num_seqs=2, arithmetic="fast", enforce_eager=False)
    return llm, [o.token_ids for o in llm.chat(CHATS, GREEDY)]


def _int8_linears(model: torch.nn.Module) -> int:
    return sum(isinstance(m, quant_int8.Int8QuantLinear) for m in model.modules())


def test_the_setting_reaches_the_compiled_step(fast_plain):
    llm, _ = fast_plain
    assert llm.engine_config.arithmetic == "fast" and llm.target.step.compiled
    assert _int8_linears(llm.target) > 0


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
    assert sum(o.metrics.num_drafted for o in outs) > 0


def _logits(model, ids: list[int]) -> torch.Tensor:
    cache = model.new_cache(1, 256)
    with torch.inference_mode():
        return prefill(model, cache, 0, ids, 16)  # [1, 1, vocab] after the prompt, in chunks of 16 tokens


def test_compiled_fast_equals_eager_fast_and_differs_from_exact(fast_plain):
    """The control inside: the exact model's logits on the same tokens must not be bitwise the fast ones."""
    llm, _ = fast_plain
    ids = llm.tokenizer.apply_chat_template(CHATS[0], add_generation_prompt=True)
    eager_fast = quant_int8.apply_arithmetic(load_gguf_quantized(gguf_file(TARGET)), "fast")
    exact = load_gguf_quantized(gguf_file(TARGET))
    compiled = _logits(llm.target, ids)
    assert torch.equal(compiled, _logits(eager_fast, ids))
    assert not torch.equal(compiled, _logits(exact, ids))


def test_a_bad_arithmetic_is_one_clear_error():
    from specdecode.config import ConfigError

    with pytest.raises(ConfigError, match="arithmetic='int4'"):
        LLM(target=TARGET, method="none", arithmetic="int4")
