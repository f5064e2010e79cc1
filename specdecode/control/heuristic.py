"""The transformers schedule per request: K += 2 after a fully accepted step, K -= 1 otherwise.

Unlike transformers it may fall to K = 0 (plain decoding) when drafts keep failing, and then probes K = 1
every `probe_every` steps so a request that became predictable is noticed.
"""

from __future__ import annotations

from specdecode.control.base import ControllerBase, StepStats
from specdecode.step.sequence import Sequence


class HeuristicController(ControllerBase):
    def __init__(self, probe_every: int = 8) -> None:
        self.probe_every = probe_every
        self.k: dict[str, int] = {}  # current K per request
        self.idle: dict[str, int] = {}  # steps spent at K = 0

    def choose(self, seqs: list[Sequence], k_max: int) -> list[int]:
        out = []
        for s in seqs:
            k = min(self.k.setdefault(s.request_id, k_max), k_max)
            if k == 0 and self.idle.get(s.request_id, 0) >= self.probe_every:
                k = 1
            out.append(k)
        return out

    def observe(self, stats: StepStats) -> None:
        for s, proposed, accepted in zip(stats.seqs, stats.num_proposed, stats.num_accepted, strict=True):
            rid = s.request_id
            if proposed == 0:  # nothing drafted (K = 0, or the drafter found nothing)
                self.idle[rid] = self.idle.get(rid, 0) + 1
                continue
            self.idle[rid] = 0
            self.k[rid] = proposed + 2 if accepted == proposed else max(proposed - 1, 0)

    def forget(self, seq: Sequence) -> None:
        self.k.pop(seq.request_id, None)
        self.idle.pop(seq.request_id, None)

    def live_request_ids(self) -> set[str]:
        return set(self.k) | set(self.idle)
