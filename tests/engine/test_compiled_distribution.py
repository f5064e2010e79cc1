"""The compiled step keeps speculative sampling lossless: the suite runs eagerly (tests/conftest.py), so this is
the one distribution test on the production CPU path, the AOTInductor step with the few-rows GEMM and the
few-queries attention op where the machine builds them (models/compiled.py, models/few_rows.py).

The joint of the first two tokens of the n-gram chain, served by the compiled target, must be the eager
target's, processed by the spec's reference (tests/stats.reference_probs). The negative control halves the
compiled head's logits: greedy output does not move (the argmax is kept), so the compiled step's greedy-equality
tests cannot see it, but the distribution flattens as at temperature 2 and the same assertion fails.
"""

from __future__ import annotations

import dataclasses

import pytest

from specdecode import LLM, SamplingParams
from specdecode.models import few_rows
from specdecode.models.llama import StepFunctions
from tests.engine.test_distribution import REPEATING, exact_joint, make, models, sampled_joint  # noqa: F401
from tests.stats import assert_follows

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def compiled_llm(models) -> LLM:  # noqa: F811
    compiled = LLM(  # make(models, "ngram")'s settings, with the compiled step
        target=models["target"],
        method="ngram",
        num_speculative_tokens=4,
        controller="fixed",
        max_num_seqs=1024,
        max_model_len=32,
        max_num_batched_tokens=16384,
        enforce_eager=False,
    )
    assert compiled.target.step.compiled
    if few_rows.supported():  # the production step on this CPU: the kernels, or their build error
        few_rows.require()
        assert any(isinstance(m, few_rows.FewRowsLinear) for m in compiled.target.modules())
    return compiled


def halve_compiled_logits(llm: LLM) -> None:
    """Fault: the compiled head returns logits / 2 (the argmax kept, the distribution that of temperature 2), and
    so does the eager twin that serves forwards of more than max_rows tokens where the few-rows GEMM does not (a CPU
    without AVX-512: the wide batches of this test go there, and with the compiled head alone faulted the control
    passed, chi2 0.38x its critical value, 2026-12-07)."""

    def halved(step: StepFunctions) -> StepFunctions:
        return dataclasses.replace(step, head=lambda hidden, head=step.head: head(hidden) / 2)

    step = halved(llm.target.step)
    llm.target.step = step if step.large is None else dataclasses.replace(step, large=halved(step.large))


@pytest.mark.parametrize("faulty", [False, True], ids=["intact", "fault"])
def test_compiled_first_two_tokens_follow_target(models, compiled_llm, faulty, monkeypatch):  # noqa: F811
    eager = make(models, "ngram")
    if faulty:
        before = [o.token_ids for o in compiled_llm.generate([REPEATING], GREEDY)]
        monkeypatch.setattr(compiled_llm.target, "step", compiled_llm.target.step)  # restored after the test
        halve_compiled_logits(compiled_llm)
        assert [o.token_ids for o in compiled_llm.generate([REPEATING], GREEDY)] == before  # greedy is blind to it
    counts, drafted = sampled_joint(compiled_llm, REPEATING)
    assert_follows(counts, exact_joint(eager, REPEATING), "halve_compiled_logits" if faulty else None)
    assert drafted >= counts.sum()  # speculation really ran
