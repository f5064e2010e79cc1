"""Build llama.cpp's own tools natively, as its users run them, for the native peer arms.

Usage: python -m specdecode.bench.llama_cpp_build      (what `make peers` runs; minutes on 2 cores)

The source is the llama.cpp vendored in the llama-cpp-python sdist pinned below, fetched from PyPI with pip, so
the native arms and the llama-cpp-python arm (`--llama-cpp`) run the same llama.cpp. It is configured for this
CPU (GGML_NATIVE: -march=native), without GPU back ends, HTTPS or tests, and only the tools the arms call are
built, into cache_root()/llama.cpp-<hash>/bin; the hash covers the version and the flags, so a change of
either builds anew beside the old one.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from specdecode.models.disk_cache import cache_root

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=ON",
    "-DGGML_CUDA=OFF",
    "-DLLAMA_OPENSSL=OFF",  # this version's stand-in for LLAMA_CURL: no downloads from a hub
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
    "-DBUILD_SHARED_LIBS=OFF",  # the binaries move into bin/ without their libraries
)
# llama-completion is this version's non-interactive generator (llama-cli became a chat UI);
# llama-speculative-simple is the draft-model loop llama.cpp's docs point users to.
TOOLS = (
    "llama-bench",
    "llama-batched-bench",
    "llama-completion",
    "llama-speculative",
    "llama-speculative-simple",
    "llama-lookup",
)


def build_dir() -> Path:
    """cache_root()/llama.cpp-<hash of the version and the flags>."""
    key = "|".join((LLAMA_CPP_PYTHON_VERSION, *CMAKE_FLAGS, *TOOLS))
    return cache_root() / f"llama.cpp-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def bin_dir() -> Path:
    return build_dir() / "bin"


def _fetch_source(dest: Path) -> Path:
    """The sdist's vendor/llama.cpp, unpacked under `dest` (pip download: PyPI through its own client)."""
    src = dest / "src"
    if (src / "CMakeLists.txt").exists():
        return src
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-binary",
                ":all:",
                "--no-deps",
                f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}",
                "-d",
                tmp,
            ],
            check=True,
        )
        (sdist,) = Path(tmp).glob("llama_cpp_python-*.tar.gz")
        prefix = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}/vendor/llama.cpp/"
        with tarfile.open(sdist) as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
            for m in members:
                m.name = m.name[len(prefix) :]
            tar.extractall(Path(tmp) / "llama.cpp", members=[m for m in members if m.name], filter="data")
        shutil.move(str(Path(tmp) / "llama.cpp"), src)
    return src


def build(jobs: int | None = None) -> Path:
    """Fetch, configure and build the tools; returns the bin directory. Idempotent: a finished build is kept."""
    root = build_dir()
    out = root / "bin"
    if all((out / t).exists() for t in TOOLS):
        return out
    root.mkdir(parents=True, exist_ok=True)
    src = _fetch_source(root)
    work = root / "build"
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    subprocess.run(["cmake", "-S", str(src), "-B", str(work), *generator, *CMAKE_FLAGS], check=True)
    subprocess.run(
        ["cmake", "--build", str(work), "-j", str(jobs or os.cpu_count() or 1), "--target", *TOOLS], check=True
    )
    out.mkdir(exist_ok=True)
    for tool in TOOLS:
        shutil.copy2(work / "bin" / tool, out / tool)
    return out


def main() -> int:
    try:
        out = build()
    except (subprocess.CalledProcessError, FileNotFoundError) as exc:
        print(f"llama_cpp_build: error: {exc}", file=sys.stderr)
        return 2
    print(f"llama.cpp tools ({', '.join(TOOLS)}) in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
