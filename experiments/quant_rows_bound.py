"""What bounds the exact kernel (models/kernels/quant_rows.cpp) at one activation row: memory, or its instructions?

    python -m experiments.quant_rows_bound [--rows 1,4] [--trials 7] [--out results/quant_rows_bound.json]

Two variants of this tree's source, each built under its own op namespace beside the kernel, time the same
90-190 MB matrices (quant_rows_ab's) in one process, interleaved:

- **one stream**: the weight rows stored 4 at a time, block-interleaved (block b of rows 4q .. 4q + 3 side by
  side), so that a task's 4 rows are one sequential stream instead of 4 rows 1-2 KB apart. Same instructions,
  same order, same bits (checked): if the kernel waited on the way it walks memory, this would be faster.
- **no 4-bit lookup**: one stream, and Q4_K's 16-weight chunk is its raw nibble bytes taken as floats instead of
  the 16-entry table lookup (one vpermps) of each chunk and the table's build per sub-block. Wrong values, the
  same loads, loop and FMAs: how fast the loop streams without the decoding instructions.
- **no 4-bit lookup, rows apart**: the same without the one-stream layout (the kernel's rows 1-2 KB apart): whether
  the layout matters once the decoding is gone.

Each variant's figure is the median over trials of its ms and of its paired ratio to the kernel's. Only Q4_K gets
the lookup-free variants (the 1.5B's type); rows up to 4 (the variant takes 4 weight rows a task, as the kernel does
there).
"""

from __future__ import annotations

import argparse
import statistics

import gguf
import numpy as np
import torch

from experiments.quant_rows_ab import MATRICES, op_from_source, time_call
from specdecode.bench.lib import provenance, write_result
from specdecode.models import quant_rows
from tests.models.test_quant_rows import random_blocks

GROUP = 4  # weight rows per task at <= 4 activation rows, and rows per interleaved group

# The task function, reading row g of its group's block b at group + (4 b + g) * kBytes.
ONE_STREAM_ROWS = """template <int64_t T, int G, int R>
void rows_avx(const Args& a, int64_t n0, int64_t m0) {
    constexpr int kW = Layout<T>::kWeights, kB = Layout<T>::kBytes;
    const int64_t nb = a.K / kW;
    const uint8_t* group = a.w + (n0 / 4) * nb * 4 * kB;
    int64_t n[G];
    const uint8_t* w[G];
    for (int g = 0; g < G; ++g) {
        n[g] = std::min(n0 + g, a.N - 1);
        w[g] = group + g * kB;
    }
    __m512 acc[G][R];
    for (int g = 0; g < G; ++g)
        for (int m = 0; m < R; ++m) acc[g][m] = _mm512_setzero_ps();
    Dec<T> dec[G];
    const float* x = a.x + m0 * a.K;
    for (int64_t b = 0; b < nb; ++b) {
        for (int g = 0; g < G; ++g) dec[g].block(w[g], 4 * b, a.fault);
        const char* next = reinterpret_cast<const char*>(group + (nb + b) * 4 * kB);  // the next group's block b
        for (int off = 0; off < 4 * kB; off += 64) _mm_prefetch(next + off, _MM_HINT_T0);
#pragma GCC unroll 16
        for (int j = 0; j < Dec<T>::kSubs; ++j) {
            for (int g = 0; g < G; ++g) dec[g].sub(j, R <= 4);
#pragma GCC unroll 2
            for (int h = 0; h < Dec<T>::kChunks; ++h) {
                const int64_t k = b * kW + kLanes * (j * Dec<T>::kChunks + h);
                __m512 wv[G];
                for (int g = 0; g < G; ++g) wv[g] = dec[g].chunk(j, h);
#pragma GCC unroll 12
                for (int m = 0; m < R; ++m) {
                    const __m512 xm = _mm512_loadu_ps(x + m * a.K + k);
                    for (int g = 0; g < G; ++g) acc[g][m] = _mm512_fmadd_ps(xm, wv[g], acc[g][m]);
                }
            }
        }
    }
    for (int g = 0; g < G; ++g)
        for (int m = 0; m < R; ++m) a.out[(m0 + m) * a.N + n[g]] = reduce(acc[g][m], a.bias ? a.bias[n[g]] : 0.0f);
}

"""
Q4K_CHUNK = (
    "    __m512 chunk(int j, int h) const { return _mm512_permutexvar_ps(j % 2 ? _mm512_srli_epi32(bytes[h], 4) : "
    "bytes[h], table); }"
)
Q4K_RAW_CHUNK = (
    "    __m512 chunk(int j, int h) const { return _mm512_castsi512_ps(j % 2 ? _mm512_srli_epi32(bytes[h], 4) : "
    "bytes[h]); }"
)


def replaced(text: str, old: str, new: str) -> str:
    if old not in text:
        raise SystemExit(f"the kernel's source changed; this experiment no longer finds: {old[:70]!r}")
    return text.replace(old, new)


def variant_source(lookup: bool, one_stream: bool = True) -> str:
    """This tree's kernel with the one-stream task function (where `one_stream`) and, without `lookup`, Q4_K's
    chunks undecoded."""
    text = quant_rows.SOURCE.read_text()
    if one_stream:
        start = text.index("template <int64_t T, int G, int R>\nvoid rows_avx")
        text = text[:start] + ONE_STREAM_ROWS + text[text.index("#pragma GCC pop_options", start) :]
        text = replaced(text, "return rows <= 4 ? 4 : 2;", "return 4;")
    return text if lookup else replaced(text, Q4K_CHUNK, Q4K_RAW_CHUNK)


def variant_op(name: str, text: str) -> torch._ops.OpOverloadPacket:
    return op_from_source(text, f"quant_rows_bound_{name}", f"variant {name}")


def interleaved(blocks: torch.Tensor, qtype) -> torch.Tensor:
    """[out, bytes_per_row] -> the same shape, rows 4 at a time with their blocks side by side (out % 4 == 0)."""
    out, row = blocks.shape
    block_bytes = gguf.GGML_QUANT_SIZES[qtype][1]
    grouped = blocks.reshape(out // GROUP, GROUP, row // block_bytes, block_bytes).transpose(1, 2)
    return grouped.contiguous().reshape(out, row)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,4")
    parser.add_argument("--trials", type=int, default=7)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--out", default="results/quant_rows_bound.json")
    args = parser.parse_args()
    quant_rows.library()
    kernel = torch.ops.specdecode.quant_rows_linear
    variants = {"one stream": variant_op("stream", variant_source(True))}
    variants["no 4-bit lookup"] = variant_op("raw", variant_source(False))
    variants["no 4-bit lookup, rows apart"] = variant_op("raw_apart", variant_source(False, one_stream=False))
    gen = np.random.default_rng(0)
    weights = {m: random_blocks(m[1], m[2], m[3], gen) for m in MATRICES}
    streams = {m: interleaved(weights[m], m[1]) for m in MATRICES}
    cells = []
    for rows in [int(r) for r in args.rows.split(",")]:
        if rows > GROUP:
            raise SystemExit(f"rows up to {GROUP}: the variants take {GROUP} weight rows a task")
        xs = {m: torch.from_numpy(gen.standard_normal((rows, m[3]), dtype=np.float32)) for m in MATRICES}
        arms = {
            m: {"kernel": (kernel, weights[m]), "one stream": (variants["one stream"], streams[m])} for m in MATRICES
        }
        for m in MATRICES:
            if m[1].name == "Q4_K":
                arms[m]["no 4-bit lookup"] = (variants["no 4-bit lookup"], streams[m])
                arms[m]["no 4-bit lookup, rows apart"] = (variants["no 4-bit lookup, rows apart"], weights[m])
            want = kernel(xs[m], weights[m], int(m[1]), m[3], None, 0)
            got = variants["one stream"](xs[m], streams[m], int(m[1]), m[3], None, 0)
            if not torch.equal(want, got):
                raise SystemExit(f"{m[0]} at {rows} rows: the one-stream variant gives different bits")
        times = {(m, name): [] for m in MATRICES for name in arms[m]}
        for _ in range(args.trials):
            for m in MATRICES:
                for name, (op, blocks) in arms[m].items():
                    times[m, name].append(time_call(op, xs[m], blocks, m[1], m[3], args.calls))
        for m in MATRICES:
            mb = weights[m].numel() / 1e6
            base = times[m, "kernel"]
            ms = {name: statistics.median(times[m, name]) * 1e3 for name in arms[m]}
            ratio = {
                name: statistics.median(a / b for a, b in zip(times[m, name], base, strict=True))
                for name in arms[m]
                if name != "kernel"
            }
            cell = {"matrix": m[0], "type": m[1].name, "shape": [m[2], m[3]], "mb": round(mb, 1), "rows": rows}
            cells.append(cell | {"ms": ms, "gb_per_s": {k: mb / v for k, v in ms.items()}, "ratio": ratio})
            line = "  ".join(
                f"{k} {mb / v:4.1f} GB/s" + (f" ({ratio[k]:.2f}x)" if k in ratio else "") for k, v in ms.items()
            )
            print(f"{rows} rows  {m[0]:15s} {m[1].name:5s} {mb:4.0f} MB  {line}", flush=True)
    run = {"threads": torch.get_num_threads(), "cells": cells}
    write_result(args.out, {**provenance("experiments.quant_rows_bound"), **run})


if __name__ == "__main__":
    main()
