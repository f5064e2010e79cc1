"""The controller Protocol: a function of observed statistics -> speculative tokens per request this step."""

from __future__ import annotations

from typing import Protocol

from specdecode.step.proposal import Proposal
from specdecode.step.sequence import Sequence
from specdecode.step.stats import StepStats


class Controller(Protocol):
    def choose(self, seqs: list[Sequence], k_max: int) -> list[int]:
        """K for each running sequence (0 = no speculation for it this step)."""

    def truncate(self, seqs: list[Sequence], proposal: Proposal) -> Proposal:
        """The proposal with each row cut to a prefix of its drafts; the engine calls it between propose and verify.

        It may only shorten each row's drafts using draft-side information (tokens, q, confidence), never the
        target's, so verification stays lossless.
        """

    def observe(self, stats: StepStats) -> None:
        """Outcomes of the step just taken."""

    def forget(self, seq: Sequence) -> None:
        """The sequence left the batch (after the step's `observe`); drop its statistics."""

    def live_request_ids(self) -> set[str]:
        """Request ids this controller holds state for (tests check that only live requests are here)."""

    def bind_drafter(self, drafter) -> None:
        """The engine's drafter (called once the engine holds both): what a row would cost it to draft for."""


class ControllerBase:
    """The Protocol's hooks with their defaults (keep every draft, learn nothing, hold nothing): a controller
    inherits this and writes `choose` and the hooks it needs, and the engine calls every hook without asking
    whether it exists."""

    def choose(self, seqs: list[Sequence], k_max: int) -> list[int]:
        raise NotImplementedError

    def truncate(self, seqs: list[Sequence], proposal: Proposal) -> Proposal:
        return proposal

    def observe(self, stats: StepStats) -> None:
        pass

    def forget(self, seq: Sequence) -> None:
        pass

    def live_request_ids(self) -> set[str]:
        return set()

    def bind_drafter(self, drafter) -> None:
        """The engine's drafter, for a controller that asks it what a row costs it (goodput: what it must read)."""
