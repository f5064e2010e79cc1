"""Speed per weight of each grouped int8 kernel type (models/quant_int8.py) against Q4_K's, in one process.

    python -m experiments.int8_types [--trials 12] [--calls 20] [--out results/int8_types.json]

A weight of each type, 16,384 x 8,960 random blocks (the kernel tests' `random_blocks`), is grouped once as
Int8QuantLinear does; each trial times `calls` products of every type in turn at 1 and at 5 activation
rows (a decode step, a 5-token verify). The types' times are compared within a trial, so a slow spell of a shared
machine moves every type of the trial together: the figure is the median over trials of time(type) / time(Q4_K)
at equal weights, beside each type's bytes per weight as grouped.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
from gguf import GGMLQuantizationType as Q

from specdecode.bench.lib import provenance, write_result
from specdecode.models import quant_int8
from specdecode.models.row_groups import group_rows
from tests.models.test_quant_int8 import random_blocks

OUT, IN = 16384, 8960
TYPES = (Q.Q4_K, Q.Q6_K, Q.Q5_0, Q.Q8_0, Q.Q4_1, Q.Q4_0)
ROWS = (1, 5)


def random_groups(qtype: Q) -> torch.Tensor:
    """A random weight [OUT, IN] of `qtype`, grouped -> [OUT / 16, bytes]."""
    return group_rows(random_blocks(qtype, OUT, IN, np.random.default_rng(0)), qtype)


def seconds(x: torch.Tensor, groups: torch.Tensor, qtype: Q, calls: int) -> float:
    """Wall seconds of one product of x [R, IN] by the grouped weight, the mean of `calls`."""
    t = time.perf_counter()
    for _ in range(calls):
        quant_int8.quant_int8_grouped_linear(x, groups, qtype, IN, OUT)
    return (time.perf_counter() - t) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--out", default="results/int8_types.json")
    args = parser.parse_args()
    groups = {t: random_groups(t) for t in TYPES}
    xs = {r: torch.randn(r, IN) for r in ROWS}  # [R, IN]
    for t in TYPES:  # warm-up: the op's first call builds and loads it
        seconds(xs[1], groups[t], t, 2)
    times = {(t, r): [] for t in TYPES for r in ROWS}
    for _ in range(args.trials):
        for r in ROWS:
            for t in TYPES:
                times[t, r].append(seconds(xs[r], groups[t], t, args.calls))
    rows = []
    for r in ROWS:
        for t in TYPES:
            ratios = [a / b for a, b in zip(times[t, r], times[Q.Q4_K, r], strict=True)]
            rows.append(
                {
                    "type": t.name,
                    "rows": r,
                    "bytes_per_weight": groups[t].numel() / (OUT * IN),
                    "median_ms": 1000 * statistics.median(times[t, r]),
                    "time_over_q4k": statistics.median(ratios),
                }
            )
            print(
                f"{t.name:>5} rows {r}: {rows[-1]['bytes_per_weight']:.3f} B/weight, "
                f"{rows[-1]['median_ms']:7.2f} ms, {rows[-1]['time_over_q4k']:.2f}x Q4_K's time"
            )
    payload = {**provenance("experiments.int8_types"), "shape": [OUT, IN], "trials": args.trials, "rows": rows}
    print(f"wrote {write_result(args.out, payload)}")


if __name__ == "__main__":
    main()
