"""A model's step under this tree against the same step under another git revision, the two in turns.

    python -m experiments.step_ab --baseline REV [--turns 2] [--out results/step_ab.json] -- COST-ARGS...

The baseline's tree is checked out into a temporary git worktree; `specdecode bench cost COST-ARGS` then runs under
each tree in turn, `--turns` times, each in a process of its own that imports its tree's package, so that its kernels
are built from that tree's sources. Which tree goes first alternates from turn to turn, so that a drift of the
machine's speed over a run favours neither: with the baseline always first, the huge-pages change read 0.78x at one
fast token (three turns), and alternating turns read 0.91x (results/step_ab_huge_pages_zen4.json); an A/A run of
the fixed order (2026-12-07) scattered 0.96-1.13x. The figure per cell (batch x tokens @
context, compiled and eager): the median over turns of each tree's ms and of their paired ratio (this tree /
baseline). The kernel A/B experiments (quant_rows_ab, int8_ab) time one linear; this times the whole step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from specdecode.bench.lib import provenance, turn_order, write_result

RUN = "import sys; from specdecode.cli import main; sys.argv = ['specdecode', *sys.argv[1:]]; sys.exit(main())"


def cost_ms(tree: Path, args: list[str], out: Path) -> dict[str, dict[str, float]]:
    """`specdecode bench cost ARGS` with the package of `tree`: its ms by kind (compiled, eager) and cell."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = out.resolve()
    command = [sys.executable, "-c", RUN, "bench", "cost", *args, "--json", "--output", str(out)]
    # run in the tree: `python -c` puts the working directory ahead of PYTHONPATH on sys.path
    subprocess.run(command, cwd=tree, env=env, check=True, capture_output=True, text=True)
    return json.loads(out.read_text())["ms"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="a git revision of this repository")
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--out", default="results/step_ab.json")
    parser.add_argument("cost_args", nargs=argparse.REMAINDER, help="after --: the arguments of `bench cost`")
    args = parser.parse_args()
    cost_args = [a for a in args.cost_args if a != "--"]
    here = Path.cwd()
    turns: list[dict[str, dict[str, dict[str, float]]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "baseline"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(base), args.baseline], check=True)
        try:
            for turn in range(args.turns):
                order = turn_order([("baseline", base), ("this tree", here)], turn)
                ms = {name: cost_ms(tree, cost_args, Path(tmp) / f"{name}.json") for name, tree in order}
                turns.append(ms)
                print(f"turn {turn + 1}: " + json.dumps(ms), flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], check=True)
    cells = {}
    for kind in turns[0]["this tree"]:
        for cell in turns[0]["this tree"][kind]:
            new = [t["this tree"][kind][cell] for t in turns]
            old = [t["baseline"][kind][cell] for t in turns]
            row = cells[f"{kind} {cell}"] = {
                "baseline_ms": statistics.median(old),
                "this_tree_ms": statistics.median(new),
                "ratio": statistics.median(a / b for a, b in zip(new, old, strict=True)),
            }
            print(
                f"{kind:9s} {cell:10s} baseline {row['baseline_ms']:7.1f} ms  this tree {row['this_tree_ms']:7.1f} ms  "
                f"ratio {row['ratio']:.3f}"
            )
    run = {"baseline": args.baseline, "cost_args": cost_args, "cells": cells, "turns": turns}
    write_result(args.out, {**provenance("experiments.step_ab"), **run})


if __name__ == "__main__":
    main()
