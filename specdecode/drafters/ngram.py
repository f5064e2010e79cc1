"""N-gram prompt lookup: find the latest earlier occurrence of the last n tokens and propose what followed.

No model and no training; it pays off when the output copies from the prompt (summaries, edits, RAG).
Drafts are deterministic (q one-hot), so their confidence may look at the drafts themselves and stay lossless.
"""

from __future__ import annotations

import numpy as np

from specdecode.drafters.base import DrafterBase, Proposal
from specdecode.drafters.history import RequestHistory
from specdecode.step.sequence import Sequence
from specdecode.verify.sampling import SamplingTensors


def suffix_occurrences(tokens: np.ndarray, n_min: int, n_max: int) -> tuple[np.ndarray, int]:
    """Where the longest suffix n-gram (n_max down to n_min) occurred earlier: (the start of each occurrence,
    ascending; n), or (empty, 0) when no suffix recurs. The suffix itself is not an occurrence.

    One pass over the history finds the earlier occurrences of the last token; each n then checks only those
    for the n - 1 tokens before them (a sliding-window comparison per n took ~3x as long at batch 8)."""
    length = len(tokens)
    ends = np.flatnonzero(tokens[: length - 1] == tokens[length - 1]) if length else tokens[:0]  # [m] last index
    for n in range(min(n_max, length - 1), n_min - 1, -1):
        cand = ends[ends >= n - 1]  # [m'] occurrences with room for n tokens
        agree = np.ones(len(cand), dtype=bool)
        for j in range(1, n):
            agree &= tokens[cand - j] == tokens[length - 1 - j]
        if agree.any():
            return cand[agree] - (n - 1), n  # [h] window starts, ascending
    return np.empty(0, dtype=np.int64), 0


def lookup(tokens: np.ndarray, k: int, n_min: int, n_max: int) -> tuple[list[int], list[float]]:
    """Up to k tokens that followed the latest earlier match of the longest suffix n-gram (n_max down to n_min),
    and the confidence of each: among earlier occurrences of the suffix that continued like the drafts before
    position j, the fraction that continued with draft j too (1.0 when the suffix occurred only once)."""
    hits, n = suffix_occurrences(tokens, n_min, n_max)
    if not hits.size:
        return [], []
    start = hits[-1] + n
    draft = tokens[start : start + k]
    return draft.tolist(), _continuation_agreement(tokens, hits + n, draft).tolist()


def _continuation_agreement(tokens: np.ndarray, starts: np.ndarray, draft: np.ndarray) -> np.ndarray:
    """[len(draft)] P(next token = draft[j] | earlier continuation agreed with draft[:j]), over `starts`."""
    idx = starts[:, None] + np.arange(len(draft))  # [num_hits, len(draft)]
    inside = idx < len(tokens)
    cont = np.where(inside, tokens[np.minimum(idx, len(tokens) - 1)], -1)  # [num_hits, len(draft)]
    agree = np.cumprod(cont == draft[None], axis=1)  # [num_hits, len(draft)] agreed on drafts 0..j
    before = np.concatenate([np.ones((len(starts), 1), dtype=agree.dtype), agree[:, :-1]], axis=1)
    return agree.sum(0) / np.maximum(before.sum(0), 1)  # the latest hit always agrees, so never 0/0


class NgramDrafter(DrafterBase):
    retryable_propose = True  # drafts depend on committed state only (drafters/base.py)

    def __init__(self, n_min: int = 1, n_max: int = 4, device: str = "cpu") -> None:
        self.n_min, self.n_max, self.device = n_min, n_max, device
        self.histories: dict[str, RequestHistory] = {}  # each request's tokens as an array, grown as it commits

    def add_sequence(self, seq: Sequence) -> None:
        self.histories[seq.request_id] = RequestHistory(seq.max_len)

    def propose(self, seqs: list[Sequence], num_tokens: list[int], st: SamplingTensors) -> Proposal:
        found = [
            lookup(self.histories[s.request_id].sync(s.token_ids), k, self.n_min, self.n_max) if k else ([], [])
            for s, k in zip(seqs, num_tokens, strict=True)
        ]
        drafts = [d for d, _ in found]
        # Pad only to the longest draft found, not the K asked for: the target scores the whole padded block.
        width = max(map(len, drafts), default=0)
        return Proposal.from_lists(drafts, width, self.device, [c for _, c in found])

    def remove_sequence(self, seq: Sequence) -> None:
        self.histories.pop(seq.request_id, None)

    def live_request_ids(self) -> set[str]:
        return set(self.histories)
