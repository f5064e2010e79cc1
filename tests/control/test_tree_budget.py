"""The tree node budget: confident trees are verified wide, unconfident ones not at all, and the calibration
learns how far to trust the drafter's confidences."""

from __future__ import annotations

import numpy as np
import torch

from specdecode.control.goodput import GoodputController
from specdecode.control.tree_budget import ConfidenceCalibration, tree_width
from specdecode.drafters.base import Proposal
from tests.control.test_goodput import make_seqs, step_cost


def test_width_follows_confidence():
    cost = step_cost()  # every token adds 2.4 ms: nothing is free
    sure = np.array([[0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2]])
    depth = np.arange(1, 9)[None]  # a chain
    unsure = np.full((1, 8), 0.01)
    counts = np.array([8])
    trusting = ConfidenceCalibration(prior=1.0)
    assert tree_width(sure, depth, counts, trusting, cost, 100.0) >= 4
    assert tree_width(unsure, depth, counts, trusting, cost, 100.0) == 0
    wary = ConfidenceCalibration(prior=0.02)  # a drafter known to be 50x overconfident
    assert tree_width(sure, depth, counts, wary, cost, 100.0) == 0


def test_calibration_learns_per_depth():
    """A chain drafted with confidence 1 everywhere whose paths reach depth 1 always and depth 2 one time in 4."""
    calib = ConfidenceCalibration(prior=0.5)
    conf, depth = np.ones(3), np.array([1, 2, 3])
    for i in range(400):
        calib.update(conf, depth, 2 if i % 4 == 0 else 1)
    assert np.allclose(calib.scale(np.array([1, 2, 3])), [1.0, 0.25, 0.02], atol=0.05)


def test_goodput_truncates_trees_by_confidence():
    ctrl = GoodputController()
    seqs = make_seqs(1)
    parents = torch.tensor([[0, 0, 1, 1, 3, 3]])
    conf = torch.tensor([[0.9, 0.05, 0.8, 0.04, 0.02, 0.01]])
    tokens = torch.arange(6)[None]
    proposal = Proposal(tokens, torch.tensor([6]), None, conf, parents)
    cut = ctrl.truncate(seqs, proposal)
    assert cut.parents is not None and 1 <= int(cut.num_tokens[0]) < 6  # the confident nodes only
    assert ctrl.choose(seqs, 8) == [8]  # in tree mode the whole budget is drafted; truncate decides


def test_goodput_probes_a_silent_tree_drafter():
    """After enough steps verifying nothing, one node is verified so the calibration can recover."""
    ctrl = GoodputController(probe_every=4)
    ctrl.tree_calibration = ConfidenceCalibration(prior=0.02)
    seqs = make_seqs(1)
    proposal = Proposal(
        torch.arange(3)[None], torch.tensor([3]), None, torch.full((1, 3), 0.1), torch.tensor([[0, 1, 2]])
    )
    widths = [int(ctrl.truncate(seqs, proposal).num_tokens[0]) for _ in range(8)]
    assert widths == [0, 0, 0, 1, 0, 0, 0, 1]
