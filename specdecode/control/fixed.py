"""K as given: the classic fixed speculation length."""

from __future__ import annotations

from specdecode.control.base import ControllerBase
from specdecode.step.sequence import Sequence


class FixedController(ControllerBase):
    def choose(self, seqs: list[Sequence], k_max: int) -> list[int]:
        return [k_max] * len(seqs)
