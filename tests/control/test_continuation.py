"""Where a drafter that may stop early goes on (control/continuation.py), and `goodput` asking such a drafter for K
as a cap: K costs the drafts it makes, and confident drafts, the ones it goes on after, are the ones accepted."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from specdecode.config import SamplingParams
from specdecode.control.continuation import DraftContinuation, width_distribution
from specdecode.control.cost import CostModel
from specdecode.control.goodput import GoodputController
from specdecode.drafters.base import Proposal
from specdecode.step.sequence import Sequence
from specdecode.step.stats import StepStats


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


def test_the_last_drafts_confidence_tells_the_position_past_k():
    """Rows asked for 1 whose draft was doubtful (the drafter would have stopped there): position 2 learns it would
    not go on, where counting only drafts made never reaches it. Control: the same rows without their verdict leave
    position 2 at its prior, always going on."""
    told, untold = DraftContinuation(), DraftContinuation()
    for _ in range(300):
        told.update(1, 1, 1, would_go_on=False)
        untold.update(1, 1, 1)
    assert told.estimate(3)[1] < 0.05 and told.estimate(3, after_accepted=True)[1] < 0.05
    assert untold.estimate(3)[1] == 1.0


def test_a_row_that_stopped_early_gives_no_verdict_past_what_it_was_asked():
    """A verdict counts only where the row made every draft it was asked for: one that stopped after 1 of 3 already
    says where it stopped, and its last confidence is that stop's (counted once, not twice)."""
    told, untold = DraftContinuation(), DraftContinuation()
    for _ in range(300):
        told.update(3, 1, 0, would_go_on=False)
        untold.update(3, 1, 0)
    np.testing.assert_array_equal(told.reached, untold.reached)
    np.testing.assert_array_equal(told.went_on, untold.went_on)


def goodput_told_of_doubtful_drafts(stop_below: float) -> float:
    """P(draft 2 made) as a pair's `goodput` learns it after 40 steps of K = 1 whose drafts all had confidence 0.5,
    through its own truncate and observe, for a drafter that stops below `stop_below` (0: never)."""
    ctrl = GoodputController(cost=CostModel.linear(20.1e-3, 1.5e-3, 2.4e-3, 0.3e-3), cheap_draft=0.0)
    ctrl.seed_pair(0.75, 12e-3)
    ctrl.draft_stop_below = stop_below
    seqs = [Sequence("r", [1, 2, 3], SamplingParams(max_tokens=100_000), max_len=200_000)]
    for _ in range(40):
        ctrl.asked = {"r": 1}  # as `choose` records a row asked for one draft
        ctrl.truncate(seqs, Proposal(torch.tensor([[7]]), torch.tensor([1]), None, torch.tensor([[0.5]])))
        ctrl.observe(StepStats(seqs, [1], [1], 0.04, 2, 3.0, 0.012, 0.028))
    return float(ctrl.continuation.estimate(2)[1])


def test_goodput_learns_from_its_drafts_confidence_where_the_drafter_would_stop():
    assert goodput_told_of_doubtful_drafts(0.7) < 0.1
    assert goodput_told_of_doubtful_drafts(0.0) == 1.0  # control: a drafter without a stop tells nothing


def test_goodput_asks_a_drafter_that_stops_when_unsure_for_the_widest_k_it_cannot_tell_apart():
    """Predicted goodput flat over K = 1-3 (within 1% of the best): a drafter that stops when unsure is asked for
    the widest such K, since its confidence decides each chain's end; one that drafts every K it is asked keeps the
    K in force (hysteresis: 3% to move), as a control."""
    gain = np.array([1.0, 1.17, 1.172, 1.175, 1.15, 1.10])
    stops, plain = GoodputController(), GoodputController()
    stops.draft_stop_below = 0.7
    for ctrl in (stops, plain):
        ctrl.k_batch = 1
    assert stops._with_hysteresis(gain, 5) == 3
    assert plain._with_hysteresis(gain, 5) == 1


def k_asked_first(confidences: tuple[float, ...]) -> tuple[int, float]:
    """(K a fresh pair's `goodput` asks at its first step, P(draft 2 made) it prices) when the load probe saw the
    draft's top probability `confidences` on its text, right where it was sure, for a drafter that stops below 0.7
    (a draft right 85% of the time at 7 ms, on a ~22 ms step)."""
    ctrl = GoodputController(cost=CostModel.linear(20.1e-3, 1.5e-3, 2.4e-3, 0.3e-3), cheap_draft=0.0)
    ctrl.seed_pair(0.85, 7e-3, confidences=confidences, agreed=tuple(c >= 0.7 for c in confidences))
    ctrl.bind_drafter(SimpleNamespace(stop_below=0.7, unread=None))
    seq = Sequence("r", [1, 2, 3], SamplingParams(max_tokens=100_000), max_len=200_000)
    return ctrl.choose([seq], 8)[0], float(ctrl.continuation.estimate(2)[1])


def test_a_load_probe_that_saw_the_drafter_stop_prices_a_fresh_request_at_what_it_makes():
    """The probe's draft was sure of half its tokens: a fresh request prices draft 2 as made ~half the time, not
    always, and is asked for more drafts from its first step (a K costs what the drafter makes). Control: a probe
    whose draft was sure of every token leaves the prior, always going on, and fewer drafts are asked."""
    k_half, made_half = k_asked_first((0.95, 0.4) * 16)
    k_sure, made_sure = k_asked_first((0.95,) * 32)
    assert made_half < 0.7 and made_sure == 1.0
    assert k_half > k_sure


def test_the_probe_seeds_the_continuation_once():
    """Bound to its drafter again (bench arms and the engine both bind), the controller keeps what it learned since."""
    ctrl = GoodputController()
    ctrl.seed_pair(0.75, 12e-3, confidences=(0.4,) * 32, agreed=(True,) * 32)
    ctrl.bind_drafter(SimpleNamespace(stop_below=0.7, unread=None))
    for _ in range(300):
        ctrl.continuation.update(4, 4, 4)
    ctrl.bind_drafter(SimpleNamespace(stop_below=0.7, unread=None))
    assert ctrl.continuation.estimate(2)[1] > 0.9


# The 0.5B at the pair's load probe (its top probability at each of the 32 tokens, and whether it was the target's):
# right at 21 of 23 it was sure of (>= 0.7), 3 of 9 it was not; the first two (the response's opening) unsure, wrong.
PROBE_CONFIDENCES = (0.41, 0.66, 1.0, 0.66, 0.94, 0.74, 1.0, 0.95, 0.99, 1.0, 0.35, 0.83, 0.87, 0.99, 1.0, 1.0)
PROBE_CONFIDENCES += (0.65, 0.45, 1.0, 0.32, 0.85, 0.97, 0.9, 0.98, 1.0, 1.0, 0.72, 0.97, 0.55, 0.96, 0.69, 0.72)
PROBE_AGREED = tuple(
    map(bool, (0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 0, 1, 0, 1, 1, 1, 1, 1, 1, 0, 1, 0, 0, 1, 1))
)


def k_asked_after_an_unsure_miss(by_confidence: bool, steps: int = 8) -> list[int]:
    """K a fresh pair's `goodput` asks at each of its first steps, priced as the pair at 8,192 tokens (a ~28 ms plain
    step, ~4 ms a verified token, 11.5 ms a draft; a drafter stopping below 0.7): at the first step the drafter is
    unsure of its first draft (it stops after it, asked for more) and wrong, as the 0.5B is at a response's first
    token; sure and right every time after. by_confidence=False: the fault, first drafts judged alike."""
    cost = lambda: CostModel.linear(20e-3, 4.5e-3, 4e-3, 0.0)  # noqa: E731
    # No plain step (goodput's `_plain_probe_due`, its own test): the trace reads the K chosen at the second step.
    ctrl = GoodputController(cost=cost(), cheap_draft=0.0, plain_doubt=0.0)
    ctrl.seed_pair(0.75, 11.5e-3, confidences=PROBE_CONFIDENCES, agreed=PROBE_AGREED)
    ctrl.bind_drafter(SimpleNamespace(stop_below=0.7, unread=None))
    if not by_confidence:
        ctrl._by_confidence = lambda: False
    seqs = [Sequence("r", [1, 2, 3], SamplingParams(max_tokens=100_000), max_len=200_000)]
    ks = []
    for step in range(steps):
        ks.append(k := ctrl.choose(seqs, 4)[0])
        made, sure = (min(k, 1), 0.4) if step == 0 else (k, 0.95)
        if made:
            confidence = torch.full((1, made), sure)  # [1, made]
            ctrl.truncate(seqs, Proposal(torch.full((1, made), 7), torch.tensor([made]), None, confidence))
        seconds = cost().predict(1, made, 3.0) + 11.5e-3 * made
        ctrl.observe(StepStats(seqs, [made], [0 if step == 0 else made], seconds, made + 1, 3.0, 11.5e-3 * made, 0.03))
    return ks


def test_a_miss_the_drafter_was_unsure_of_does_not_hold_k_down():
    """A stopping drafter's first drafts are judged by its confidence in them: its unsure miss at the first step
    leaves the sure ones, which its deeper drafts follow, where they were, and the next step asks all 4 drafts.
    Control: judged alike, the miss pulled every draft's estimate down and the next step asked 1."""
    assert k_asked_after_an_unsure_miss(by_confidence=True)[1] == 4
    assert k_asked_after_an_unsure_miss(by_confidence=False)[1] == 1
