"""n samples of one prompt: the prefill is paid once. Counts the prompt tokens the target ran and times both ways.

Usage:
    python -m experiments.samples [--target smollm2-135m-instruct] [--n 4] [--prompts 8] [--max-tokens 32]
        [--output results/samples.json]

Each prompt is asked once with n = N and once as N separate requests (seeds s .. s + N - 1, which give the same
samples: specdecode/engine/engine.py), arms alternating prompt by prompt. The prompts are long (a few hundred
tokens) so that the prefill is a visible share of the work. Prints a table, writes JSON.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from datetime import date

from rich.console import Console
from rich.table import Table

from specdecode import LLM, SamplingParams
from specdecode.bench.lib import write_result
from specdecode.hardware import cpu_model

PASSAGE = (
    "The lighthouse stood on the northern cape for two hundred years. Its keepers logged every ship, every storm "
    "and every failure of the lamp, and their notebooks became the town's only history. "
)


def prompts(count: int) -> list[str]:
    return [f"{PASSAGE * (6 + i)}\nQuestion {i}: summarise the passage in one sentence." for i in range(count)]


def run(llm: LLM, text: str, params: SamplingParams, together: bool) -> dict:
    engine = llm.engine
    before = engine.num_prefill_tokens
    t0 = time.perf_counter()
    if together:
        outs = llm.generate([text], params)[0].outputs
    else:
        one = replace(params, n=1)
        outs = llm.generate([text] * params.n, [replace(one, seed=one.seed + i) for i in range(params.n)])
    return {
        "seconds": time.perf_counter() - t0,
        "prefill_tokens": engine.num_prefill_tokens - before,
        "samples": [o.token_ids for o in outs],
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="smollm2-135m-instruct")
    p.add_argument("--method", default="ngram")
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--output", default="results/samples.json")
    a = p.parse_args(argv)
    llm = LLM(target=a.target, method=a.method, max_num_seqs=a.n, enforce_eager=a.enforce_eager)
    params = SamplingParams(temperature=1.0, max_tokens=a.max_tokens, seed=7, n=a.n, ignore_eos=True)
    llm.generate(["warm-up"], replace(params, max_tokens=4))
    arms: dict[str, list[dict]] = {"n = N": [], "N requests": []}
    same = 0
    for text in prompts(a.prompts):
        together, apart = run(llm, text, params, True), run(llm, text, params, False)
        arms["n = N"].append(together)
        arms["N requests"].append(apart)
        same += together["samples"] == apart["samples"]
    rows = {
        name: {
            "prefill_tokens": sum(r["prefill_tokens"] for r in runs),
            "seconds": sum(r["seconds"] for r in runs),
        }
        for name, runs in arms.items()
    }
    table = Table(title=f"{a.prompts} prompts x n = {a.n}, {a.max_tokens} tokens per sample")
    for col in ("arm", "prompt tokens prefilled", "seconds"):
        table.add_column(col)
    for name, r in rows.items():
        table.add_row(name.replace("N", str(a.n)), str(r["prefill_tokens"]), f"{r['seconds']:.2f}")
    Console().print(table)
    print(f"samples identical both ways: {same}/{a.prompts} prompts")
    out = {
        "command": "python -m experiments.samples " + " ".join(sys.argv[1:]),
        "machine": f"{cpu_model()} ({os.cpu_count()} cores)",
        "date": date.today().isoformat(),
        "arms": rows,
        "identical_samples": f"{same}/{a.prompts}",
        "prefill_ratio": rows["N requests"]["prefill_tokens"] / max(rows["n = N"]["prefill_tokens"], 1),
    }
    write_result(a.output, out)


if __name__ == "__main__":
    main()
