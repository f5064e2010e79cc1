"""No request hurts another: a failure that belongs to one request, at any stage of a step, fails that request
alone (finish reason "error", its message on the output), releases its state, and leaves the other requests of
the same steps with exactly the tokens they have without it.

Faults are injected through the real code for one victim request, mid-stream (after it generated two tokens),
into a mixed batch (greedy and seeded sampled rows) on a chain drafter, a tree drafter and a draft model. Each
case counts the collateral: requests other than the victim that did not get their reference tokens. The negative
controls restore the old behaviour (an error of one row fails the step; NaN logits fail the batch) and the same
count is far from zero.
"""

from __future__ import annotations

import pytest
import torch

import specdecode.engine.engine as engine_module
from specdecode import LLM, SamplingParams
from specdecode.engine.engine import Engine
from specdecode.models.llama import LlamaModel

PROMPTS = [[5, 6, 7, 8, 5, 6], [11, 12, 13], [20, 21, 22, 20, 21], [3, 4]]
PARAMS = [
    SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
    SamplingParams(temperature=1.0, top_k=8, seed=7, max_tokens=12, ignore_eos=True),
    SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
    SamplingParams(temperature=0.8, top_p=0.9, seed=3, max_tokens=12, ignore_eos=True),
]
VICTIM = [9, 9, 9, 10]
VICTIM_PARAMS = SamplingParams(temperature=1.0, seed=11, max_tokens=12, ignore_eos=True)
METHODS = ["ngram", "ngram_tree", "draft"]


def is_victim(seq) -> bool:
    return seq.prompt_ids == VICTIM and seq.metrics.num_generated >= 2


def fault_sampling(mp, llm):
    build = engine_module.sampling_tensors

    def failing(seqs, *args):
        if any(map(is_victim, seqs)):
            raise ValueError("injected fault in sampling")
        return build(seqs, *args)

    mp.setattr(engine_module, "sampling_tensors", failing)


def fault_propose(mp, llm):
    propose = llm.engine.drafter.propose

    def failing(seqs, *args):
        if any(map(is_victim, seqs)):
            raise ValueError("injected fault in propose")
        return propose(seqs, *args)

    mp.setattr(llm.engine.drafter, "propose", failing)


def fault_commit(mp, llm):
    append = Engine._append

    def failing(self, seq, *args):
        if is_victim(seq):
            raise ValueError("injected fault in commit")
        return append(self, seq, *args)

    mp.setattr(Engine, "_append", failing)


def fault_nan_logits(mp, llm):
    """The target's logits are NaN in the victim's rows (its slot), and only there."""
    forward = LlamaModel.forward

    def poisoned(self, tokens, meta, *args, **kwargs):
        out = forward(self, tokens, meta, *args, **kwargs)
        victims = [s.slot for s in llm.engine.running if is_victim(s)]
        if self is llm.target and victims:
            logits = out[0] if isinstance(out, tuple) else out  # [num_seqs, n, vocab]
            rows = torch.isin(meta.slots, torch.tensor(victims))
            logits[rows] = float("nan")
        return out

    mp.setattr(LlamaModel, "forward", poisoned)


def fault_drafter_state(mp, llm):
    add = llm.engine.drafter.add_sequence

    def failing(seq):
        if seq.prompt_ids == VICTIM:
            raise ValueError("injected fault in the drafter's state")
        return add(seq)

    mp.setattr(llm.engine.drafter, "add_sequence", failing)


FAULTS = {
    "sampling": fault_sampling,
    "propose": fault_propose,
    "commit": fault_commit,
    "nan_logits": fault_nan_logits,
    "drafter_state": fault_drafter_state,
}


def make(method: str, tiny_target, tiny_draft) -> LLM:
    return LLM(
        target=str(tiny_target),
        draft=str(tiny_draft),
        method=method,
        controller="fixed",
        num_speculative_tokens=3,
        max_num_seqs=5,
    )


@pytest.fixture(scope="module")
def references(tiny_target, tiny_draft) -> dict[str, list[list[int]]]:
    return {m: [o.token_ids for o in make(m, tiny_target, tiny_draft).generate(PROMPTS, PARAMS)] for m in METHODS}


def collateral(llm: LLM, reference: list[list[int]]) -> tuple[int, object]:
    """(requests other than the victim without their reference tokens, the victim's output or the exception)."""
    try:
        outs = llm.generate([*PROMPTS[:2], VICTIM, *PROMPTS[2:]], [*PARAMS[:2], VICTIM_PARAMS, *PARAMS[2:]])
    except Exception as e:  # noqa: BLE001 - the whole call failed: every other request is collateral
        return len(PROMPTS), e
    others = outs[:2] + outs[3:]
    return sum(o.token_ids != r or o.error is not None for o, r in zip(others, reference, strict=True)), outs[2]


def released(llm: LLM) -> bool:
    engine = llm.engine
    return not engine.has_work() and engine.cache.num_free == engine.config.max_num_seqs


@pytest.mark.parametrize("stage", list(FAULTS))
@pytest.mark.parametrize("method", METHODS)
def test_a_request_that_fails_fails_alone(method, stage, tiny_target, tiny_draft, references, monkeypatch):
    llm = make(method, tiny_target, tiny_draft)
    FAULTS[stage](monkeypatch, llm)
    hurt, victim = collateral(llm, references[method])
    assert hurt == 0, f"{hurt} other requests hurt: {victim}"
    assert victim.finish_reason == "error" and victim.error
    assert ("injected" in victim.error) or (stage == "nan_logits" and "not finite" in victim.error)
    assert released(llm)
    monkeypatch.undo()
    assert [o.token_ids for o in llm.generate(PROMPTS, PARAMS)] == references[method]  # and it serves on


def test_control_a_row_error_failing_the_step_hurts_everyone(tiny_target, tiny_draft, references, monkeypatch):
    """Fault: the old path, where a row's error leaves the step (and the caller fails the batch)."""

    def not_isolated(self, seqs, stage):
        return seqs, stage(seqs)

    def raising(self, seq, error):
        raise error if isinstance(error, BaseException) else RuntimeError(error)

    monkeypatch.setattr(Engine, "_isolated", not_isolated)
    monkeypatch.setattr(Engine, "_fail", raising)
    for stage in ("sampling", "propose", "commit"):
        with monkeypatch.context() as mp:
            llm = make("draft", tiny_target, tiny_draft)
            FAULTS[stage](mp, llm)
            assert collateral(llm, references["draft"])[0] == len(PROMPTS), stage


def test_control_nan_logits_without_quarantine_hurt_everyone(tiny_target, tiny_draft, references, monkeypatch):
    monkeypatch.setattr(engine_module, "quarantine", lambda logits: (logits, torch.zeros(logits.shape[0], dtype=bool)))
    llm = make("ngram", tiny_target, tiny_draft)
    fault_nan_logits(monkeypatch, llm)
    assert collateral(llm, references["ngram"])[0] == len(PROMPTS)
