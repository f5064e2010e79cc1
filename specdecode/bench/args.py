"""Command-line arguments of `specdecode bench`."""

from __future__ import annotations

import argparse


def add_bench_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompts", required=True, help="Spec-Bench question.jsonl (or any jsonl with 'prompt')")
    p.add_argument("--per-category", type=int, default=3, help="prompts per category (0 = all)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument(
        "--peers",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time transformers generate() and its speculative mode",
    )
    p.add_argument("--warmup", type=int, default=1, help="untimed prompts per arm first")
    p.add_argument("--chat", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--json", action="store_true", help="write results JSON (and a Markdown table)")
    p.add_argument("--output", default="results/bench.json", help="where --json writes")
