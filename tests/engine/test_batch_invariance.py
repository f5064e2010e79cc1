"""A request's greedy tokens and log-probabilities do not depend on the server's load: bit for bit the same alone,
batched with other prompts of other lengths, and with its prompt cut into chunks by a small token budget, on the
real SmolLM2 (its Q4_1 file, weights kept quantized, as `LLM("smollm2-135m-instruct")` loads it) in both
arithmetics, with and without speculation, and from its dense fp32 checkpoint, on the eager step the suite runs
(tests/conftest.py; the compiled step's linears are the same kernels).

What made them depend on it was a prompt chunk's attention through SDPA, whose keys were padded to the chunk's
longest row and its last token: the reduction over them changed with that padding (under `fast` the int8 rounding
of the next layer's activations turned such a last-bit difference into another token, 3 of 8 dev code prompts
here). A chunk now takes the few-queries kernel in pieces (models/attention.py, `_attend_in_pieces`), as decode
and verify steps do. The negative control sends chunks to SDPA again, through the real engine, and the same
comparison fails.

Dense fp32 weights depended on it through their GEMM: oneDNN's and MKL's sum a row differently as the number of
rows changes; they now take the few-rows GEMM (models/fp32_linears.py). Its control gives them oneDNN or MKL again.
"""

from __future__ import annotations

import pytest

from specdecode.bench.code_prompts import load_prompts
from specdecode.config import SamplingParams
from specdecode.llm import LLM
from specdecode.models import attention, few_rows

TARGET = "smollm2-135m-instruct"
PROMPTS = 6  # the code set's dev prompts, 100-150 tokens each through the chat template
PARAMS = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, logprobs=1)
BUDGETS = (32, 512)  # a prompt prefilled in chunks of <= 32 tokens shared by the batch, or whole beside the others

pytestmark = pytest.mark.skipif(not few_rows.supported(), reason="no AVX-512 or no C++ compiler: SDPA everywhere")


def _answers(llm: LLM, texts: list[str], batched: bool) -> list[tuple[list[int], str]]:
    """Each prompt's tokens and log-probabilities (as text: compared bit for bit), batched or one at a time."""
    outs = llm.generate(texts, PARAMS) if batched else [llm.generate([t], PARAMS)[0] for t in texts]
    return [(list(o.outputs[0].token_ids), repr(o.outputs[0].logprobs)) for o in outs]


def _differences(arithmetic: str, method: str, target: str = TARGET) -> list[str]:
    """Where a batched run under each budget differs from every prompt alone: '<budget>: prompt <i>' per prompt."""
    kwargs = dict(target=target, arithmetic=arithmetic, method=method, max_num_seqs=PROMPTS)
    if method != "none":
        kwargs["num_speculative_tokens"] = 3
    alone_llm = LLM(max_num_batched_tokens=2048, **kwargs)
    prompts = load_prompts("code", "dev")[:PROMPTS]
    texts = [alone_llm.apply_chat_template([{"role": "user", "content": p.text}]) for p in prompts]
    alone = _answers(alone_llm, texts, batched=False)
    found = []
    for budget in BUDGETS:
        llm = LLM(max_num_batched_tokens=budget, share_target=alone_llm, **kwargs)
        batched = _answers(llm, texts, batched=True)
        found += [f"{budget}: prompt {i}" for i, (a, b) in enumerate(zip(alone, batched, strict=True)) if a != b]
        llm.close()
    alone_llm.close()
    return found


@pytest.mark.parametrize(("arithmetic", "method"), [("exact", "none"), ("fast", "none"), ("fast", "ngram")])
def test_a_requests_tokens_are_the_same_alone_batched_and_chunked(arithmetic, method):
    assert _differences(arithmetic, method) == []


def test_control_prompt_chunks_through_sdpa_depend_on_the_batch(monkeypatch):
    monkeypatch.setattr(attention, "PREFILL_IN_PIECES", False)
    assert len(_differences("fast", "none")) >= 2


@pytest.mark.parametrize("method", ["none", "ngram"])
def test_dense_fp32_weights_give_the_same_tokens_alone_and_batched(smollm2_dir, method):
    target = str(smollm2_dir)  # the dense checkpoint: every linear fp32
    assert _differences("exact", method, target) == []


def test_control_dense_weights_on_onednn_or_mkl_depend_on_the_batch(monkeypatch, smollm2_dir):
    monkeypatch.setattr(few_rows, "install", lambda model: 0)  # every linear keeps this machine's packing
    assert len(_differences("exact", "none", str(smollm2_dir))) >= 8  # 12 of 12 here
