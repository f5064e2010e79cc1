"""What feature drafters keep of the target's hidden states: per request, the features not yet consumed.

The engine calls `observe_features(seq, start, feats)` with the target's post-norm features of
seq.token_ids[start : start + n] (prefill chunks, then each step's kept tokens), always contiguously.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdecode.step.sequence import Sequence


@dataclass
class Features:
    start: int  # token position of rows[0]
    rows: torch.Tensor  # [n, hidden]

    @property
    def end(self) -> int:
        return self.start + self.rows.shape[0]


class FeatureStore:
    """Features per request id; `keep_last` drops all but the newest row (Medusa and MTP need only that)."""

    def __init__(self, keep_last: bool) -> None:
        self.keep_last = keep_last
        self.by_request: dict[str, Features] = {}

    def add(self, seq: Sequence, start: int, feats: torch.Tensor) -> None:
        old = self.by_request.get(seq.request_id)
        if old is not None and not self.keep_last and old.end == start and old.rows.shape[0]:
            feats = torch.cat([old.rows, feats])  # [n_old + n, hidden]
            start = old.start
        if self.keep_last:
            start, feats = start + feats.shape[0] - 1, feats[-1:]
        self.by_request[seq.request_id] = Features(start, feats)

    def ready(self, seq: Sequence) -> bool:
        """Is the feature of the last cached token here? Not for a one-token prompt (nothing cached yet)."""
        f = self.by_request.get(seq.request_id)
        return f is not None and f.end == seq.num_cached and f.end > 0

    def last(self, seqs: list[Sequence], hidden: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """[num_seqs, hidden] the feature of each row's last cached token (whose next token is the pending one);
        zeros for rows that are not ready (they get no drafts)."""
        zeros = torch.zeros(hidden, dtype=dtype, device=device)  # [hidden]
        rows = [self.by_request[s.request_id].rows[-1] if self.ready(s) else zeros for s in seqs]
        return torch.stack(rows)

    def take(self, seq: Sequence, upto: int) -> Features:
        """The stored rows before position `upto`; they leave the store (the caller has consumed them)."""
        f = self.by_request.get(seq.request_id) or Features(upto, torch.empty(0, 0))
        n = upto - f.start
        self.by_request[seq.request_id] = Features(upto, f.rows[n:])
        return Features(f.start, f.rows[:n])

    def drop(self, seq: Sequence) -> None:
        self.by_request.pop(seq.request_id, None)

    def request_ids(self) -> set[str]:
        return set(self.by_request)
