"""The exact kernel (models/kernels/quant_rows.cpp) against its source at another git revision, in one process.

    python -m experiments.quant_rows_ab --baseline REV [--rows 1,4,5,9,12] [--trials 7]
        [--out results/quant_rows_ab.json]

The baseline's source is built under another op namespace (`quant_rows_ab_baseline`) beside this tree's kernel, and
both multiply the same random blocks (the kernel tests' `random_blocks`), each matrix 90-190 MB so that it streams
from memory as a real model's weights do (a matrix that fits the last-level cache hides a kernel that waits on
memory). Each trial times both kernels on every matrix in turn, the one that goes first alternating from trial to
trial: the second reads what the first left in the cache (with this tree always first, types whose code a change had
not touched read 1.02-1.09x on a Zen 4 EPYC). The figure is the median over trials of each one's ms and of their
paired ratio (this tree / baseline). The two must give the same bits: the run stops if they do not.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType as Q

from specdecode.bench.lib import provenance, write_result
from specdecode.models import quant_rows
from specdecode.models.torch_op import build_op
from tests.models.test_quant_rows import random_blocks

SOURCE = "specdecode/models/kernels/quant_rows.cpp"
NAMESPACE = "quant_rows_ab_baseline"
# (name, type, out, in): the 1.5B's head and its linears' shapes stacked, the 0.5B's, SmolLM2's type
MATRICES = [
    ("1.5B w13 x6", Q.Q4_K, 107520, 1536),
    ("1.5B head", Q.Q6_K, 151936, 1536),
    ("0.5B qkv x200", Q.Q5_0, 230400, 896),
    ("0.5B head x4", Q.Q8_0, 131072, 896),
    ("SmolLM2-shaped", Q.Q4_1, 98304, 1536),
]


def op_from_source(
    text: str, namespace: str, what: str, flags: list[str] = quant_rows.FLAGS, op: str = "quant_rows_linear"
) -> torch._ops.OpOverloadPacket:
    """Build a version of a kernel's source (quant_rows.cpp, or another with `flags` and its op's name) under its own
    op namespace beside this tree's, load it into this process and return its op (`what` names it in the build's
    progress line)."""
    for macro in ("TORCH_LIBRARY_FRAGMENT", "TORCH_LIBRARY_IMPL"):
        text = text.replace(f"{macro}(specdecode,", f"{macro}({namespace},")
    kernel = op.removesuffix("_linear").removesuffix("_grouped")  # quant_rows, quant_int8
    text = text.replace(f"specdecode_{kernel}_", f"{namespace}_")  # one C symbol per library
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / f"{namespace}.cpp"
        source.write_text(text)
        torch.ops.load_library(str(build_op(namespace, source, flags, what)))
    return getattr(getattr(torch.ops, namespace), op)


def baseline_op(rev: str) -> torch._ops.OpOverloadPacket:
    """Build the kernel's source at `rev` under NAMESPACE and return its linear op."""
    text = subprocess.run(["git", "show", f"{rev}:{SOURCE}"], capture_output=True, text=True, check=True).stdout
    return op_from_source(text, NAMESPACE, f"the kernel at {rev}")


def time_call(op, x: torch.Tensor, blocks: torch.Tensor, qtype: Q, k: int, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        op(x, blocks, int(qtype), k, None, 0)
    return (time.perf_counter() - start) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="a git revision of this repository")
    parser.add_argument("--rows", default="1,4,5,9,12")
    parser.add_argument("--trials", type=int, default=7)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--out", default="results/quant_rows_ab.json")
    args = parser.parse_args()
    quant_rows.library()
    ops = {"this tree": torch.ops.specdecode.quant_rows_linear, "baseline": baseline_op(args.baseline)}
    gen = np.random.default_rng(0)
    weights = {m: random_blocks(m[1], m[2], m[3], gen) for m in MATRICES}
    cells = []
    for rows in [int(r) for r in args.rows.split(",")]:
        xs = {m: torch.from_numpy(gen.standard_normal((rows, m[3]), dtype=np.float32)) for m in MATRICES}
        for m in MATRICES:
            got = [op(xs[m], weights[m], int(m[1]), m[3], None, 0) for op in ops.values()]
            if not torch.equal(*got):
                raise SystemExit(f"{m[0]} at {rows} rows: the two kernels give different bits")
        times = {(m, name): [] for m in MATRICES for name in ops}
        for trial in range(args.trials):
            for m in MATRICES:
                for name, op in list(ops.items())[:: 1 if trial % 2 == 0 else -1]:
                    times[m, name].append(time_call(op, xs[m], weights[m], m[1], m[3], args.calls))
        for m in MATRICES:
            mb = weights[m].numel() / 1e6
            new, old = times[m, "this tree"], times[m, "baseline"]
            ms = {"this tree": statistics.median(new) * 1e3, "baseline": statistics.median(old) * 1e3}
            cell = {
                "matrix": m[0],
                "type": m[1].name,
                "shape": [m[2], m[3]],
                "mb": round(mb, 1),
                "rows": rows,
                "ms": ms,
                "gb_per_s": {name: mb / value for name, value in ms.items()},
                "ratio": statistics.median(a / b for a, b in zip(new, old, strict=True)),
            }
            cells.append(cell)
            print(
                f"{rows:2d} rows  {m[0]:15s} {m[1].name:5s} {mb:4.0f} MB  baseline {cell['ms']['baseline']:7.2f} ms "
                f"({cell['gb_per_s']['baseline']:4.1f} GB/s)  this tree {cell['ms']['this tree']:7.2f} ms "
                f"({cell['gb_per_s']['this tree']:4.1f} GB/s)  ratio {cell['ratio']:.3f}",
                flush=True,
            )
    run = {"baseline": args.baseline, "threads": torch.get_num_threads(), "cells": cells}
    write_result(args.out, {**provenance("experiments.quant_rows_ab"), **run})


if __name__ == "__main__":
    main()
