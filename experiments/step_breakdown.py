"""Where each arm's engine step goes during a real `bench long-context` run: drafting, verifying, the rest, goodput.

    python -m experiments.step_breakdown --out results/step_breakdown.json -- \\
        --contexts 256 --batches 1 --max-tokens 64 --repeats 3 --texts 2 --arms none,fixed:2,goodput \\
        --prompts ../shared/data/specbench_question.jsonl

Everything after `--` is `specdecode bench long-context`'s arguments (its own --output goes to a scratch file unless
given). Each timed step of each arm is recorded from the engine's own split (`StepStats`: propose_time_s, from
before the controller's `choose` to after its `truncate`, and verify_time_s, the target's forward and acceptance),
the step's wall time around `Engine.step` (the rest: committing, the controller's `observe`), the seconds inside
`GoodputController.choose`, `truncate` and `observe` (timers around them), and the drafts verified. Reported per
arm: the mean of each over its steps, and the verify time by the drafts verified. Where two arms verify the same
drafts, the difference of their steps is what one spends around the forward that the other does not.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from specdecode.bench import long_context
from specdecode.bench.lib import provenance, write_result
from specdecode.cli import main as cli_main
from specdecode.control.goodput import GoodputController

CALLS = ("choose", "truncate", "observe")
FIELDS = ("step_ms", "propose_ms", "verify_ms", "rest_ms", "goodput_ms", "drafts_verified")


class Recorder:
    """Per arm: one row of FIELDS per timed step. `patched` puts its timers into goodput and the bench's decode
    loop, and takes them out again."""

    def __init__(self) -> None:
        self.rows: dict[str, list[tuple[float, ...]]] = defaultdict(list)
        self.arm = ""
        self.goodput_s = 0.0  # seconds inside goodput's calls since the step began

    def timed_call(self, method):
        def timed(ctrl, *args, **kwargs):
            t0 = time.perf_counter()
            try:
                return method(ctrl, *args, **kwargs)
            finally:
                self.goodput_s += time.perf_counter() - t0

        return timed

    def arm_set(self, set_arm):
        def arm_set(engine, arm, base=None):
            self.arm = arm.name
            return set_arm(engine, arm, base)

        return arm_set

    def decoded(self, decode):
        def decoded(engine, seqs, tokens):
            step = engine.step

            def timed_step():
                self.goodput_s = 0.0
                t0 = time.perf_counter()
                out = step()
                seconds = time.perf_counter() - t0
                last = engine.last_step
                rest = seconds - last.propose_time_s - last.verify_time_s
                ms = [1e3 * x for x in (seconds, last.propose_time_s, last.verify_time_s, rest, self.goodput_s)]
                self.rows[self.arm].append((*ms, float(sum(last.num_proposed))))
                return out

            engine.step = timed_step
            try:
                return decode(engine, seqs, tokens)
            finally:
                del engine.step

        return decoded

    @contextmanager
    def patched(self, time_goodput: bool = True):
        saved = {name: getattr(GoodputController, name) for name in CALLS}
        set_arm, decode = long_context.set_arm, long_context.decode
        try:
            if time_goodput:
                for name, method in saved.items():
                    setattr(GoodputController, name, self.timed_call(method))
            long_context.set_arm, long_context.decode = self.arm_set(set_arm), self.decoded(decode)
            yield self
        finally:
            for name, method in saved.items():
                setattr(GoodputController, name, method)
            long_context.set_arm, long_context.decode = set_arm, decode


def summary(rows: list[tuple[float, ...]]) -> dict:
    """Means over an arm's steps, and its verify time by the drafts verified (median, steps)."""
    table = np.array(rows)  # [steps, len(FIELDS)]
    out = {"steps": len(rows), **{f: float(table[:, i].mean()) for i, f in enumerate(FIELDS)}}
    drafts = table[:, FIELDS.index("drafts_verified")].astype(int)
    verify = table[:, FIELDS.index("verify_ms")]
    out["verify_ms_by_drafts"] = {
        int(n): {"median": float(np.median(verify[drafts == n])), "steps": int((drafts == n).sum())}
        for n in np.unique(drafts)
    }
    return out


def run(out: str, bench: list[str], time_goodput: bool = True) -> dict:
    """Run `bench long-context` with `bench`'s arguments under the timers; the per-arm summaries, written to `out`.
    time_goodput=False leaves goodput's calls untimed (the tests' fault)."""
    recorder = Recorder()
    with tempfile.TemporaryDirectory() as scratch, recorder.patched(time_goodput):
        if "--output" not in bench:
            bench = [*bench, "--output", str(Path(scratch) / "long_context.json")]
        cli_main(["bench", "long-context", *bench])
    arms = {arm: summary(rows) for arm, rows in recorder.rows.items()}
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    result = {**provenance(module="experiments.step_breakdown"), "git": rev, "bench": bench, "arms": arms}
    print(f"{'arm':10s} {'steps':>6s} " + " ".join(f"{f:>15s}" for f in FIELDS))
    for arm, summ in arms.items():
        print(f"{arm:10s} {summ['steps']:6d} " + " ".join(f"{summ[f]:15.3f}" for f in FIELDS))
    print(f"wrote {write_result(out, result)}")
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/step_breakdown.json")
    ap.add_argument("bench", nargs=argparse.REMAINDER, help="-- then bench long-context's arguments")
    a = ap.parse_args()
    run(a.out, [x for x in a.bench if x != "--"])


if __name__ == "__main__":
    main()
