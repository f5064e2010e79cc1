"""Acceptance estimates (control/acceptance.py): a request's own evidence, shrunk towards priors that learn across
requests. Negative control: the same history with the pooled counts erased starts a new request at the fixed prior."""

from __future__ import annotations

import numpy as np
import pytest

from specdecode.control.acceptance import AcceptanceTracker


def test_a_fresh_tracker_starts_at_the_fixed_prior():
    np.testing.assert_allclose(AcceptanceTracker().estimate("r", 3), [0.5, 0.45, 0.405])


def history(tracker: AcceptanceTracker) -> None:
    """Two earlier requests whose 4 drafts were all accepted, 20 steps each."""
    for rid in ("a", "b"):
        for _ in range(20):
            tracker.update(rid, 4, 4)
        tracker.forget(rid)


def test_a_new_request_starts_where_the_drafter_has_been():
    tracker = AcceptanceTracker()
    history(tracker)
    assert tracker.estimate("c", 4)[0] > 0.9 and tracker.estimate("c", 4)[3] > 0.85


def test_control_without_the_pool_a_new_request_starts_at_the_fixed_prior():
    tracker = AcceptanceTracker()
    history(tracker)
    tracker.pool_hits[:] = 0.0  # the fault: what the pool learned is lost
    tracker.pool_trials[:] = 0.0
    assert not tracker.estimate("c", 4)[0] > 0.9


def test_a_requests_own_evidence_outweighs_the_pool():
    """Prose after code: the drafts of this request are all rejected; within a few steps its estimate falls."""
    tracker = AcceptanceTracker()
    history(tracker)
    for _ in range(4):
        tracker.update("c", 4, 0)
    assert tracker.estimate("c", 1)[0] < 0.3
    assert tracker.estimate("d", 1)[0] > 0.9  # a running request does not feed the prior
    tracker.forget("c")
    assert tracker.estimate("d", 1)[0] < 0.9  # an ended one does


def test_first_drafts_by_confidence_learn_apart_and_join_the_pool():
    """Seeded at (0.9 sure, 0.45 unsure): misses the drafter was unsure of pull its unsure estimate down and leave
    the sure one where it was; a request that ends adds its counts to the pool's; a draft of unknown confidence
    only ages them. Control: the same misses of unknown confidence move neither."""
    tracker = AcceptanceTracker(prior_weight=2.0)
    tracker.seed_by_confidence((0.9, 0.45), 8.0)
    for _ in range(5):
        tracker.update("r", 1, 0, confident=False)
    fresh = tracker.first_by_confidence("fresh")  # [2] the pool's, each shrunk a little toward the first position
    sure, unsure = tracker.first_by_confidence("r")
    assert fresh[0] > 0.85 and sure == pytest.approx(fresh[0]) and unsure < 0.2
    tries = tracker.by_confidence["r"][:, 1].copy()
    tracker.update("r", 1, 0)  # unknown: ages the counts, adds none
    np.testing.assert_allclose(tracker.by_confidence["r"][:, 1], tracker.decay * tries)
    own = tracker.by_confidence["r"].copy()  # [2, 2]
    tracker.forget("r")
    seed = 8.0 * np.array([[0.9, 1.0], [0.45, 1.0]])
    np.testing.assert_allclose(tracker.pool_by_confidence, tracker.pool_decay * seed + own)
    assert own[0].sum() == 0.0 and own[1, 1] > 1.0
    blind = AcceptanceTracker(prior_weight=2.0)
    blind.seed_by_confidence((0.9, 0.45), 8.0)
    for _ in range(5):
        blind.update("r", 1, 0)
    np.testing.assert_allclose(blind.first_by_confidence("r"), fresh)
