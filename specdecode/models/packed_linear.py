"""fp32 CPU linears with weights packed once at load time: MKL's packed sgemm or oneDNN.

Behind `F.linear`, MKL's sgemm repacks the weight matrix on every call; at one row that hides in the weight
read, but scoring 2-17 rows (a verify step) then costs far more than one. A weight packed once is read in its
packed layout at every row count, which keeps a multi-token verify close to a one-token step. Two packings:
`cblas_sgemm_pack` (the op torch.compile's frozen CPU graphs call, `torch.ops.mkl._mkl_linear`) and oneDNN's
blocked layout (`MkldnnLinear`). Which wins depends on the CPU (measured: on a 2-core AMD EPYC oneDNN scored
9 rows in ~40 ms of linears where MKL, packed or not, took ~65 ms; an Intel Xeon once ran oneDNN 40% slower
than F.linear), so the choice is made per machine, once per process, by timing a stack of linears larger than
the caches (the weights stream from DRAM as in a real step) every way at 1 and 9 rows.
`SPECDECODE_PACKED_LINEAR=plain|mkl|onednn` forces it.

oneDNN keeps a compiled primitive per input shape in two caches (its own primitive cache and ideep's LRU cache,
1,024 entries each by default), so every new row count (each prompt length, each batch x K) adds JIT-compiled
code until they fill: a server's resident memory rose by ~45 MiB over 150 mixed requests and would have kept
rising far beyond. The oneDNN linear therefore pads its rows up to a bounded set of sizes (`row_bucket`: exact
up to 16, then eight sizes per doubling, at most 12.5% padding), so a model's linears compile a few dozen
primitives each (~0.6 MiB of JIT code apiece), and `specdecode serve` compiles them all before it serves
(`warm_row_buckets`): its memory does not grow later, when a rare prompt length first arrives.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.mkldnn import MkldnnLinear

ENV = "SPECDECODE_PACKED_LINEAR"
KINDS = ("plain", "mkl", "onednn")


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


EXACT_ROWS = 16  # row counts up to this are their own bucket (decode and verify steps)


def row_bucket(rows: int) -> int:
    """`rows` rounded up to one of eight sizes per doubling past EXACT_ROWS (17-18 -> 18, 100 -> 104)."""
    if rows <= EXACT_ROWS:
        return rows
    step = 1 << (rows.bit_length() - 4)  # an eighth of the power of two at or below rows
    return -(-rows // step) * step


class OneDNNLinear(nn.Module):
    """oneDNN's blocked-layout linear over rows padded to `row_bucket` sizes (a bounded set of shapes)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.inner = MkldnnLinear(linear, torch.float32)

    @property
    def weight(self) -> torch.Tensor:  # [out, in] oneDNN tensor: dense readers call .to_dense()
        return self.inner.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)  # [n, in]
        n = rows.shape[0]
        padded = row_bucket(n)
        if padded != n:
            rows = F.pad(rows, (0, 0, 0, padded - n))  # [padded, in] zero rows, dropped below
        out = self.inner(rows)[:n]  # [n, out]
        return out.reshape(*x.shape[:-1], self.out_features)


@torch.inference_mode()
def warm_row_buckets(model: nn.Module, max_rows: int) -> int:
    """Run each oneDNN linear shape under `model` once at every row bucket up to `max_rows` (zero rows), so that
    the primitives a server will compile are compiled before it serves: its memory after warm-up is then its
    memory for the rest of its life. The caches are keyed by shape, not weights: one linear of each shape does.
    Returns how many (shape, rows) primitives ran; 0 when nothing under `model` is oneDNN."""
    shapes = {(m.in_features, m.out_features): m for m in model.modules() if isinstance(m, OneDNNLinear)}
    sizes = sorted({row_bucket(rows) for rows in range(1, max_rows + 1)})
    for lin in shapes.values():
        for rows in sizes:
            lin(torch.zeros(rows, lin.in_features))  # [rows, in] -> [rows, out]
    return len(shapes) * len(sizes)


def available(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether to pack: fp32 on a CPU, where a packing measured faster than F.linear."""
    if device.type != "cpu" or dtype != torch.float32:
        return False
    return choice() != "plain"


def _supported() -> list[str]:
    return (
        ["plain"]
        + (["mkl"] if torch.backends.mkl.is_available() else [])
        + (["onednn"] if torch.backends.mkldnn.is_available() else [])
    )


@functools.cache
def choice() -> str:
    """The fastest kind on this machine (forced by $SPECDECODE_PACKED_LINEAR)."""
    forced = os.environ.get(ENV)
    if forced in KINDS:
        return forced
    times = probe()
    return min(times, key=times.get)


def _packer(kind: str):
    return {"mkl": PackedLinear, "onednn": OneDNNLinear}[kind]


def probe(num_layers: int = 32, hidden: int = 576, inner: int = 1536, trials: int = 5) -> dict[str, float]:
    """{kind: seconds}: best of `trials` passes through `num_layers` [inner, hidden] weights (113 MB at the
    defaults, beyond the caches), summed over 1 and 9 input rows, for every kind this torch supports."""
    gen = torch.Generator().manual_seed(0)
    plain = [nn.Linear(hidden, inner, bias=False).requires_grad_(False) for _ in range(num_layers)]
    for lin in plain:
        nn.init.normal_(lin.weight, generator=gen)
    times = {}
    for kind in _supported():
        layers = plain if kind == "plain" else [_packer(kind)(lin) for lin in plain]

        def one_pass(x: torch.Tensor, layers=layers) -> None:
            for lin in layers:
                lin(x)

        times[kind] = _total(one_pass, hidden, trials)
    return times


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


def pack_linears(model: nn.Module, kind: str | None = None) -> int:
    """Replace every nn.Linear by the packed kind (default: this machine's choice) and return how many.

    Inference only: packed weights have no gradient.
    """
    kind = kind or choice()
    return 0 if kind == "plain" else replace_linears(model, _packer(kind))


def replace_linears(
    model: nn.Module, wrap: Callable[[nn.Linear], nn.Module], accept: Callable[[nn.Linear], bool] = lambda lin: True
) -> int:
    """Replace every nn.Linear under `model` that `accept` takes by `wrap(linear)`, its weight frozen first;
    returns how many (models/few_rows.py installs its kernel the same way)."""
    replaced = 0
    for name, child in list(model.named_children()):
        if isinstance(child, nn.Linear) and accept(child):
            setattr(model, name, wrap(child.requires_grad_(False)))
            replaced += 1
        else:
            replaced += replace_linears(child, wrap, accept)
    return replaced
