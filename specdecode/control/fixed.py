"""K as given: the classic fixed speculation length."""

from __future__ import annotations

from specdecode.control.base import StepStats
from specdecode.step.sequence import Sequence


class FixedController:
    def choose(self, seqs: list[Sequence], k_max: int) -> list[int]:
        return [k_max] * len(seqs)

    def observe(self, stats: StepStats) -> None:
        pass

    def forget(self, seq: Sequence) -> None:
        pass

    def live_request_ids(self) -> set[str]:
        return set()
