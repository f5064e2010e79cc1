"""Acceptance estimates (control/acceptance.py): a request's own evidence, shrunk towards priors that learn across
requests. Negative control: the same history with the pooled counts erased starts a new request at the fixed prior."""

from __future__ import annotations

import numpy as np

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
