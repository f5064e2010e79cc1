"""Prompt chunks in the verify forward (EngineConfig.fused_prefill) against a forward of their own, in one process.

    python -m experiments.fused_prefill --target smollm2-135m-instruct [--prompts short|code] [--requests 64]
        [--max-tokens 32] [--slots 16] [--repeats 3] [--out results/fused_prefill_smollm2.json]

Chat requests (`short`: bench long-prompt's eight short questions, ~30 tokens with the template; `code`: the code
set's dev prompts, ~120; cycled) run through the engine loop in two arrival patterns: all at once,
and one arriving per engine step (as a server sees clients that keep coming), so that nearly every step has
requests decoding beside a prompt being prefilled. Two engines share one loaded target and differ only in
fused_prefill; each repeat runs both, their order alternating. Reported per arm and pattern: the median over
repeats of the wall time, steps and target forwards, and whether the two engines' tokens were the same (greedy:
they must be). Plain decoding (method none), so only the forwards differ.
"""

from __future__ import annotations

import argparse
import statistics
import time

from tqdm import tqdm

from specdecode.bench.code_prompts import load_prompts
from specdecode.bench.lib import provenance, write_result
from specdecode.bench.long_prompt import SHORT_PROMPTS
from specdecode.config import SamplingParams
from specdecode.llm import LLM

PATTERNS = ("together", "one a step")


def counted_forwards(llm: LLM) -> list[int]:
    """A one-element counter of the target's forwards (the engine's own: verify, prefill)."""
    count = [0]
    target = llm.engine.target
    forward = target.forward

    def counting(*args, **kwargs):
        count[0] += 1
        return forward(*args, **kwargs)

    target.forward = counting
    return count


def run(llm: LLM, prompts: list[list[int]], params: SamplingParams, pattern: str, tag: str) -> dict:
    """All requests through the engine loop in `pattern`; seconds, steps, target forwards and the tokens."""
    engine, count = llm.engine, llm.forwards
    pending = list(range(len(prompts)))
    seqs, steps, before = [], 0, count[0]
    start = time.perf_counter()
    while pending or engine.has_work():
        arriving = pending if pattern == "together" else pending[:1]
        for i in arriving:
            seqs.append(engine.add_request(f"{tag}-{i}", prompts[i], params))
        pending = pending[len(arriving) :]
        engine.step()
        steps += 1
    return {
        "seconds": time.perf_counter() - start,
        "steps": steps,
        "forwards": count[0] - before,
        "tokens": [s.output_ids for s in seqs],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--arithmetic", default=None)
    parser.add_argument("--prompts", choices=("short", "code"), default="short")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="results/fused_prefill_smollm2.json")
    args = parser.parse_args()

    common = dict(target=args.target, method="none", max_num_seqs=args.slots, max_model_len=2048)
    fused = LLM(**common, arithmetic=args.arithmetic, fused_prefill=True)
    separate = LLM(**common, arithmetic=args.arithmetic, fused_prefill=False, share_target=fused)
    arms = {"fused": fused, "separate": separate}
    texts = SHORT_PROMPTS if args.prompts == "short" else [p.text for p in load_prompts("code", "dev")]
    prompts = [
        fused.encode(fused.apply_chat_template([{"role": "user", "content": texts[i % len(texts)]}]))
        for i in range(args.requests)
    ]
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    for name, llm in arms.items():
        llm.forwards = counted_forwards(llm)
        run(llm, prompts[:4], params, "together", f"warm-{name}")  # first calls out of the timed runs

    samples = {(arm, p): [] for arm in arms for p in PATTERNS}
    with tqdm(total=args.repeats * len(arms) * len(PATTERNS), desc="fused prefill") as bar:
        for r in range(args.repeats):
            order = list(arms) if r % 2 == 0 else list(arms)[::-1]
            for pattern in PATTERNS:
                for arm in order:
                    samples[arm, pattern].append(run(arms[arm], prompts, params, pattern, f"{arm}-{r}"))
                    bar.update()

    cells = []
    for pattern in PATTERNS:
        row = {"pattern": pattern}
        for arm in arms:
            runs = samples[arm, pattern]
            row[arm] = {k: statistics.median(x[k] for x in runs) for k in ("seconds", "steps", "forwards")}
        pairs = zip(samples["fused", pattern], samples["separate", pattern], strict=True)
        row["same_tokens"] = all(f["tokens"] == s["tokens"] for f, s in pairs)
        row["speedup"] = row["separate"]["seconds"] / row["fused"]["seconds"]
        cells.append(row)
        print(
            f"{pattern:>10}: fused {row['fused']['seconds']:.2f} s ({row['fused']['forwards']:.0f} forwards), "
            f"separate {row['separate']['seconds']:.2f} s ({row['separate']['forwards']:.0f}): "
            f"{row['speedup']:.2f}x, same tokens {row['same_tokens']}"
        )
    mean = sum(map(len, prompts)) / len(prompts)
    meta = {
        "prompts": args.prompts,
        "mean_prompt_tokens": mean,
        "requests": args.requests,
        "max_tokens": args.max_tokens,
        "slots": args.slots,
        "repeats": args.repeats,
    }
    payload = {**provenance("experiments.fused_prefill", fused.target), **meta, "cells": cells}
    print(f"wrote {write_result(args.out, payload)}")


if __name__ == "__main__":
    main()
