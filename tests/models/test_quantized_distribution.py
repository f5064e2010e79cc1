"""Speculative sampling stays lossless on the quantized compiled step, the default path of a GGUF model on the CPU:
SmolLM2's Q4_1 file with its blocks kept (models/gguf_quantized.py), the AOTInductor step and the n-gram chain, in
the exact arithmetic and in the fast one (int8 activations, a bf16 KV cache: models/quant_int8.py, kv_dtype.py).

The joint of the first two sampled tokens must be the target's own processed distribution (tests/stats
reference_probs over the same model's logits, top_k = 6 so the joint has at most 36 cells). The negative
control halves the compiled head's logits (the argmax kept: greedy tests are blind to it, the distribution
flattens as at temperature 2) and the same assertion fails.
"""

from __future__ import annotations

import dataclasses
from dataclasses import replace

import pytest
import torch

from specdecode import LLM, SamplingParams
from specdecode.models.quant_int8 import Int8QuantLinear
from specdecode.models.quant_rows import QuantLinear
from specdecode.step.runner import prefill
from tests.stats import assert_follows, reference_probs

SMOLLM2 = "smollm2-135m-instruct"
N = 200  # SmolLM2 at 200 x ~14 rows: ~12 s a test on two cores; the control fails at chi-square = inf (400: the same)
# "3 7" recurs with three continuations, so the n-gram chain drafts at the first step.
REPEATING = [3, 7, 1, 3, 7, 2, 3, 7, 4, 3, 7]
PARAMS = SamplingParams(temperature=1.0, top_k=6, top_p=0.95, max_tokens=3, ignore_eos=True)
GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module", params=["exact", "fast"])
def quantized_llm(request) -> LLM:
    llm = LLM(
        target=SMOLLM2,
        arithmetic=request.param,
        method="ngram",
        num_speculative_tokens=4,
        controller="fixed",
        max_num_seqs=N,
        max_model_len=32,
        max_num_batched_tokens=4096,
        enforce_eager=False,
    )
    assert isinstance(llm.target.lm_head, QuantLinear if request.param == "exact" else Int8QuantLinear)
    assert llm.target.step.compiled
    return llm


def exact_joint(llm: LLM, prompt: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(support [s] of the first token, [s, vocab] P(x1, x2 | prompt)) under the target's processed distribution."""
    model = llm.target
    cache = model.new_cache(1, 32)
    with torch.inference_mode():
        p1 = reference_probs(prefill(model, cache, 0, prompt, 64)[0, 0], PARAMS)  # [vocab]
        support = p1.nonzero().flatten()  # [s] at most top_k tokens
        rows = []
        for x1 in support.tolist():
            cache.set_length(0, len(prompt))
            rows.append(reference_probs(prefill(model, cache, 0, [x1], 64)[0, 0], PARAMS))
    return support, p1[support, None] * torch.stack(rows)  # [s], [s, vocab]


def sampled_joint(llm: LLM, prompt: list[int], support: torch.Tensor) -> tuple[torch.Tensor, int]:
    """[s + 1, vocab] counts of (x1, x2) over N requests (every other one seeded; row s: an x1 outside the
    support, impossible under the target), and the drafts verified."""
    params = [replace(PARAMS, seed=i if i % 2 else None) for i in range(N)]
    outs = llm.generate([prompt] * N, params)
    index = {t: i for i, t in enumerate(support.tolist())}
    counts = torch.zeros(len(support) + 1, llm.target.cfg.vocab_size)
    for o in outs:
        counts[index.get(o.token_ids[0], len(support)), o.token_ids[1]] += 1
    return counts, sum(o.metrics["num_drafted"] for o in outs)


def halve_compiled_logits(llm: LLM) -> None:
    """Fault: the compiled head returns logits / 2 (the argmax kept, the distribution that of temperature 2)."""
    step = llm.target.step
    head = step.head
    llm.target.step = dataclasses.replace(step, head=lambda hidden: head(hidden) / 2)


@pytest.mark.parametrize("faulty", [False, True], ids=["intact", "fault"])
def test_quantized_first_two_tokens_follow_target(quantized_llm, faulty, monkeypatch):
    support, joint = exact_joint(quantized_llm, REPEATING)  # before any fault: the intact target's
    if faulty:
        before = [o.token_ids for o in quantized_llm.generate([REPEATING], GREEDY)]
        monkeypatch.setattr(quantized_llm.target, "step", quantized_llm.target.step)  # restored after the test
        halve_compiled_logits(quantized_llm)
        assert [o.token_ids for o in quantized_llm.generate([REPEATING], GREEDY)] == before  # greedy is blind
    counts, drafted = sampled_joint(quantized_llm, REPEATING, support)
    probs = torch.cat([joint, torch.zeros(1, joint.shape[1])])  # an x1 outside the support has probability 0
    assert_follows(counts, probs, "halve_compiled_logits" if faulty else None)
    assert drafted >= N  # speculation really ran
