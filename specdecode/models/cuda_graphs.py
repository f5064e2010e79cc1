"""CUDA graphs of the step's body, one per bucket of [num_seqs, T], as vLLM captures its decode steps.

A decode or verify step of a small batch launches hundreds of small kernels; on a GPU their launch gaps cost
more than the work. A graph captured once per bucket replays the whole body in one launch. A graph's shapes are
fixed, so a call is padded up to its bucket: extra rows write their K/V to the cache's scratch column (write
position -1, as the engine's own padding does) and extra queries attend to one key so that no row of the
softmax is empty; their outputs are dropped. The attended length is the cache's whole length, with the keys
past each row's own masked out, so a graph never depends on how long the contexts are.

A row's result does not depend on the padding (attention and every other op are per row, and each query's
keys are set by its own mask), but a padded matrix product may pick another GEMM kernel than the unpadded one,
so on a GPU a bucket's logits can differ from the eager step's in the last bits, as they can between batch
sizes in eager mode. Forwards larger than the biggest bucket (prefill chunks) run the body as it is.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass

import torch

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
TOKEN_BUCKETS = (1, 2, 3, 4, 5, 6, 8, 9, 12, 16, 17, 24, 32)


def bucket(n: int, buckets: tuple[int, ...]) -> int | None:
    """The smallest bucket that holds n, or None past the largest."""
    i = bisect.bisect_left(buckets, n)
    return buckets[i] if i < len(buckets) else None


@dataclass
class PaddedInputs:
    """The body's inputs at one bucket's fixed shapes; a call copies its own in, the rest stays padding."""

    tokens: torch.Tensor  # [B, T] int64
    positions: torch.Tensor  # [B, T] int64
    slots: torch.Tensor  # [B] int64
    write_pos: torch.Tensor  # [B, T] int64, -1 for padding (the cache's scratch column)
    mask: torch.Tensor  # [B, 1, T, max_len] additive

    @classmethod
    def allocate(cls, b: int, t: int, max_len: int, dtype: torch.dtype, device: torch.device) -> PaddedInputs:
        long = dict(dtype=torch.long, device=device)
        return cls(
            tokens=torch.zeros(b, t, **long),
            positions=torch.zeros(b, t, **long),
            slots=torch.zeros(b, **long),
            write_pos=torch.full((b, t), -1, **long),
            mask=torch.zeros(b, 1, t, max_len, dtype=dtype, device=device),
        )

    def load(
        self,
        tokens: torch.Tensor,  # [b, t] int64
        positions: torch.Tensor,  # [b, t]
        slots: torch.Tensor,  # [b]
        write_pos: torch.Tensor,  # [b, t]
        mask: torch.Tensor,  # [b, 1, t, kv_len] additive, kv_len <= max_len
    ) -> None:
        b, t = tokens.shape
        self.tokens.zero_()
        self.tokens[:b, :t].copy_(tokens)
        self.positions.zero_()
        self.positions[:b, :t].copy_(positions)
        self.slots.zero_()
        self.slots[:b].copy_(slots)
        self.write_pos.fill_(-1)
        self.write_pos[:b, :t].copy_(write_pos)
        self.mask.fill_(float("-inf"))
        self.mask[..., 0] = 0  # padding queries attend to one key: no empty softmax row, no NaN
        self.mask[:b, :, :t, : mask.shape[-1]].copy_(mask)  # real queries: their own mask, keys past it hidden

    def args(self) -> tuple[torch.Tensor, ...]:
        return self.tokens, self.positions, self.slots, self.write_pos, self.mask


class GraphedBody:
    """`body` replayed from CUDA graphs for calls that fit a bucket; others call `body` itself.

    `capture=False` keeps the padding and runs `body` on the padded inputs without graphs: the CPU tests use it
    to check that padding leaves every row's result unchanged.
    """

    def __init__(self, body: Callable[..., torch.Tensor], capture: bool = True) -> None:
        self.body = body
        self.capture = capture
        self.graphs: dict[tuple, tuple[PaddedInputs, torch.cuda.CUDAGraph | None, torch.Tensor | None]] = {}
        self.pool = torch.cuda.graph_pool_handle() if capture else None

    def __call__(
        self,
        tokens: torch.Tensor,  # [num_seqs, T] int64
        positions: torch.Tensor,
        slots: torch.Tensor,
        write_pos: torch.Tensor,
        mask: torch.Tensor,  # [num_seqs, 1, T, kv_len]
        k: torch.Tensor,  # [layers, slots, kv_heads, max_len + 1, head_dim] the whole cache
        v: torch.Tensor,
    ) -> torch.Tensor:
        b, t = tokens.shape
        bb, tb = bucket(b, BATCH_BUCKETS), bucket(t, TOKEN_BUCKETS)
        if bb is None or tb is None or torch.is_grad_enabled() or mask.shape[-1] > k.shape[3] - 1:
            return self.body(tokens, positions, slots, write_pos, mask, k, v)
        key = (bb, tb, k.data_ptr(), v.data_ptr(), mask.dtype)
        if key not in self.graphs:
            self.graphs[key] = self._prepare(bb, tb, mask.dtype, k, v)
        inputs, graph, out = self.graphs[key]
        inputs.load(tokens, positions, slots, write_pos, mask)
        if graph is None:  # padding only (capture off, or the first call of the bucket, which captures)
            out = self.body(*inputs.args(), k, v)
        else:
            graph.replay()
        return out[:b, :t].clone()  # [num_seqs, T, hidden]; the graph's output buffer is reused by its next replay

    def _prepare(
        self, b: int, t: int, dtype: torch.dtype, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[PaddedInputs, torch.cuda.CUDAGraph | None, torch.Tensor | None]:
        inputs = PaddedInputs.allocate(b, t, k.shape[3] - 1, dtype, k.device)
        if not self.capture:
            return inputs, None, None
        # Warm up on a side stream first (allocator and library handles settle), then capture: capturing
        # does not run the kernels, and the padded inputs are all padding now, so the cache is not touched
        # beyond its scratch column.
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self.body(*inputs.args(), k, v)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = self.body(*inputs.args(), k, v)  # [B, T, hidden] a static buffer
        return inputs, graph, out
