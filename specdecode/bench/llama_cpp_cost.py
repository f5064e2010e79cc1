"""Native llama.cpp's step-cost curve for `specdecode bench cost --llama-cpp-native`: ms of one forward of T new
tokens at context C, batch 1, as its own `llama-bench` times it on the target's GGUF.

`llama-bench -p T -n 0 -d C` fills the context to C tokens (untimed; restored from a saved state on repeats)
and times the evaluation of T more in one batch: one forward, the verify of a T-token chain. 2 threads
(torch's count), llama-bench's defaults otherwise (its warm-up run included), `-r` repeats, the median kept.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import torch

from specdecode.bench.llama_cpp_native import tool


def parse_llama_bench_json(text: str) -> dict[tuple[int, int], float]:
    """{(new tokens, context): median ms} from `llama-bench -o json`'s list of tests (`samples_ns` per test);
    generation tests (n_gen > 0) are left out."""
    out = {}
    for test in json.loads(text):
        if test["n_gen"] == 0 and test["n_prompt"] > 0:
            out[(test["n_prompt"], test["n_depth"])] = statistics.median(test["samples_ns"]) / 1e6
    return out


_repack_died: list[int] = []  # the signal llama-bench died of with weight repacking on, once it has


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=1800)


def llama_bench_ms(gguf: Path, tokens: int, context: int, repeats: int) -> float:
    """Median ms of one forward of `tokens` new tokens at `context`, batch 1, in a fresh llama-bench process."""
    threads = str(torch.get_num_threads())
    argv = [str(tool("llama-bench")), "-m", str(gguf), "-p", str(tokens), "-n", "0", "-d", str(context),
            "-r", str(repeats), "-t", threads, "-o", "json"]  # fmt: skip
    proc = _run(argv + (["--repack", "0"] if _repack_died else []))
    if proc.returncode < 0 and not _repack_died:  # as NativeArm._repack_off: the AMX matmul's crash on some CPUs
        print(f"llama-bench died of signal {-proc.returncode}; running it with --repack 0 from now on", file=sys.stderr)
        _repack_died.append(-proc.returncode)
        proc = _run(argv + ["--repack", "0"])
    if proc.returncode != 0:
        raise RuntimeError(f"llama-bench exited {proc.returncode}: {proc.stderr[-2000:]}")
    return parse_llama_bench_json(proc.stdout)[(tokens, context)]
