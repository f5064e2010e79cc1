"""fp32 CPU linears for the few rows of a decode or verify step, at the cost of one weight read whatever the rows.

A step of a small model at batch 1 is bound by streaming its weights from memory; the rows a verify adds should
ride along. The GEMMs behind F.linear, oneDNN and inductor's C++ template block for larger problems: on a
2-core AMD EPYC the compiled step with inductor's GEMM took 1.8x as long at 9 tokens as at 1 (results/cost.md
before this kernel, 2026-11-24). The kernel here (kernels/few_rows_gemm.cpp, AVX-512) keeps
accumulators for up to 12 rows x 2-3 panels in registers and reads each weight panel from memory once, so up
to ~9 rows cost about what one does; each output is the same k-ordered chain of FMAs for any row count (a
row's logits do not depend on the rows beside it).

It is a torch op (`specdecode::few_rows_linear`) that the compiled step (models/compiled.py) calls like the
attention op, with the packed weight as the graph's constant. The kernel is compiled from source on first use
with the system's C++ compiler (the one torch.compile needs anyway) into the cache directory, and loaded with
ctypes; it runs on torch's own OpenMP threads. Without AVX-512, a compiler, or with
$SPECDECODE_FEW_ROWS_GEMM=0, nothing is installed and the step is what it was.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import warnings
from pathlib import Path

import torch
from torch import nn

from specdecode.models.loader import build_once, cache_root

ENV = "SPECDECODE_FEW_ROWS_GEMM"  # "0": never install the kernel
SOURCE = Path(__file__).parent / "kernels" / "few_rows_gemm.cpp"
PANEL = 16  # output columns per packed panel (one AVX-512 register of fp32)
FLAGS = ["-O3", "-mavx512f", "-mfma", "-fopenmp", "-shared", "-fPIC", "-std=c++17"]


class KernelBuildError(RuntimeError):
    """The kernel could not be compiled or loaded."""


def _compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")


def _build(out: Path, compiler: str) -> None:
    cmd = [compiler, *FLAGS, str(SOURCE), "-o", str(out / "few_rows_gemm.so")]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise KernelBuildError(f"{' '.join(cmd)} failed: {done.stderr.strip()[-500:]}")


@functools.cache
def library() -> ctypes.CDLL:
    """The compiled kernel, built into the cache directory the first time (keyed by source, flags, compiler)."""
    compiler = _compiler()
    if compiler is None:
        raise KernelBuildError("no C++ compiler (g++ or $CXX) to build the few-rows GEMM")
    key = hashlib.blake2b(SOURCE.read_bytes() + " ".join([compiler, *FLAGS]).encode(), digest_size=8).hexdigest()
    final = build_once(cache_root() / "kernels" / f"few_rows_gemm-{key}", lambda tmp: _build(tmp, compiler))
    lib = ctypes.CDLL(str(final / "few_rows_gemm.so"))
    lib.few_rows_gemm.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 3
    lib.few_rows_gemm.restype = None
    return lib


@functools.cache
def _usable() -> bool:
    if os.environ.get(ENV) == "0" or torch.backends.cpu.get_cpu_capability() != "AVX512":
        return False
    try:
        library()
    except (KernelBuildError, OSError) as e:
        warnings.warn(f"few-rows GEMM unavailable, keeping the compiled step's own GEMM: {e}", stacklevel=3)
        return False
    return True


def available(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the kernel serves this device and dtype on this machine (it is built here on first call)."""
    return device.type == "cpu" and dtype == torch.float32 and _usable()


def pack(weight: torch.Tensor) -> torch.Tensor:
    """[N, K] -> [N / 16, K, 16]: each panel of 16 output columns contiguous, k-major."""
    n, k = weight.shape
    return weight.detach().reshape(n // PANEL, PANEL, k).transpose(1, 2).contiguous()


def few_rows_linear_eager(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    """x [..., K] @ W^T -> [..., N] with W packed by `pack`, any number of rows (past ~24 the weights are
    re-read from L2 per 12-row block and the GEMM turns compute-bound: the compiled step sends only a few)."""
    k, n = packed.shape[1], packed.shape[0] * PANEL
    rows = x.reshape(-1, k).contiguous()  # [M, K]
    out = torch.empty(rows.shape[0], n, dtype=x.dtype, device=x.device)  # [M, N]
    if rows.shape[0]:
        library().few_rows_gemm(rows.data_ptr(), packed.data_ptr(), out.data_ptr(), rows.shape[0], k, n)
    return out.view(*x.shape[:-1], n)


_LIB = torch.library.Library("specdecode", "FRAGMENT")  # held for the process, like models/attention.py's
_LIB.define("few_rows_linear(Tensor x, Tensor packed) -> Tensor")
_LIB.impl("few_rows_linear", few_rows_linear_eager, "CompositeExplicitAutograd")
few_rows_linear = torch.ops.specdecode.few_rows_linear.default


@torch.library.register_fake("specdecode::few_rows_linear", lib=_LIB)
def _(x, packed):
    return x.new_empty(*x.shape[:-1], packed.shape[0] * PANEL)


class FewRowsLinear(nn.Module):
    """An inference-only nn.Linear computed by the few-rows kernel. `weight` stays for dense readers."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight  # [out, in] shared, not copied (a tied LM head stays tied)
        self.bias = linear.bias  # [out] or None
        self.register_buffer("packed", pack(linear.weight))  # [out / 16, in, 16]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = few_rows_linear(x, self.packed)  # [..., out]
        return out if self.bias is None else out + self.bias


def install(model: nn.Module) -> int:
    """Replace every nn.Linear whose output width is a multiple of 16 by FewRowsLinear; returns how many."""
    replaced = 0
    for name, child in list(model.named_children()):
        if isinstance(child, nn.Linear) and child.out_features % PANEL == 0:
            setattr(model, name, FewRowsLinear(child.requires_grad_(False)))
            replaced += 1
        else:
            replaced += install(child)
    return replaced
