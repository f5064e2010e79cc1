"""What the tree search's bar saves: a head drafter with and without it, same prompts, arms in turn.

Usage:
    python -m experiments.tree_bar --prompts ../shared/data/specbench_question.jsonl \
        [--method eagle] [--draft HEAD_DIR] [--k 8] [--output results/tree_bar.json]

The bar (drafters/tree_search.py) stops expanding nodes that score below the budget-th best node found so far:
the kept tree is the same, so each prompt's tokens and target forwards must be too, and the run checks that.
The "uncut" arm restores the search before the bar by lifting it to -inf. One prompt per Spec-Bench category,
greedy, batch 1, the two arms alternating prompt by prompt on one engine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from specdecode import LLM, SamplingParams
from specdecode.bench.lib import provenance, write_result
from specdecode.drafters.tree_search import RowTree


def first_of_each_category(path: str) -> list[str]:
    seen: dict[str, str] = {}
    for line in Path(path).read_text().splitlines():
        q = json.loads(line)
        seen.setdefault(q["category"], q["turns"][0])
    return list(seen.values())


def run(a: argparse.Namespace) -> dict:
    llm = LLM(target=a.target, method=a.method, draft=a.draft, num_speculative_tokens=a.k, controller="fixed")
    params = SamplingParams(temperature=0.0, max_tokens=a.max_tokens)
    cut, uncut = RowTree.bar, lambda self: -float("inf")
    prompts = first_of_each_category(a.prompts)
    llm.chat([{"role": "user", "content": prompts[0]}], params)  # warm-up
    rows = []
    try:
        for p in prompts:
            row = {}
            for arm, bar in (("cut", cut), ("uncut", uncut)):
                RowTree.bar = bar
                t0 = time.perf_counter()
                out = llm.chat([{"role": "user", "content": p}], params)[0]
                seconds = time.perf_counter() - t0
                row[arm] = {
                    "tokens_per_s": len(out.token_ids) / seconds,
                    "forwards": out.metrics["num_target_forwards"],
                    "token_ids": out.token_ids,
                }
            rows.append(row)
    finally:
        RowTree.bar = cut
    same = sum(
        r["cut"]["token_ids"] == r["uncut"]["token_ids"] and r["cut"]["forwards"] == r["uncut"]["forwards"]
        for r in rows
    )
    ratios = [r["cut"]["tokens_per_s"] / r["uncut"]["tokens_per_s"] for r in rows]
    return {
        **provenance(__spec__.name),
        "method": a.method,
        "draft": a.draft,
        "k": a.k,
        "prompts": len(rows),
        "same_tokens_and_forwards": same,
        "median_tokens_per_s": {
            arm: statistics.median(r[arm]["tokens_per_s"] for r in rows) for arm in ("cut", "uncut")
        },
        "median_ratio_cut_over_uncut": statistics.median(ratios),
        "per_prompt": [{arm: {k: v for k, v in r[arm].items() if k != "token_ids"} for arm in r} for r in rows],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="smollm2-135m-instruct")
    p.add_argument("--prompts", required=True)
    p.add_argument("--method", default="eagle", choices=("eagle", "medusa", "mtp"))
    p.add_argument("--draft", default=None, help="head directory (default: the shipped heads)")
    p.add_argument("--k", type=int, default=8, help="tree budget (nodes)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--output", default="results/tree_bar.json")
    a = p.parse_args()
    result = run(a)
    out = write_result(a.output, result)
    m = result["median_tokens_per_s"]
    print(
        f"{a.method} K={a.k}: {m['cut']:.1f} tok/s with the bar, {m['uncut']:.1f} without "
        f"(median ratio {result['median_ratio_cut_over_uncut']:.2f}x); same tokens and forwards on "
        f"{result['same_tokens_and_forwards']} of {result['prompts']} prompts; wrote {out}"
    )


if __name__ == "__main__":
    main()
