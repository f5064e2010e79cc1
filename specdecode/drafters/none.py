"""No drafter: every step is plain autoregressive decoding (K = 0), the baseline of every speedup."""

from __future__ import annotations

from specdecode.drafters.base import DrafterBase, Proposal
from specdecode.step.sequence import Sequence
from specdecode.verify.sampling import SamplingTensors


class NoDrafter(DrafterBase):
    def __init__(self, device: str = "cpu") -> None:
        self.device = device

    def propose(self, seqs: list[Sequence], num_tokens: list[int], st: SamplingTensors) -> Proposal:
        return Proposal.from_lists([[] for _ in seqs], 0, self.device)
