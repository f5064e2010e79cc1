"""fp32 CPU linears for the few rows of a decode or verify step, at the cost of one weight read whatever the rows.

A step of a small model at batch 1 is bound by streaming its weights from memory; the rows a verify adds should
ride along. The GEMMs behind F.linear, oneDNN and inductor's C++ template block for larger problems: on a
2-core AMD EPYC the compiled step with inductor's GEMM took 1.8x as long at 9 tokens as at 1 (results/cost.md
before this kernel, 2026-11-24). The kernel here (kernels/few_rows_gemm.cpp, AVX-512) keeps
accumulators for up to 12 rows x 2-3 panels in registers and reads each weight panel from memory once, so up
to ~9 rows cost about what one does; each output is the same k-ordered chain of FMAs for any row count (a
row's logits do not depend on the rows beside it).

It is a C++ torch op (`specdecode::few_rows_linear`, kernels/few_rows_op.cpp) that the compiled step
(models/compiled.py) calls like the attention op, with the packed weight as the graph's constant, and without
Python in between (a Python implementation cost ~5% of a one-token step in call overhead, 121 calls a step).
It is compiled from source on first use (~10 s) with the system's C++ compiler (the one torch.compile needs
anyway) against this torch into the cache directory, and runs on torch's own OpenMP threads. Without AVX-512,
a compiler, or with $SPECDECODE_FEW_ROWS_GEMM=0, nothing is installed and the step is what it was.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import warnings
from pathlib import Path

import torch
from torch import nn
from torch.utils import cpp_extension

from specdecode.models.disk_cache import build_once, cache_root
from specdecode.models.packed_linear import replace_linears
from specdecode.models.torch_op import KernelBuildError, load_op

ENV = "SPECDECODE_FEW_ROWS_GEMM"  # "0": never install the kernel (nor the attention kernel beside it)
ATTENTION_ENV = "SPECDECODE_FEW_QUERIES_ATTENTION"  # "0": attention stays on SDPA
KERNELS = Path(__file__).parent / "kernels"
# The GEMM and its torch op; the few-queries attention kernels (fp32 and bf16 caches) and their op
# (models/attention.py) share the library.
SOURCES = tuple(
    KERNELS / name
    for name in (
        "few_rows_gemm.cpp",
        "few_rows_op.cpp",
        "few_queries_attention.cpp",
        "few_queries_attention_bf16.cpp",
        "attention_op.cpp",
    )
)
HEADERS = (KERNELS / "few_queries_common.h",)  # what the sources include: part of the build's key
PANEL = 16  # output columns per packed panel (one AVX-512 register of fp32)
FLAGS = ["-O3", "-mavx512f", "-mfma", "-fopenmp", "-shared", "-fPIC", "-std=c++17", "-w"]


def _compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")


def _command(compiler: str, out: Path) -> list[str]:
    """Compile and link the op against this torch (its headers, ABI and libraries)."""
    lib = Path(torch.__file__).parent / "lib"
    abi = f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"
    includes = [f"-I{p}" for p in cpp_extension.include_paths()]
    links = [f"-L{lib}", f"-Wl,-rpath,{lib}", "-ltorch_cpu", "-lc10"]
    return [compiler, *FLAGS, abi, *includes, *map(str, SOURCES), *links, "-o", str(out)]


def _build(out: Path, compiler: str) -> None:
    cmd = _command(compiler, out / "few_rows.so")
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise KernelBuildError(f"{compiler} failed to build the few-rows GEMM: {done.stderr.strip()[-500:]}")


@functools.cache
def library() -> Path:
    """Build the op into the cache directory the first time (keyed by sources, flags, compiler and torch) and
    load it into this process; returns the library's path."""
    compiler = _compiler()
    if compiler is None:
        raise KernelBuildError("no C++ compiler (g++ or $CXX) to build the few-rows GEMM")
    h = hashlib.blake2b(digest_size=8)
    for path in (*SOURCES, *HEADERS):
        h.update(path.read_bytes())
    h.update(" ".join([compiler, *FLAGS, torch.__version__]).encode())
    final = build_once(cache_root() / "kernels" / f"few_rows-{h.hexdigest()}", lambda tmp: _build(tmp, compiler))
    load_op(final / "few_rows.so", "few_rows_linear", _fake_few_rows_linear)
    if hasattr(torch.ops.specdecode, "set_attend_kernel"):  # loaded (a test may stand in for the load)
        set_attention_kernel(os.environ.get(ATTENTION_ENV) != "0" and os.environ.get(ENV) != "0")
    return final / "few_rows.so"


def set_attention_kernel(on: bool) -> None:
    """Let the CPU's `specdecode::attend` (kernels/attention_op.cpp) take the few-queries kernel, or send every
    call to the Python path (the cache writes and SDPA); tests compare the two. The library must be loaded."""
    torch.ops.specdecode.set_attend_kernel(on)


def _fake_few_rows_linear(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], packed.shape[0] * PANEL)


def supported() -> bool:
    """Whether this machine should build the kernel: an AVX-512 CPU and a C++ compiler. Where it is, a build
    that fails is a bug, not an unsupported machine: tests skip only where this is False and call `require`."""
    return torch.backends.cpu.get_cpu_capability().startswith("AVX512") and _compiler() is not None


@functools.cache
def _build_error() -> Exception | None:
    """The error building or loading the library raised in this process, or None once it is loaded."""
    try:
        library()
    except (KernelBuildError, OSError, RuntimeError) as e:  # RuntimeError: torch refused to load it
        return e
    return None


def require() -> None:
    """Build and load the kernel or raise why it could not be (what `available` only warns about and falls
    back from, so that users keep a working step while a test sees the C++ error)."""
    error = _build_error()
    if error is not None:
        raise KernelBuildError(f"the few-rows library failed to build or load: {error}") from error


@functools.cache
def _usable() -> bool:
    if os.environ.get(ENV) == "0" or not torch.backends.cpu.get_cpu_capability().startswith("AVX512"):
        return False
    error = _build_error()
    if error is not None:
        warnings.warn(f"few-rows GEMM unavailable, keeping the compiled step's own GEMM: {error}", stacklevel=3)
        return False
    return True


@functools.cache
def attention_usable() -> bool:
    """Whether the few-queries attention op (kernels/attention_op.cpp) serves here: the library builds and
    $SPECDECODE_FEW_QUERIES_ATTENTION is not "0". It runs inside the opaque attention op (models/attention.py),
    so no graph traces it and it needs no fake; the op's C++ kernel decides the same (set_attention_kernel)."""
    return os.environ.get(ATTENTION_ENV) != "0" and _usable()


def available(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the kernel serves this device and dtype on this machine (it is built here on first call)."""
    return device.type == "cpu" and dtype == torch.float32 and _usable()


def pack(weight: torch.Tensor) -> torch.Tensor:
    """[N, K] -> [N / 16, K, 16]: each panel of 16 output columns contiguous, k-major."""
    n, k = weight.shape
    return weight.detach().reshape(n // PANEL, PANEL, k).transpose(1, 2).contiguous()


def few_rows_linear(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    """x [..., K] @ W^T -> [..., N] with W packed by `pack`, any number of rows (past ~24 the weights are
    re-read from L2 per 12-row block and the GEMM turns compute-bound: the compiled step sends only a few)."""
    library()
    return torch.ops.specdecode.few_rows_linear.default(x, packed)


class FewRowsLinear(nn.Module):
    """An inference-only nn.Linear computed by the few-rows kernel. `weight` stays for dense readers."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight  # [out, in] shared, not copied (a tied LM head stays tied)
        self.bias = linear.bias  # [out] or None
        self.register_buffer("packed", pack(linear.weight))  # [out / 16, in, 16]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.ops.specdecode.few_rows_linear.default(x, self.packed)  # [..., out] (library() loaded it)
        return out if self.bias is None else out + self.bias


def install(model: nn.Module) -> int:
    """Replace every nn.Linear whose output width is a multiple of 16 by FewRowsLinear; returns how many."""
    return replace_linears(model, FewRowsLinear, accept=lambda lin: lin.out_features % PANEL == 0)
