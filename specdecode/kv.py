"""The KV cache: preallocated slots with per-slot lengths. Rollback after rejected drafts is setting a length.

Stale K/V past a slot's length are never read (attention masks by position) and are simply overwritten by
the next step, so nothing is ever copied on rejection (vLLM's and gpt-fast's approach).
"""

from __future__ import annotations

import torch

from specdecode.huge_pages import MIN_BYTES, huge_empty


class CacheFullError(RuntimeError):
    """No free slot, or a sequence would grow past the cache's length."""


def zeros(shape: tuple[int, ...], device: torch.device | str, dtype: torch.dtype) -> torch.Tensor:
    """A zeroed cache tensor; on the CPU a large one is on huge pages (specdecode/huge_pages.py), every page touched
    now as torch.zeros would, so resident memory does not grow later as slots fill."""
    nbytes = torch.Size(shape).numel() * dtype.itemsize
    if torch.device(device).type != "cpu" or nbytes < MIN_BYTES:
        return torch.zeros(shape, device=device, dtype=dtype)
    return huge_empty(shape, dtype).zero_()


class KVCache:
    """K/V for every layer of one model, `num_slots` sequences of up to `max_len` tokens each."""

    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        max_len: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        # One scratch column past max_len: the padding of a ragged step is written there (index -1), never read.
        shape = (num_layers, num_slots, num_kv_heads, max_len + 1, head_dim)
        self.k = zeros(shape, device, dtype)  # [layers, slots, kv_heads, len, head_dim]
        self.v = zeros(shape, device, dtype)  # [layers, slots, kv_heads, len, head_dim]
        self.max_len = max_len
        self.lengths = [0] * num_slots  # tokens with valid K/V per slot; the one owner is the engine's commit
        self._free = list(range(num_slots - 1, -1, -1))

    @property
    def num_slots(self) -> int:
        return len(self.lengths)

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        if not self._free:
            raise CacheFullError("no free KV-cache slot")
        slot = self._free.pop()
        self.lengths[slot] = 0
        return slot

    def free(self, slot: int) -> None:
        self.lengths[slot] = 0
        self._free.append(slot)

    def set_length(self, slot: int, length: int) -> None:
        if not 0 <= length <= self.max_len:
            raise CacheFullError(f"slot {slot} length {length} outside 0..{self.max_len}")
        self.lengths[slot] = length

    def compact(self, slot: int, start: int, offsets: list[int]) -> None:
        """Move the K/V written at start + offsets[i] to start + i (every layer): a tree's accepted path, or a
        draft's window sliding down to its sink (drafters/draft_window.py).

        Offsets increase (a path runs down a topologically ordered tree; a window keeps its order), so
        offsets[i] >= i, and the source is gathered into a copy before it is written.
        """
        if offsets == list(range(len(offsets))):
            return
        src = torch.tensor(offsets, device=self.k.device) + start
        dst = torch.arange(start, start + len(offsets), device=self.k.device)
        self.k[:, slot, :, dst] = self.k[:, slot, :, src]
        self.v[:, slot, :, dst] = self.v[:, slot, :, src]

    def copy_prefix(self, src: int, dst: int, length: int) -> None:
        """Copy the first `length` positions of slot src into slot dst (every layer): a shared prompt."""
        self.k[:, dst, :, :length] = self.k[:, src, :, :length]
        self.v[:, dst, :, :length] = self.v[:, src, :, :length]
