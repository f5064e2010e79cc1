"""What `goodput` costs in Python inside the engine: its calls timed during a real `bench long-context` run.

    python -m experiments.goodput_in_engine --out results/goodput_in_engine.json -- \\
        --contexts 2048 --batches 1 --max-tokens 64 --repeats 3 --arms none,fixed:1,goodput \\
        --prompts ../shared/data/specbench_question.jsonl

Everything after `--` is `specdecode bench long-context`'s arguments (its own --output goes to a scratch file
unless given). `GoodputController.choose`, `truncate` and `observe` are wrapped with timers, and so is each arm's
timed decode. Reported per arm run (in the order run): ms a step, and goodput's calls in ms a step; over the whole
run, microseconds a call of each. `experiments.goodput_overhead` times the same calls on a synthetic batch; here the
forward between them has left their code and data cold, as a user's engine does. To time an older tree, run this
file with PYTHONPATH set to that tree's checkout.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from specdecode.bench import long_context
from specdecode.bench.lib import provenance, write_result
from specdecode.cli import main as cli_main
from specdecode.control.goodput import GoodputController

CALLS = ("choose", "truncate", "observe")


class Timers:
    """Seconds and calls of each wrapped goodput method, and one record per timed arm run."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.runs: list[dict] = []

    def wrap(self, name: str) -> None:
        method = getattr(GoodputController, name)

        def timed(ctrl, *args, **kwargs):
            t0 = time.perf_counter()
            try:
                return method(ctrl, *args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - t0
                self.calls[name] += 1

        setattr(GoodputController, name, timed)

    def wrap_decode(self) -> None:
        decode = long_context.decode

        def timed(engine, seqs, tokens):
            before = sum(self.seconds.values())
            run = decode(engine, seqs, tokens)
            steps = max(len(run.k_chosen), 1)
            inner = getattr(engine.controller, "inner", engine.controller)
            self.runs.append(
                {
                    "controller": type(inner).__name__,
                    "ms_per_step": 1e3 * run.seconds / steps,
                    "goodput_ms_per_step": 1e3 * (sum(self.seconds.values()) - before) / steps,
                    "steps": steps,
                }
            )
            return run

        long_context.decode = timed


def summary(timers: Timers) -> dict:
    by_arm: dict[str, list[float]] = defaultdict(list)
    for run in timers.runs:
        by_arm[run["controller"]].append(run["ms_per_step"])
    return {
        "us_per_call": {c: 1e6 * timers.seconds[c] / max(timers.calls[c], 1) for c in CALLS},
        "median_ms_per_step": {arm: float(np.median(v)) for arm, v in by_arm.items()},
        "goodput_ms_per_step": float(
            np.median([r["goodput_ms_per_step"] for r in timers.runs if r["controller"] == "GoodputController"] or [0])
        ),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/goodput_in_engine.json")
    ap.add_argument("bench", nargs=argparse.REMAINDER, help="-- then bench long-context's arguments")
    a = ap.parse_args()
    bench = [x for x in a.bench if x != "--"]
    timers = Timers()
    for call in CALLS:
        timers.wrap(call)
    timers.wrap_decode()
    with tempfile.TemporaryDirectory() as scratch:
        if "--output" not in bench:
            bench += ["--output", str(Path(scratch) / "long_context.json")]
        cli_main(["bench", "long-context", *bench])
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    out = {**provenance(module="experiments.goodput_in_engine"), "git": rev, **summary(timers), "runs": timers.runs}
    for arm, ms in out["median_ms_per_step"].items():
        print(f"{arm}: {ms:.2f} ms a step (median over its runs)")
    print(
        f"goodput's calls: {out['goodput_ms_per_step']:.3f} ms a step; "
        + ", ".join(f"{c} {us:.0f} us" for c, us in out["us_per_call"].items())
        + " a call"
    )
    print(f"wrote {write_result(a.out, out)}")


if __name__ == "__main__":
    main()
