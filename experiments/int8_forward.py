"""Milliseconds of one eager forward of T new tokens, exact against int8 (models/quant_int8.py), same model.

    flock /tmp/specdecode-bench.lock python -m experiments.int8_forward [--model qwen2.5-coder-1.5b-instruct]

The eager quantized model (models/gguf_quantized.load_gguf_quantized) after a 256-token prefill; each forward of T
tokens (T = 1, 2, 5, 9) is timed `repeats` times at the same cache position, best kept; then its linears are
swapped to int8 and the same is timed again. --cpu-time: process CPU time (use with OMP_NUM_THREADS=1 on a shared
machine).
"""

from __future__ import annotations

import argparse
import time

import torch

from specdecode.models import quant_int8
from specdecode.models.gguf_quantized import gguf_file, load_gguf_quantized
from specdecode.models.llama import AttentionMetadata, LlamaModel

CONTEXT, TOKENS = 256, (1, 2, 5, 9)


@torch.inference_mode()
def forward_ms(model: LlamaModel, repeats: int, clock) -> dict[int, float]:
    cache = model.new_cache(1, CONTEXT + max(TOKENS) + 1)
    prompt = torch.randint(0, 1000, (1, CONTEXT))
    model(prompt, AttentionMetadata.build([0], [0], CONTEXT, "cpu"), cache, logits_index=torch.tensor([[CONTEXT - 1]]))
    out = {}
    for t in TOKENS:
        tokens, meta = torch.randint(0, 1000, (1, t)), AttentionMetadata.build([0], [CONTEXT], t, "cpu")
        times = []
        for _ in range(repeats):
            start = clock()
            model(tokens, meta, cache)  # logits at every position, as a verify step needs
            times.append(clock() - start)
        out[t] = 1000 * min(times)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cpu-time", action="store_true")
    args = parser.parse_args()
    clock = time.process_time if args.cpu_time else time.perf_counter
    model = load_gguf_quantized(gguf_file(args.model))
    exact = forward_ms(model, args.repeats, clock)
    quant_int8.use_int8(model)
    fast = forward_ms(model, args.repeats, clock)
    print(
        f"{args.model}, torch threads {torch.get_num_threads()}, {'CPU' if args.cpu_time else 'wall'} time, "
        f"context {CONTEXT}"
    )
    print(f"{'tokens':>6} {'exact ms':>9} {'int8 ms':>8} {'speedup':>7}")
    for t in TOKENS:
        print(f"{t:>6} {exact[t]:9.1f} {fast[t]:8.1f} {exact[t] / fast[t]:6.2f}x")


if __name__ == "__main__":
    main()
