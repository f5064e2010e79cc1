"""Where a drafter that may stop early goes on (control/continuation.py), and `goodput` asking such a drafter for K
as a cap: K costs the drafts it makes, and confident drafts, the ones it goes on after, are the ones accepted."""

from __future__ import annotations

import numpy as np
import pytest

from specdecode.config import SamplingParams
from specdecode.control.continuation import DraftContinuation, width_distribution
from specdecode.control.cost import CostModel
from specdecode.control.goodput import GoodputController
from specdecode.step.sequence import Sequence


def test_the_widest_row_of_a_batch_by_hand():
    """One row asked for 4 that goes on half the time: 1, 2, 3 drafts with 1/2, 1/4, 1/8, and 4 with 1/8; two
    such rows asked for 2: both make 1 only a quarter of the time; a drafter that never stops is its cap."""
    half = np.array([1.0, 0.5, 0.5, 0.5])
    np.testing.assert_allclose(width_distribution(half, np.array([4]), 4), [0, 0.5, 0.25, 0.125, 0.125])
    np.testing.assert_allclose(width_distribution(half, np.array([4, 4]), 2), [0, 0.25, 0.75])
    np.testing.assert_allclose(width_distribution(np.ones(4), np.array([3, 1]), 4), [0, 0, 0, 1, 0])


def test_estimates_count_where_rows_went_on_and_after_what():
    """Rows asked for 4: half stop after a doubtful, rejected first draft, half draft all 4 and all are accepted.
    Position 2 goes on half the time, but always after an accepted draft; positions 3-4 always do."""
    cont = DraftContinuation()
    for _ in range(300):
        cont.update(4, 1, 0)
        cont.update(4, 4, 4)
    np.testing.assert_allclose(cont.estimate(4), [1.0, 0.5, 1.0, 1.0], atol=0.05)  # the prior: 2 of ~50 counts
    np.testing.assert_allclose(cont.estimate(4, after_accepted=True), [1.0, 1.0, 1.0, 1.0], atol=0.05)


def test_a_position_never_reached_goes_on_as_the_one_before():
    cont = DraftContinuation()
    for _ in range(300):
        cont.update(2, 1, 1)  # asked for 2, stopped after the first: position 3 never reached
    assert cont.estimate(4) == pytest.approx([1.0, 0.0, 0.0, 0.0], abs=0.05)


def k_asked(learned: bool) -> int:
    """K a pair's `goodput` asks (right 0.75 of the time, 12 ms a draft on a ~24 ms step) once it has seen the
    drafter stop after half of its first drafts, and go on after every accepted one (learned=False: never told)."""
    ctrl = GoodputController(cost=CostModel.linear(20.1e-3, 1.5e-3, 2.4e-3, 0.3e-3), cheap_draft=0.0)
    ctrl.seed_pair(0.75, 12e-3)
    if learned:
        for _ in range(300):
            ctrl.continuation.update(4, 1, 0)
            ctrl.continuation.update(4, 4, 4)
    seq = Sequence("r", [1, 2, 3], SamplingParams(max_tokens=100_000), max_len=200_000)
    return ctrl.choose([seq], 8)[0]


def test_a_drafter_that_stops_when_unsure_is_asked_for_more():
    """Its K = 4 costs 2.5 drafts, not 4, for as many accepted: `goodput` asks more of it. Control: the same
    controller never told where the drafter stops prices K as K drafts and asks fewer."""
    assert k_asked(learned=True) > k_asked(learned=False)
