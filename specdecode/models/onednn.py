"""fp32 CPU linears through oneDNN with weights packed once at load time.

Measured on the 2-core EPYC machine (whole SmolLM2 step, weights streamed from DRAM): MKL's sgemm behind
`F.linear` repacks the weight on every call, so scoring 2-9 tokens costs 1.5-2x scoring one. oneDNN with a
prepacked weight takes 24 ms for 1 token, 28 ms for 3 and 43 ms for 9, against 37, 81 and 82 ms. That is
what makes verifying drafts cheap enough to pay on a CPU.

It is not so everywhere: on a 2-core Intel Xeon host the same packed linears were ~40% slower than `F.linear`
(a decode at 18 instead of 28 tok/s). So packing is decided per machine, once per process, by timing a
stack of linears larger than the caches (the weights stream from DRAM as in a real step) both ways, at 1 and 9
rows; `SPECDECODE_ONEDNN=1` or `0` forces the choice.
"""

from __future__ import annotations

import functools
import os
import time

import torch
from torch import nn
from torch.utils.mkldnn import MkldnnLinear


def available(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether to pack: fp32 on a CPU with oneDNN, where packed linears measured faster."""
    if device.type != "cpu" or dtype != torch.float32 or not torch.backends.mkldnn.is_available():
        return False
    return packing_pays()


@functools.cache
def packing_pays() -> bool:
    forced = os.environ.get("SPECDECODE_ONEDNN")
    if forced in ("0", "1"):
        return forced == "1"
    plain, packed = probe()
    return packed < plain


def probe(num_layers: int = 32, hidden: int = 576, inner: int = 1536, trials: int = 5) -> tuple[float, float]:
    """(plain, packed) seconds: best of `trials` passes through `num_layers` [inner, hidden] weights (113 MB at
    the defaults, beyond the caches), summed over 1 and 9 input rows. Packed runs the op MkldnnLinear runs."""
    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(inner, hidden, generator=gen) for _ in range(num_layers)]  # each [inner, hidden]
    packed = [w.to_mkldnn() for w in weights]
    bias = torch.zeros(inner).to_mkldnn()

    def plain_pass(x: torch.Tensor) -> None:
        for w in weights:
            torch.nn.functional.linear(x, w)

    def packed_pass(x: torch.Tensor) -> None:
        for w in packed:
            torch._C._nn.mkldnn_linear(x.to_mkldnn(), w, bias).to_dense()

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
            setattr(model, name, MkldnnLinear(child.requires_grad_(False), torch.float32))
            replaced += 1
        else:
            replaced += pack_linears(child)
    return replaced
