"""A C++ torch op library built once per machine: the system C++ compiler (the one torch.compile needs anyway)
against this torch's headers, ABI and libraries, into the cache directory, keyed by the source, the flags, the
compiler and the torch version. The quantized kernels (models/quant_rows.py, models/quant_int8.py) build this
way; each module then loads its library and registers its ops' fakes itself."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import torch
from torch.utils import cpp_extension

from specdecode.models.disk_cache import build_once, cache_root
from specdecode.models.few_rows import KernelBuildError


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
