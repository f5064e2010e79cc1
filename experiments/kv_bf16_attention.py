"""The few-queries attention op over an fp32 cache and a bf16 one, at the pair's shapes and long contexts.

    python -m experiments.kv_bf16_attention [--contexts 2048,8192,16384] [--tokens 1,2,5] [--repeats 7]
        [--out results/kv_bf16_attention.json]

One step's attention, every layer: the Qwen2.5-Coder 1.5B's (28 layers, 12 query heads over 2 key heads of 128) and
the 0.5B's (24 layers, 14 over 2 of 64), one row of T new tokens after `context` cached ones, random values (the
op's time does not depend on them). Three arms, interleaved in each repeat: the fp32 cache (the exact arithmetic's),
the bf16 cache with `vdpbf16ps` (the fast arithmetic's where the CPU has AVX512_BF16), and the bf16 cache with the
values widened to fp32 (its path elsewhere). Medians of the repeats, in ms.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from tqdm import tqdm

from specdecode.bench.lib import provenance, write_result
from specdecode.models import few_rows
from specdecode.models.llama import AttentionMetadata

SHAPES = {"qwen2.5-coder-1.5b": (28, 12, 2, 128), "qwen2.5-coder-0.5b": (24, 14, 2, 64)}  # layers, H, G, D
ARMS = ("fp32", "bf16-dot", "bf16-widen")


def step_inputs(shape: tuple[int, int, int, int], context: int, t: int, dtype: torch.dtype) -> tuple:
    """The op's arguments for every layer of one step: q, k, v [1, T, heads, D], the caches, slots, write_pos, mask."""
    layers, heads, kv_heads, dim = shape
    cache_k = torch.randn(layers, 1, kv_heads, context + t + 1, dim).to(dtype)
    cache_v = torch.randn(layers, 1, kv_heads, context + t + 1, dim).to(dtype)
    q, k, v = torch.randn(1, t, heads, dim), torch.randn(1, t, kv_heads, dim), torch.randn(1, t, kv_heads, dim)
    meta = AttentionMetadata.build([0], [context], t, "cpu")  # as the engine describes one row's step
    return q, k, v, cache_k, cache_v, meta.slots, meta.write_pos, meta.additive_mask(t, torch.float32)


def time_step(args: tuple, layers: int) -> float:
    q, k, v, cache_k, cache_v, slots, write_pos, mask = args
    t0 = time.perf_counter()
    for layer in range(layers):
        torch.ops.specdecode.few_queries_attend(q, k, v, cache_k, cache_v, layer, slots, write_pos, mask)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", default="2048,8192,16384")
    parser.add_argument("--tokens", default="1,2,5")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", default="results/kv_bf16_attention.json")
    a = parser.parse_args()
    few_rows.require()
    has_dot = torch.ops.specdecode.set_bf16_dot(True)
    cells = [(m, n, t) for m in SHAPES for n in map(int, a.contexts.split(",")) for t in map(int, a.tokens.split(","))]
    rows = []
    for model, n, t in tqdm(cells, desc="attention", unit="cell"):
        shape = SHAPES[model]
        inputs = {"fp32": step_inputs(shape, n, t, torch.float32), "bf16": step_inputs(shape, n, t, torch.bfloat16)}
        times: dict[str, list[float]] = {arm: [] for arm in ARMS}
        for r in range(a.repeats + 1):
            for arm in ARMS:
                torch.ops.specdecode.set_bf16_dot(arm == "bf16-dot")
                seconds = time_step(inputs["fp32" if arm == "fp32" else "bf16"], shape[0])
                if r:  # the first round warms up
                    times[arm].append(seconds)
        ms = {arm: round(statistics.median(v) * 1e3, 2) for arm, v in times.items()}
        ratio = round(ms["bf16-dot"] / ms["fp32"], 3)
        rows.append({"model": model, "context": n, "tokens": t, "ms": ms, "bf16_dot_vs_fp32": ratio})
        tqdm.write(f"{model} context {n} T={t}: " + "  ".join(f"{arm} {v:.1f}" for arm, v in ms.items()))
    torch.ops.specdecode.set_bf16_dot(True)
    out = write_result(a.out, {**provenance("experiments.kv_bf16_attention"), "avx512_bf16": has_dot, "rows": rows})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
