"""A request's prompt and output as a growing array, for drafters that search it every step (n-gram, suffix)."""

from __future__ import annotations

import numpy as np


class RequestHistory:
    """One request's prompt + output as a growing int32 buffer, synced from the engine's token list."""

    def __init__(self, capacity: int) -> None:
        self.tokens = np.empty(capacity, dtype=np.int32)  # [max_len]
        self.length = 0

    def sync(self, token_ids: list[int]) -> np.ndarray:
        """[len(token_ids)] int32 the history; only the tokens committed since the last sync are copied."""
        self.tokens[self.length : len(token_ids)] = token_ids[self.length :]
        self.length = len(token_ids)
        return self.tokens[: self.length]
