"""Micro-benchmark of specdecode::quant_rows_linear per matrix shape and row count: ms and GB/s of blocks read.
Usage (repo root): flock /tmp/specdecode-bench.lock python -m experiments.quant_rows_speed [threads]
Times are CPU seconds of this process (process_time): with 1 thread they measure the work even beside other jobs."""

import sys
import time

import numpy as np
import torch
from gguf import GGMLQuantizationType as Q

from specdecode.models import quant_rows
from tests.models.test_quant_rows import random_blocks

SHAPES = [
    ("w13 1.5B", Q.Q4_K, 17920, 1536),
    ("down 1.5B", Q.Q4_K, 1536, 8960),
    ("down 1.5B", Q.Q6_K, 1536, 8960),
    ("head 1.5B", Q.Q6_K, 151936, 1536),
    ("w13 SmolLM2", Q.Q4_1, 3072, 576),
    ("head SmolLM2", Q.Q8_0, 49152, 576),
    ("qkv 0.5B", Q.Q5_0, 1152, 896),
]
ROWS = [1, 2, 5, 9]


def main(threads: int) -> None:
    torch.set_num_threads(threads)  # 1: CPU time measures work even on a busy machine
    gen = np.random.default_rng(0)
    quant_rows.library()
    print(f"{'matrix':14} {'type':5} {'out x in':>13} " + " ".join(f"{r:>3} rows ms   GB/s" for r in ROWS))
    for name, qt, out, k in SHAPES:
        blocks = random_blocks(qt, out, k, gen)
        cells = []
        for r in ROWS:
            x = torch.randn(r, k)
            quant_rows.quant_rows_linear(x, blocks, qt, k)
            reps = max(3, int(0.1e9 / blocks.numel()))
            best = 1e9
            for _ in range(3):
                t = time.process_time()
                for _ in range(reps):
                    quant_rows.quant_rows_linear(x, blocks, qt, k)
                best = min(best, (time.process_time() - t) / reps)
            cells.append(f"{best * 1e3:9.3f} {blocks.numel() / best / 1e9:6.1f}")
        print(f"{name:14} {qt.name:5} {out:>6}x{k:<6} " + " ".join(cells), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
