"""Confidence truncation: the cut keeps proposals consistent, the threshold tracks where drafts start failing,
and both drafters report a draft-side confidence."""

from __future__ import annotations

import numpy as np
import torch

from specdecode.config import SamplingParams
from specdecode.control.base import StepStats
from specdecode.control.confidence import HIGH, LOW, ConfidenceController
from specdecode.drafters.base import Proposal
from specdecode.drafters.draft_model import draft_confidence
from specdecode.drafters.ngram import lookup
from specdecode.step.sequence import Sequence
from specdecode.verify.sampling import PAD_TOKEN_ID, SamplingTensors

K = 6


def seq(name: str = "r") -> Sequence:
    return Sequence(name, [1, 2, 3], SamplingParams(), max_len=1000)


def test_truncate_cuts_rows_and_keeps_the_proposal_consistent():
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, PAD_TOKEN_ID, PAD_TOKEN_ID]])
    probs = torch.rand(2, 4, 16)
    conf = torch.tensor([[0.9, 0.8, 0.2, 0.9], [0.1, 0.9, 0.0, 0.0]])
    proposal = Proposal(ids, torch.tensor([4, 2]), probs, conf)
    out = ConfidenceController(threshold=0.5).truncate([seq("a"), seq("b")], proposal)
    assert out.num_tokens.tolist() == [2, 0]
    assert out.token_ids.tolist() == [[5, 6], [PAD_TOKEN_ID, PAD_TOKEN_ID]]  # width shrinks to the longest row
    assert torch.equal(out.probs, probs[:, :2]) and out.confidence.shape == (2, 2)


def run(ctrl: ConfidenceController, true_cut: float, steps: int, seed: int = 0) -> list[float]:
    """Drafts with uniform confidences; a kept draft is accepted iff its confidence is >= true_cut."""
    rng = np.random.default_rng(seed)
    s = seq()
    thresholds = []
    for _ in range(steps):
        conf = torch.tensor(rng.random((1, K)), dtype=torch.float32)
        proposal = ctrl.truncate([s], Proposal(torch.ones(1, K, dtype=torch.long), torch.tensor([K]), None, conf))
        kept = int(proposal.num_tokens[0])
        ok = (conf[0, :kept] >= true_cut).tolist() + [False]
        ctrl.observe(StepStats([s], [kept], [ok.index(False)], 0.02, kept + 1))
        thresholds.append(ctrl.threshold(s))
    return thresholds


def test_threshold_settles_where_drafts_start_failing():
    assert 0.45 <= np.mean(run(ConfidenceController(threshold=0.3), true_cut=0.6, steps=400)[200:]) <= 0.7
    assert np.mean(run(ConfidenceController(threshold=0.3), true_cut=0.2, steps=400)[200:]) < 0.3  # control


def test_threshold_stays_bounded():
    failing = run(ConfidenceController(), true_cut=2.0, steps=200)  # everything fails
    assert max(failing) <= HIGH and failing[-1] > 0.85
    assert run(ConfidenceController(), true_cut=-1.0, steps=200)[-1] == LOW  # everything passes


def test_ngram_confidence_is_agreement_of_earlier_continuations():
    tokens = np.array([5, 6, 7, 1, 5, 6, 7, 2, 5, 6, 7, 1, 9, 5, 6, 7])
    drafts, conf = lookup(tokens, 4, 2, 4)
    assert drafts == [1, 9, 5, 6]  # what followed the latest "5 6 7"
    np.testing.assert_allclose(conf, [2 / 3, 1 / 2, 1.0, 1.0])  # 2 of 3 continued with 1; of those, 1 with 9


def test_draft_confidence_is_decided_before_sampling():
    logits = torch.tensor([[2.0, 1.0, 0.0], [0.0, 0.0, 3.0]])
    q = torch.tensor([[1.0, 0.0, 0.0], [0.2, 0.3, 0.5]])  # row 0 greedy (one-hot), row 1 sampled
    st = SamplingTensors.from_params([SamplingParams(), SamplingParams(temperature=1.0)], "cpu")
    conf = draft_confidence(logits, q, st)
    assert conf[0] == torch.tensor([2.0, 1.0, 0.0]).softmax(-1).max()  # raw softmax, not the one-hot
    assert conf[1] == 0.5  # max q, whatever token gets drawn
