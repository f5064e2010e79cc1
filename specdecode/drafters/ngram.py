"""N-gram prompt lookup: find the latest earlier occurrence of the last n tokens and propose what followed.

No model and no training; it pays off when the output copies from the prompt (summaries, edits, RAG).
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from specdecode.drafters.base import Proposal
from specdecode.engine.sequence import Sequence
from specdecode.sampling import SamplingTensors


def lookup(tokens: np.ndarray, k: int, n_min: int, n_max: int) -> list[int]:
    """Up to k tokens that followed the latest earlier match of the longest suffix n-gram (n_max down to n_min)."""
    length = len(tokens)
    for n in range(min(n_max, length - 1), n_min - 1, -1):
        pattern = tokens[length - n :]
        windows = sliding_window_view(tokens[: length - 1], n)  # [length - n, n]; excludes the suffix itself
        hits = np.flatnonzero((windows == pattern).all(axis=1))
        if hits.size:
            start = hits[-1] + n
            return tokens[start : start + k].tolist()
    return []


class NgramDrafter:
    def __init__(self, n_min: int = 1, n_max: int = 4, device: str = "cpu") -> None:
        self.n_min, self.n_max, self.device = n_min, n_max, device

    def add_sequence(self, seq: Sequence) -> None:
        pass

    def propose(self, seqs: list[Sequence], num_tokens: list[int], st: SamplingTensors) -> Proposal:
        drafts = [
            lookup(np.asarray(s.token_ids, dtype=np.int64), k, self.n_min, self.n_max) if k else []
            for s, k in zip(seqs, num_tokens, strict=True)
        ]
        return Proposal.from_lists(drafts, max(num_tokens, default=0), self.device)

    def commit(self, seqs: list[Sequence]) -> None:
        pass

    def remove_sequence(self, seq: Sequence) -> None:
        pass
