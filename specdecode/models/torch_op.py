"""A C++ torch op library built once per machine: the system C++ compiler (the one torch.compile needs anyway)
against this torch's headers, ABI and libraries, into the cache directory, keyed by the source, the flags, the
compiler and the torch version. The quantized kernels (models/quant_rows.py, models/quant_int8.py) build this
way; they and the few-rows GEMM (models/few_rows.py) load their libraries with `load_op`, once per process."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils import cpp_extension

from specdecode.models.disk_cache import build_once, cache_root


class KernelBuildError(RuntimeError):
    """The kernel could not be compiled or loaded."""


def compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")


def _compile(out: Path, cxx: str, source: Path, flags: list[str], what: str) -> None:
    lib = Path(torch.__file__).parent / "lib"
    abi = f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"
    includes = [f"-I{p}" for p in cpp_extension.include_paths()]
    links = [f"-L{lib}", f"-Wl,-rpath,{lib}", "-ltorch_cpu", "-lc10"]
    done = subprocess.run(
        [cxx, *flags, abi, *includes, str(source), *links, "-o", str(out)], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise KernelBuildError(f"{cxx} failed to build the {what}: {done.stderr.strip()[-500:]}")


def build_op(name: str, source: Path, flags: list[str], what: str) -> Path:
    """The path of `name`.so built from `source` with `flags`, compiling it into the cache the first time; `what`
    names the kernel in errors (no compiler, a compile error)."""
    cxx = compiler()
    if cxx is None:
        raise KernelBuildError(f"no C++ compiler (g++ or $CXX) to build the {what}")
    h = hashlib.blake2b(digest_size=8)
    h.update(source.read_bytes())
    h.update(" ".join([cxx, *flags, torch.__version__]).encode())
    build = lambda tmp: _compile(tmp / f"{name}.so", cxx, source, flags, what)  # noqa: E731
    return build_once(cache_root() / "kernels" / f"{name}-{h.hexdigest()}", build) / f"{name}.so"


def load_op(path: Path, op: str, fake: Callable[..., torch.Tensor]) -> None:
    """Load the library at `path` into this process and register the fake (for export and compile) of its op
    `specdecode::op`: once per process. A second copy of the library (built into another cache directory, as the
    kernel tests do) would register the same ops again, which aborts the process: the ops already loaded serve."""
    if hasattr(torch.ops.specdecode, op):
        return
    torch.ops.load_library(str(path))
    if not hasattr(torch.ops.specdecode, op):
        raise KernelBuildError(f"{path} does not define specdecode::{op}")
    torch.library.register_fake(f"specdecode::{op}", fake)


def load_unless_tracing(library: Callable[[], Path]) -> None:
    """Call an op module's `library()` (build and load, cached), except inside a graph being traced (torch.compile
    of a step): the trace must not enter the build's file checks (dynamo cannot trace os.stat: the compiled
    quantized step failed to build on CPUs without AVX-512, 2026-12-06). The modules whose forward calls an op
    load its library when they are built, so a traced forward finds the op registered."""
    if not torch.compiler.is_compiling():
        library()
