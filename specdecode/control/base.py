"""The controller Protocol: a function of observed statistics -> speculative tokens per request this step."""

from __future__ import annotations

from typing import Protocol

from specdecode.step.proposal import Proposal
from specdecode.step.sequence import Sequence
from specdecode.step.stats import StepStats


class Controller(Protocol):
    def choose(self, seqs: list[Sequence], k_max: int) -> list[int]:
        """K for each running sequence (0 = no speculation for it this step)."""

    def observe(self, stats: StepStats) -> None:
        """Outcomes of the step just taken."""

    def forget(self, seq: Sequence) -> None:
        """The sequence left the batch (after the step's `observe`); drop its statistics."""

    def live_request_ids(self) -> set[str]:
        """Request ids this controller holds state for (tests check that only live requests are here)."""


class Truncating(Protocol):
    """Optional controller hook: the engine calls `truncate` between propose and verify when it exists.

    It may only shorten each row's drafts using draft-side information (tokens, q, confidence), never the
    target's, so verification stays lossless.
    """

    def truncate(self, seqs: list[Sequence], proposal: Proposal) -> Proposal:
        """The proposal with each row cut to a prefix of its drafts."""
