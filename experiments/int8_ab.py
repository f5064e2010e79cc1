"""The int8 kernel (models/kernels/quant_int8.cpp, the fast arithmetic) against its source at another git revision.

    python -m experiments.int8_ab --baseline REV [--rows 1,5,9,32] [--trials 9] [--path auto|vnni|bw|avx2|portable]
        [--out results/int8_ab.json]

As experiments/quant_rows_ab.py does for the exact kernel: the baseline's source is built under another op namespace
beside this tree's kernel, both multiply the same random blocks grouped once (models/row_groups.py), in the 1.5B's
and the 0.5B's shapes and types as the fast arithmetic holds them (the 0.5B requantized to Q4_1), each stacked to
135-250 MB so that it streams from memory (this Xeon VM keeps ~64-100 MB in its last-level cache); each trial times
both on every matrix in turn, on the path the op's AUTO takes (or --path, one this CPU has), the one that goes first
alternating from trial to trial (the second reads what the first left in the cache). The figure is the median over
trials of each one's ms and of their paired ratio (this tree / baseline). The two must give the same bits: the run
stops if they do not.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time

import numpy as np
import torch
from gguf import GGMLQuantizationType as Q

from experiments.quant_rows_ab import op_from_source
from specdecode.bench.lib import provenance, write_result
from specdecode.models import quant_int8
from specdecode.models.row_groups import group_rows
from tests.models.test_quant_rows import random_blocks

SOURCE = "specdecode/models/kernels/quant_int8.cpp"
NAMESPACE = "quant_int8_ab_baseline"
MATRICES = [  # (name, type, out, in)
    ("1.5B w13 x12", Q.Q4_K, 215040, 1536),
    ("1.5B down x12", Q.Q6_K, 18432, 8960),
    ("1.5B head", Q.Q6_K, 151936, 1536),
    ("0.5B w13 x40", Q.Q4_1, 389120, 896),
]


PATHS = {"auto": quant_int8.AUTO, "vnni": quant_int8.VNNI, "bw": quant_int8.BW, "avx2": quant_int8.AVX2}
PATHS["portable"] = quant_int8.PORTABLE


def time_call(op, x: torch.Tensor, groups: torch.Tensor, qtype: Q, k: int, n: int, calls: int, path: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        op(x, groups, int(qtype), k, n, None, path)
    return (time.perf_counter() - start) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="a git revision of this repository")
    parser.add_argument("--rows", default="1,5,9,32")
    parser.add_argument("--trials", type=int, default=9)
    parser.add_argument("--calls", type=int, default=2)
    parser.add_argument("--path", choices=PATHS, default="auto")
    parser.add_argument("--out", default="results/int8_ab.json")
    args = parser.parse_args()
    quant_int8.library()
    path = PATHS[args.path]
    if path != quant_int8.AUTO and path not in quant_int8.paths():
        raise SystemExit(f"this CPU does not run the {args.path} path")
    text = subprocess.run(["git", "show", f"{args.baseline}:{SOURCE}"], capture_output=True, text=True, check=True)
    baseline = op_from_source(
        text.stdout, NAMESPACE, f"the kernel at {args.baseline}", quant_int8.FLAGS, "quant_int8_grouped_linear"
    )
    ops = {"this tree": torch.ops.specdecode.quant_int8_grouped_linear, "baseline": baseline}
    gen = np.random.default_rng(0)
    groups = {m: group_rows(random_blocks(m[1], m[2], m[3], gen), m[1]) for m in MATRICES}
    cells = []
    for rows in [int(r) for r in args.rows.split(",")]:
        xs = {m: torch.from_numpy(gen.standard_normal((rows, m[3]), dtype=np.float32)) for m in MATRICES}
        for m in MATRICES:
            got = [op(xs[m], groups[m], int(m[1]), m[3], m[2], None, path) for op in ops.values()]
            if not torch.equal(*got):
                raise SystemExit(f"{m[0]} at {rows} rows: the two kernels give different bits")
        times = {(m, name): [] for m in MATRICES for name in ops}
        for trial in range(args.trials):
            for m in MATRICES:
                for name, op in list(ops.items())[:: 1 if trial % 2 else -1]:
                    times[m, name].append(time_call(op, xs[m], groups[m], m[1], m[3], m[2], args.calls, path))
        for m in MATRICES:
            new, old = times[m, "this tree"], times[m, "baseline"]
            cell = {
                "matrix": m[0],
                "type": m[1].name,
                "shape": [m[2], m[3]],
                "mb": round(groups[m].numel() / 1e6, 1),
                "rows": rows,
                "ms": {"this tree": statistics.median(new) * 1e3, "baseline": statistics.median(old) * 1e3},
                "ratio": statistics.median(a / b for a, b in zip(new, old, strict=True)),
            }
            cells.append(cell)
            print(
                f"{rows:2d} rows  {m[0]:13s} {m[1].name:5s} {cell['mb']:5.0f} MB  "
                f"baseline {cell['ms']['baseline']:7.2f} ms  this tree {cell['ms']['this tree']:7.2f} ms  "
                f"ratio {cell['ratio']:.3f}",
                flush=True,
            )
    rev = subprocess.run(["git", "rev-parse", "--short", args.baseline], capture_output=True, text=True, check=True)
    run = {"baseline": rev.stdout.strip(), "path": args.path, "threads": torch.get_num_threads(), "cells": cells}
    write_result(args.out, {**provenance("experiments.int8_ab"), **run})


if __name__ == "__main__":
    main()
