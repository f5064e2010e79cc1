"""Confidence-thresholded drafting: a row's drafts stop at the first one the drafter itself is unsure of.

The drafter proposes up to K_max; the engine then calls `truncate`, which cuts each row before its first
draft whose confidence (Proposal.confidence: q's top probability for the draft model, the agreement of
earlier continuations for n-gram) is below that request's threshold. The cut uses draft-side information
only, so verification stays lossless. The saving is verification width: drafting still runs to K_max.

Each threshold is tuned online by a stochastic-approximation rule: a step whose kept drafts were rejected
raises it by lr * (1 - target_reject); a step that was cut by the threshold and had every kept draft accepted
lowers it by lr * target_reject. At equilibrium a fraction `target_reject` of those informative steps end in
a rejection (rows cut to zero drafts only drift down, at a tenth of the step). Thresholds stay in [LOW, HIGH]
so neither "never draft" nor "draft everything" is absorbing.
"""

from __future__ import annotations

import torch

from specdecode.control.base import ControllerBase, StepStats
from specdecode.drafters.base import Proposal
from specdecode.step.sequence import Sequence

LOW, HIGH = 0.05, 0.95
ZERO_CUT_SCALE = 0.1  # the downward step after a row was cut to zero drafts, relative to an informative one


class ConfidenceController(ControllerBase):
    def __init__(self, threshold: float = 0.3, lr: float = 0.05, target_reject: float = 0.3) -> None:
        self.initial = threshold
        self.lr = lr
        self.target_reject = target_reject
        self.thresholds: dict[str, float] = {}
        self.was_cut: dict[str, bool] = {}  # did the last truncate shorten this row's drafts?

    def threshold(self, seq: Sequence) -> float:
        return self.thresholds.get(seq.request_id, self.initial)

    def choose(self, seqs: list[Sequence], k_max: int) -> list[int]:
        return [k_max] * len(seqs)

    def truncate(self, seqs: list[Sequence], proposal: Proposal) -> Proposal:
        if proposal.confidence is None or proposal.token_ids.shape[1] == 0:
            return proposal
        conf = proposal.confidence  # [num_seqs, k]
        tau = torch.tensor([self.threshold(s) for s in seqs], dtype=conf.dtype, device=conf.device)  # [num_seqs]
        below = conf < tau[:, None]  # [num_seqs, k]
        first_below = torch.where(below.any(1), below.long().argmax(1), conf.shape[1])  # [num_seqs]
        cut = (first_below < proposal.num_tokens).tolist()
        self.was_cut = {s.request_id: c for s, c in zip(seqs, cut, strict=True)}
        return proposal.truncated(first_below)

    def observe(self, stats: StepStats) -> None:
        for s, proposed, accepted in zip(stats.seqs, stats.num_proposed, stats.num_accepted, strict=True):
            tau = self.threshold(s)
            if accepted < proposed:
                tau += self.lr * (1.0 - self.target_reject)
            elif self.was_cut.get(s.request_id, False):
                # A row cut to nothing taught us nothing: drift down slowly (a probe), don't step.
                tau -= self.lr * self.target_reject * (1.0 if proposed else ZERO_CUT_SCALE)
            self.thresholds[s.request_id] = min(max(tau, LOW), HIGH)

    def forget(self, seq: Sequence) -> None:
        self.thresholds.pop(seq.request_id, None)
        self.was_cut.pop(seq.request_id, None)

    def live_request_ids(self) -> set[str]:
        return set(self.thresholds) | set(self.was_cut)
