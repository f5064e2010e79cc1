"""What a prompt chunk of m tokens costs the target after c cached tokens: the prices engine/prefill_price.py uses.

    python -m experiments.chunk_cost --target qwen2.5-coder-1.5b-instruct --arithmetic fast \\
        --contexts 0,2048,4096,8192,16384 --output results/chunk_cost_pair_fast.json
    python -m experiments.chunk_cost --target smollm2-135m-instruct --arithmetic exact \\
        --contexts 0,2048,6000 --output results/chunk_cost_smollm2_exact.json

One row at batch 1, the target alone (`forward_ragged`, as the engine's prefill runs it), the median of three
forwards of chunks of 1, 4, 16, 32 and 64 tokens at each context (any token ids: the cost does not depend on them).
Reported per context: ms a chunk, ms a token of the 32-token chunk, and that token's price against one at context 0,
beside the price `prefill_price.token_price` gives it.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from specdecode import LLM
from specdecode.bench.lib import provenance, write_result
from specdecode.engine.prefill_price import context_unit, has_int8_linears, token_price
from specdecode.step.runner import forward_ragged, prefill

CHUNKS = (1, 4, 16, 32, 64)


def chunk_ms(model, cache, ids: list[int], context: int, m: int, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        cache.set_length(0, context)
        t0 = time.perf_counter()
        forward_ragged(model, cache, [0], [ids[context : context + m]], last_only=True)
        times.append(time.perf_counter() - t0)
    cache.set_length(0, context)
    return float(np.median(times)) * 1e3


@torch.inference_mode()
def run(target: str, arithmetic: str, contexts: list[int]) -> dict:
    llm = LLM(target=target, method="none", arithmetic=arithmetic, max_num_seqs=1, max_model_len=max(contexts) + 128)
    model = llm.target
    cache = model.new_cache(1, max(contexts) + 128)
    ids = [(7 * i) % 5000 + 100 for i in range(max(contexts) + max(CHUNKS))]
    unit = context_unit(model.cfg, has_int8_linears(model))
    rows, cached = [], 0
    for c in contexts:
        if c > cached:
            prefill(model, cache, 0, ids[cached:c], chunk=512)
            cached = c
        ms = {m: chunk_ms(model, cache, ids, c, m) for m in CHUNKS}
        rows.append({"context": c, "chunk_ms": ms, "ms_a_token_of_32": ms[32] / 32, "priced": token_price(c, unit)})
        print(f"context {c:6d}: " + "  ".join(f"{m}: {v:7.1f} ms" for m, v in ms.items()), flush=True)
    for row in rows:
        row["measured_price"] = row["ms_a_token_of_32"] / rows[0]["ms_a_token_of_32"]
    meta = provenance("experiments.chunk_cost", model)
    return {**meta, "target": target, "arithmetic": arithmetic, "context_unit": unit, "rows": rows}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    p.add_argument("--arithmetic", default="fast", choices=("exact", "fast"))
    p.add_argument("--contexts", default="0,2048,4096,8192,16384")
    p.add_argument("--output", default="results/chunk_cost.json")
    a = p.parse_args()
    result = run(a.target, a.arithmetic, [int(x) for x in a.contexts.split(",")])
    for row in result["rows"]:
        c, measured, priced = row["context"], row["measured_price"], row["priced"]
        print(f"context {c:6d}: a token {measured:.2f}x one at 0, priced {priced:.2f}x")
    print(f"wrote {write_result(a.output, result)}")


if __name__ == "__main__":
    main()
