"""Per-matrix milliseconds of the int8 arithmetic (models/quant_int8.py) beside the exact QuantLinear.

    flock /tmp/specdecode-bench.lock python -m experiments.int8_bench [--repeats 5]

Random blocks of the 1.5B target's shapes and types; the best of `repeats` calls after a warm-up. Prints a
table (and the path the int8 kernel took). --cpu-time times the process's CPU seconds instead of the wall clock:
with OMP_NUM_THREADS=1 on a machine others share, that counts only the time the kernel was running.
"""

from __future__ import annotations

import argparse
import time
from functools import partial

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as Q

from specdecode.models import quant_int8, quant_rows
from specdecode.models.row_groups import group_rows

SHAPES = ((8960, 1536, Q.Q4_K), (1536, 8960, Q.Q4_K), (151936, 1536, Q.Q6_K))  # (out, in, type)
ROWS = (1, 2, 5, 9)


def blocks(out: int, k: int, qtype: Q) -> torch.Tensor:
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    gen = np.random.default_rng(0)
    raw = gen.integers(0, 256, size=(out, k // block_size, type_size), dtype=np.uint8)
    d = gen.uniform(-0.01, 0.01, size=(out, k // block_size, 1)).astype(np.float16).view(np.uint8)
    for offset in (0, 2) if qtype == Q.Q4_K else (208,):
        raw[..., offset : offset + 2] = d
    return torch.from_numpy(raw.reshape(out, -1))


def best_ms(fn, repeats: int, clock=time.perf_counter) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t = clock()
        fn()
        times.append(clock() - t)
    return 1000 * min(times)  # the least disturbed by other processes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cpu-time", action="store_true", help="process CPU time, not wall time")
    args = parser.parse_args()
    clock = time.process_time if args.cpu_time else time.perf_counter
    print(
        f"int8 path {quant_int8.paths()[0]} (1 VNNI, 2 BW, 3 portable); torch threads {torch.get_num_threads()}, "
        f"{'CPU' if args.cpu_time else 'wall'} time"
    )
    print(f"{'matrix':>22} {'rows':>4} {'exact ms':>9} {'int8 ms':>8} {'speedup':>7}")
    for out, k, qtype in SHAPES:
        w = blocks(out, k, qtype)
        for rows in ROWS:
            x = torch.randn(rows, k)
            exact = best_ms(partial(quant_rows.quant_rows_linear, x, w, qtype, k), args.repeats, clock)
            groups = group_rows(w, qtype)  # once, as Int8QuantLinear does
            fast = best_ms(partial(quant_int8.quant_int8_grouped_linear, x, groups, qtype, k, out), args.repeats, clock)
            print(f"{f'{out}x{k} {qtype.name}':>22} {rows:>4} {exact:9.2f} {fast:8.2f} {exact / fast:6.2f}x")


if __name__ == "__main__":
    main()
