"""Per-request state is released when a request leaves the batch: controllers, drafter and engine hold only live
requests, however the request ended (length, EOS, abort mid-flight).

Once the engine forgot a finished request before the step's `observe`, which re-created its state: after 40
requests every controller held 40 entries.
"""

from __future__ import annotations

import pytest

from specdecode import LLM, SamplingParams
from specdecode.config import CONTROLLER_NAMES

PROMPT = [5, 6, 7, 5, 6, 7, 5]  # repetitive: n-gram finds drafts, so every controller records outcomes


def live_state(llm: LLM) -> dict[str, set[str]]:
    engine = llm.engine
    return {
        "controller": engine.controller.live_request_ids(),
        "drafter": engine.drafter.live_request_ids(),
        "detokenizers": set(engine._detok),
    }


@pytest.mark.parametrize("controller", CONTROLLER_NAMES)
def test_finished_requests_leave_no_state(tiny_target, controller):
    llm = LLM(target=str(tiny_target), method="ngram", controller=controller, max_num_seqs=4)
    outs = llm.generate([PROMPT] * 40, SamplingParams(max_tokens=4, ignore_eos=True))
    assert sum(o.metrics["num_drafted"] for o in outs) > 0  # the controllers did observe drafting rows
    assert live_state(llm) == {"controller": set(), "drafter": set(), "detokenizers": set()}


@pytest.mark.parametrize("controller", CONTROLLER_NAMES)
def test_aborted_requests_leave_no_state(tiny_target, tiny_draft, controller):
    llm = LLM(target=str(tiny_target), draft=str(tiny_draft), method="draft", controller=controller, max_num_seqs=2)
    engine = llm.engine
    params = SamplingParams(max_tokens=50, ignore_eos=True)
    for i in range(4):  # two decode, two wait
        engine.add_request(f"r{i}", PROMPT, params)
    for _ in range(3):
        engine.step()
    for i in range(4):
        engine.abort(f"r{i}")
    assert not engine.has_work()
    assert live_state(llm) == {"controller": set(), "drafter": set(), "detokenizers": set()}
    assert engine.cache.num_free == engine.cache.num_slots
