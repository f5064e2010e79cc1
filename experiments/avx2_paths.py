"""What a CPU without AVX-512 runs, timed on this one: the exact kernel's and the int8 kernel's paths, and the
ordered attention op against SDPA.

    python -m experiments.avx2_paths [--trials 7] [--out results/avx2_paths.json]

The quantized linears: random blocks in the 1.5B's shapes and types, stacked to stream from memory, at 1 and 5
activation rows, on every path this CPU runs (models/quant_rows.py `paths()`: AVX-512, AVX2, portable; the int8
kernel's VNNI, AVX-512BW, AVX2), the median ms of --trials calls (the portable exact path: one call, it is tens of
times slower). Attention: one layer of the 1.5B's shape (12 query heads over 2 key heads of 128) after 512 and 4,096
cached keys, 1 and 5 new tokens, through models/attention.py with the few-queries kernel off, the ordered op
against SDPA, taking turns. Run it on a quiet machine: nothing else may share the two cores.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch
from gguf import GGMLQuantizationType as Q

from specdecode.bench.lib import provenance, write_result
from specdecode.models import attention, few_rows, ordered_attention, quant_int8, quant_rows
from specdecode.models.llama import AttentionMetadata
from specdecode.models.row_groups import group_rows
from tests.models.test_quant_rows import random_blocks

MATRICES = [("1.5B w13 x4", Q.Q4_K, 17920 * 4, 1536), ("1.5B down x12", Q.Q6_K, 1536 * 12, 8960)]
EXACT_PATHS = {quant_rows.AVX512: "avx512", quant_rows.AVX2: "avx2", quant_rows.PORTABLE: "portable"}
INT8_PATHS = {quant_int8.VNNI: "vnni", quant_int8.BW: "bw", quant_int8.AVX2: "avx2"}
HEADS, KV_HEADS, DIM = 12, 2, 128


def median_ms(fn: Callable[[], object], trials: int) -> float:
    fn()  # warm
    times = []
    for _ in range(trials):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def linears(trials: int) -> list[dict]:
    gen = np.random.default_rng(0)
    cells = []
    for name, qtype, out, k in MATRICES:
        blocks = random_blocks(qtype, out, k, gen)
        groups = group_rows(blocks, qtype)
        for rows in (1, 5):
            x = torch.from_numpy(gen.standard_normal((rows, k), dtype=np.float32))
            cell = {"matrix": name, "type": qtype.name, "mb": round(blocks.numel() / 1e6, 1), "rows": rows}
            for path, label in EXACT_PATHS.items():
                if path in quant_rows.paths():
                    n = 1 if path == quant_rows.PORTABLE else trials
                    run = functools.partial(quant_rows.quant_rows_linear, x, blocks, qtype, k, path=path)
                    cell[f"exact {label} ms"] = median_ms(run, n)
            for path, label in INT8_PATHS.items():
                if path in quant_int8.paths():
                    run = functools.partial(quant_int8.quant_int8_grouped_linear, x, groups, qtype, k, out, None, path)
                    cell[f"int8 {label} ms"] = median_ms(run, trials)
            print(" ".join(f"{key}={v:.2f}" if isinstance(v, float) else f"{key}={v}" for key, v in cell.items()))
            cells.append(cell)
    return cells


def attention_cells(trials: int) -> list[dict]:
    ordered_attention.library()
    gen = torch.Generator().manual_seed(0)
    max_len = 4096 + 8
    cache_k = torch.randn(1, 1, KV_HEADS, max_len + 1, DIM, generator=gen)
    cache_v = torch.randn(1, 1, KV_HEADS, max_len + 1, DIM, generator=gen)
    cells = []
    with torch.inference_mode():
        for context in (512, 4096):
            for new in (1, 5):
                q = torch.randn(1, new, HEADS, DIM, generator=gen)
                k, v = (
                    torch.randn(1, new, KV_HEADS, DIM, generator=gen),
                    torch.randn(1, new, KV_HEADS, DIM, generator=gen),
                )
                meta = AttentionMetadata.build([0], [context], new, "cpu", max_len=max_len)
                mask = meta.additive_mask(new, torch.float32)
                call = functools.partial(
                    attention.attend_eager, q, k, v, cache_k, cache_v, 0, meta.slots, meta.write_pos, mask
                )
                times = {"ordered": [], "sdpa": []}
                for trial in range(trials):
                    for name in list(times)[:: 1 if trial % 2 else -1]:
                        ordered_attention.usable = functools.partial(bool, name == "ordered")
                        times[name].append(median_ms(call, 5))
                cell = {"context": context, "new_tokens": new} | {
                    f"{name} ms": statistics.median(ts) for name, ts in times.items()
                }
                print(" ".join(f"{key}={v:.3f}" if isinstance(v, float) else f"{key}={v}" for key, v in cell.items()))
                cells.append(cell)
    return cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=7)
    parser.add_argument("--out", default="results/avx2_paths.json")
    args = parser.parse_args()
    torch.set_num_threads(2)
    few_rows.attention_usable = lambda: False  # the path a CPU without AVX-512 takes
    if hasattr(torch.ops.specdecode, "set_attend_kernel"):
        few_rows.set_attention_kernel(False)
    run = {"linears": linears(args.trials), "attention": attention_cells(args.trials)}
    write_result(args.out, {**provenance("experiments.avx2_paths"), **run})


if __name__ == "__main__":
    main()
