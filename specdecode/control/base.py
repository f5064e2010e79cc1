"""The controller Protocol: a function of observed statistics -> speculative tokens per request this step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from specdecode.drafters.base import Proposal
from specdecode.engine.sequence import Sequence


@dataclass
class StepStats:
    """What one engine step observed, fed back to the controller after verification."""

    seqs: list[Sequence]
    num_proposed: list[int]  # drafts per row this step
    num_accepted: list[int]  # accepted drafts per row
    step_time_s: float  # wall time of propose + verify + commit
    num_verified_tokens: int  # rows * (k + 1) scored by the target, padding included
    mean_context_len: float = 0.0  # tokens per row before the step, averaged (attention cost grows with it)
    propose_time_s: float = 0.0  # drafting (and truncation) part of step_time_s
    verify_time_s: float = 0.0  # target forward + acceptance part of step_time_s


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
