"""The tree node budget: confident trees are verified wide, unconfident ones not at all, and the calibration
learns how far to trust the drafter's confidences."""

from __future__ import annotations

import numpy as np
import torch

from specdecode.control.cost import default_cost_model
from specdecode.control.goodput import GoodputController
from specdecode.control.tree_budget import ConfidenceCalibration, tree_width
from specdecode.drafters.base import Proposal
from tests.control.test_goodput import make_seqs


def test_width_follows_confidence():
    cost = default_cost_model()
    sure = np.array([[0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2]])
    unsure = np.full((1, 8), 0.01)
    counts = np.array([8])
    wide, predicted = tree_width(sure, counts, 1.0, cost, 100.0)
    assert wide >= 4 and predicted[0] == sure[0, :wide].sum()
    assert tree_width(unsure, counts, 1.0, cost, 100.0)[0] == 0
    assert tree_width(sure, counts, 0.01, cost, 100.0)[0] == 0  # a drafter known to be 100x overconfident


def test_calibration_learns_the_ratio():
    calib = ConfidenceCalibration(prior=0.5)
    for _ in range(300):
        calib.update(accepted=1, predicted=4.0)
    assert abs(calib.scale - 0.25) < 0.02


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
