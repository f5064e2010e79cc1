"""The offline LLM keeps working after a call that raised: nothing of the failed call stays queued or running
(a request that raises every time it is stepped would otherwise fail every later call on the same object), and
the requests after it get exactly the tokens a fresh LLM gives them."""

from __future__ import annotations

import pytest

from specdecode import LLM, SamplingParams
from specdecode.engine.engine import Engine
from specdecode.models.llama import LlamaModel

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
PROMPTS = [[5, 6, 7, 8, 5, 6], [11, 12, 13], [20, 21, 22, 20, 21], [3, 4]]


@pytest.fixture(scope="module")
def reference(tiny_target) -> list[list[int]]:
    llm = LLM(target=str(tiny_target), method="none", max_num_seqs=2)
    return [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]


POISON = [9, 9, 9]  # a request in whose presence the shared forward raises, every time it is tried


def poison_forwards(monkeypatch, llm: LLM) -> None:
    """Fault: the target's forward raises whenever the POISON request's slot is in its batch (a failure of the
    shared forward, which the engine cannot pin on one request: the whole call fails)."""
    forward = LlamaModel.forward

    def failing(self, tokens, meta, *args, **kwargs):
        slots = meta.slots.tolist()
        if self is llm.target and any(s.prompt_ids == POISON and s.slot in slots for s in llm.engine.running):
            raise RuntimeError("injected fault")
        return forward(self, tokens, meta, *args, **kwargs)

    monkeypatch.setattr(LlamaModel, "forward", failing)


def recovers(llm: LLM, reference: list[list[int]]) -> bool:
    """Ten requests after the failure, each correct, and an engine with nothing left over."""
    for i in range(10):
        try:
            if llm.generate([PROMPTS[i % len(PROMPTS)]], GREEDY)[0].token_ids != reference[i % len(PROMPTS)]:
                return False
        except RuntimeError:
            return False
    engine = llm.engine
    return not engine.has_work() and engine.cache.num_free == engine.config.max_num_seqs


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_llm_recovers_after_a_call_that_raised(tiny_target, tiny_draft, reference, monkeypatch, method):
    llm = LLM(target=str(tiny_target), draft=str(tiny_draft), method=method, max_num_seqs=2)  # 4 prompts, 2 slots
    poison_forwards(monkeypatch, llm)
    with pytest.raises(RuntimeError, match="injected fault"):
        llm.generate([*PROMPTS[:2], POISON, *PROMPTS[2:]], GREEDY)
    assert recovers(llm, reference)


def test_a_refused_prompt_leaves_nothing_queued(tiny_target, reference):
    llm = LLM(target=str(tiny_target), method="ngram", max_num_seqs=2)
    with pytest.raises(ValueError, match="empty prompt"):
        llm.generate([*PROMPTS, []], GREEDY)  # the first four were queued before the fifth was refused
    assert recovers(llm, reference)


def test_control_without_the_clean_up_later_calls_go_wrong(tiny_target, reference, monkeypatch):
    """Fault: the failed call's requests are not aborted (as before): later calls inherit its sequences."""
    llm = LLM(target=str(tiny_target), method="ngram", max_num_seqs=2)
    monkeypatch.setattr(Engine, "abort", lambda self, request_id: None)
    poison_forwards(monkeypatch, llm)
    with pytest.raises(RuntimeError, match="injected fault"):
        llm.generate([*PROMPTS[:2], POISON, *PROMPTS[2:]], GREEDY)
    assert not recovers(llm, reference)
