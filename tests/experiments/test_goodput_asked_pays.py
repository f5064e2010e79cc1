"""experiments.goodput_asked_pays's ledger files each decode step by what its rows drafted and prices it against a
plain step of as many rows."""

from __future__ import annotations

import pytest

from experiments.goodput_asked_pays import KINDS, ledger

PLAIN = {1: 0.030, 2: 0.040}  # seconds of a plain step by rows


def step(proposed: list[int], accepted: list[int], seconds: float, propose_s: float, prefill: int = 0) -> dict:
    return {"proposed": proposed, "accepted": accepted, "seconds": seconds, "propose_s": propose_s,
            "prefill_tokens": prefill, "tokens": len(proposed) + sum(accepted)}  # fmt: skip


STEPS = [
    step([2, 1], [2, 0], 0.060, 0.010),  # every row drafted: 20 ms over plain, 2 drafts saved 2 x 20 ms
    step([3, 0], [1, 0], 0.100, 0.070),  # some rows drafted, with a catch-up: 60 ms over, 1 x 20 saved
    step([0, 0], [0, 0], 0.050, 0.008),  # the draft ran and proposed nothing: 10 ms over
    step([0, 0], [0, 0], 0.041, 0.001),  # a plain step (lookup only): in no kind
    step([1, 1], [1, 1], 0.500, 0.000, prefill=120),  # a prefill step: left out
    step([1, 0, 0], [1, 0, 0], 0.090, 0.010),  # three rows: no plain step of three to price it, left out
]


def check(out: dict) -> None:
    """The figures STEPS must give, each kind against a plain step of as many rows."""
    assert set(KINDS) < set(out)
    every, some, nothing = (out[kind] for kind in KINDS)
    assert every == {"steps": 1, "extra_s": pytest.approx(0.020), "saved_s": pytest.approx(0.040),
                     "propose_s": pytest.approx(0.010)}  # fmt: skip
    assert some == {"steps": 1, "extra_s": pytest.approx(0.060), "saved_s": pytest.approx(0.020),
                    "propose_s": pytest.approx(0.070)}  # fmt: skip
    assert nothing["steps"] == 1 and nothing["extra_s"] == pytest.approx(0.010) and nothing["saved_s"] == 0
    assert out["drafting over 30 ms"] == {"steps": 1, "propose_s": pytest.approx(0.070)}


def test_each_kind_is_priced_against_a_plain_step_of_as_many_rows():
    check(ledger(STEPS, PLAIN))


def test_control_plain_steps_of_the_wrong_row_count_fail_the_check():
    with pytest.raises(AssertionError):
        check(ledger(STEPS, {1: PLAIN[2], 2: PLAIN[1]}))  # the fault: plain steps looked up by the wrong row count
