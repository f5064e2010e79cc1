"""fp32 CPU linears through MKL's packed sgemm, the weights packed once at load time.

Behind `F.linear`, MKL's sgemm repacks the weight matrix on every call; at one row that hides in the weight
read, but scoring 2-17 rows (a verify step) then costs far more than one. A weight packed once with
`cblas_sgemm_pack` (the op torch.compile's frozen CPU graphs call, `torch.ops.mkl._mkl_linear`) is read in
its packed layout at every row count, which is what keeps a multi-token verify close to a one-token step.

Whether it pays is decided per machine, once per process, by timing a stack of linears larger than the caches
(the weights stream from DRAM as in a real step) both ways at 1 and 9 rows; `SPECDECODE_PACKED_LINEAR=1` or `0`
forces the choice.
"""

from __future__ import annotations

import functools
import os
import time

import torch
import torch.nn.functional as F
from torch import nn

ENV = "SPECDECODE_PACKED_LINEAR"


class PackedLinear(nn.Module):
    """An inference-only nn.Linear whose weight MKL has packed once. `weight` stays for dense readers."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight  # [out, in] shared, not copied (a tied LM head stays tied)
        self.bias = linear.bias  # [out] or None
        with torch.no_grad():
            self.register_buffer("packed", torch.ops.mkl._mkl_reorder_linear_weight(self.weight.detach(), 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)  # [rows, in]
        # The row count as the batch hint makes MKL compute from the packed weight at any number of rows
        # (a different hint falls back to a plain sgemm).
        out = torch.ops.mkl._mkl_linear(rows, self.packed, self.weight, self.bias, rows.shape[0])  # [rows, out]
        return out.view(*x.shape[:-1], self.out_features)


def available(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether to pack: fp32 on a CPU whose torch has MKL, where packed linears measured faster."""
    if device.type != "cpu" or dtype != torch.float32 or not torch.backends.mkl.is_available():
        return False
    return packing_pays()


@functools.cache
def packing_pays() -> bool:
    forced = os.environ.get(ENV)
    if forced in ("0", "1"):
        return forced == "1"
    plain, packed = probe()
    return packed < plain


def probe(num_layers: int = 32, hidden: int = 576, inner: int = 1536, trials: int = 5) -> tuple[float, float]:
    """(plain, packed) seconds: best of `trials` passes through `num_layers` [inner, hidden] weights (113 MB at
    the defaults, beyond the caches), summed over 1 and 9 input rows."""
    gen = torch.Generator().manual_seed(0)
    plain = [nn.Linear(hidden, inner, bias=False) for _ in range(num_layers)]
    for lin in plain:
        nn.init.normal_(lin.weight, generator=gen)
    packed = [PackedLinear(lin) for lin in plain]

    def plain_pass(x: torch.Tensor) -> None:
        for lin in plain:
            F.linear(x, lin.weight)

    def packed_pass(x: torch.Tensor) -> None:
        for lin in packed:
            lin(x)

    return _total(plain_pass, hidden, trials), _total(packed_pass, hidden, trials)


@torch.inference_mode()
def _total(one_pass, hidden: int, trials: int) -> float:
    total = 0.0
    for rows in (1, 9):
        x = torch.ones(rows, hidden)  # [rows, hidden]
        best = float("inf")
        for _ in range(trials + 1):  # the first pass warms up
            t0 = time.perf_counter()
            one_pass(x)
            best = min(best, time.perf_counter() - t0)
        total += best
    return total


def pack_linears(model: nn.Module) -> int:
    """Replace every nn.Linear (inference only: packed weights have no gradient) and return how many."""
    replaced = 0
    for name, child in list(model.named_children()):
        if isinstance(child, nn.Linear):
            setattr(model, name, PackedLinear(child.requires_grad_(False)))
            replaced += 1
        else:
            replaced += pack_linears(child)
    return replaced
