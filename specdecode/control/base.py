"""The controller Protocol: a function of observed statistics -> speculative tokens per request this step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from specdecode.engine.sequence import Sequence


@dataclass
class StepStats:
    """What one engine step observed, fed back to the controller after verification."""

    seqs: list[Sequence]
    num_proposed: list[int]  # drafts per row this step
    num_accepted: list[int]  # accepted drafts per row
    step_time_s: float  # wall time of propose + verify + commit
    num_verified_tokens: int  # rows * (k + 1) scored by the target, padding included


class Controller(Protocol):
    def choose(self, seqs: list[Sequence], k_max: int) -> list[int]:
        """K for each running sequence (0 = no speculation for it this step)."""

    def observe(self, stats: StepStats) -> None:
        """Outcomes of the step just taken."""

    def forget(self, seq: Sequence) -> None:
        """The sequence finished; drop its statistics."""
