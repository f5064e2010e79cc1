"""What the engine spends outside the model's forward on each step: SmolLM2 at batch 1, where a step is ~4 ms.

    python -m experiments.engine_overhead [--repeats 3] [--output results/engine_overhead.json]

Per arm (K = 0 in the fast and exact arithmetics, n-gram K = 5 fixed in fast), the 6 first dev code prompts (never
the evaluation prompts), one at a time, 128 greedy tokens each, on the compiled step: the wall time of the requests
and the time inside the step's body and head calls (timers around the two callables the engine calls), per target
forward. "other" is the rest: scheduling, sampling tensors, drafting, verification, commit, detokenization, and
whatever wraps the compiled package's call. The arms take turns within each repeat; medians over the repeats.
Then, in one more run of each arm, the time per forward inside each named stage of the engine's step (timers around
them; the verification functions `quarantine` and `verify`, the drafter's `propose`, commit's `_append`, ...), to
say where "other" goes.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections import defaultdict

from specdecode import LLM, SamplingParams
from specdecode.bench.code_prompts import load_prompts
from specdecode.bench.lib import provenance, write_result
from specdecode.engine import engine as engine_module

ARMS = (("fast", "none"), ("exact", "none"), ("fast", "ngram"))
PARAMS = SamplingParams(temperature=0.0, max_tokens=128, ignore_eos=True)


class ForwardTimer:
    """Seconds spent in the wrapped step callables."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def wrap(self, fn):
        def timed(*args):
            t0 = time.perf_counter()
            out = fn(*args)
            self.seconds += time.perf_counter() - t0
            return out

        return timed


def load(arithmetic: str, method: str) -> tuple[LLM, ForwardTimer]:
    extra = {"num_speculative_tokens": 5, "controller": "fixed"} if method != "none" else {}
    llm = LLM(target="smollm2-135m-instruct", arithmetic=arithmetic, method=method, max_num_seqs=1, **extra)
    model, timer = llm.engine.target, ForwardTimer()
    model.step = dataclasses.replace(model.step, body=timer.wrap(model.step.body), head=timer.wrap(model.step.head))
    return llm, timer


def one_run(llm: LLM, timer: ForwardTimer, texts: list[str]) -> dict[str, float]:
    """ms per target forward: wall, inside the model, other."""
    timer.seconds = 0.0
    t0 = time.perf_counter()
    outs = [llm.generate([t], PARAMS)[0] for t in texts]
    wall = time.perf_counter() - t0
    forwards = sum(o.metrics["num_target_forwards"] for o in outs)
    return {
        "wall_ms": wall / forwards * 1e3,
        "model_ms": timer.seconds / forwards * 1e3,
        "other_ms": (wall - timer.seconds) / forwards * 1e3,
    }


STAGES = ("_prefill_chunks", "_append", "_after_commit", "_riding_chunks", "_retire_finished", "_admit")


def stage_times(llm: LLM, texts: list[str]) -> dict[str, float]:
    """us per target forward inside each named stage of the step (one run, the stages wrapped, then unwrapped)."""
    seconds: dict[str, float] = defaultdict(float)
    engine, undo = llm.engine, []

    def wrap(owner, name: str, label: str) -> None:
        fn = getattr(owner, name)

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            seconds[label] += time.perf_counter() - t0
            return out

        setattr(owner, name, timed)
        undo.append((owner, name, fn))

    for name in ("sampling_tensors", "quarantine", "verify"):
        wrap(engine_module, name, name)
    for name in STAGES:
        wrap(engine, name, name)
    for owner, name in ((engine.controller, "choose"), (engine.controller, "truncate"), (engine.controller, "observe")):
        wrap(owner, name, f"controller.{name}")
    wrap(engine.drafter, "propose", "drafter.propose")
    outs = [llm.generate([t], PARAMS)[0] for t in texts]
    for owner, name, fn in undo:
        if owner is engine_module:
            setattr(owner, name, fn)
        else:
            delattr(owner, name)  # the instance attribute: the class's method again
    forwards = sum(o.metrics["num_target_forwards"] for o in outs)
    return {k: v / forwards * 1e6 for k, v in sorted(seconds.items(), key=lambda kv: -kv[1])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--output", default="results/engine_overhead.json")
    a = ap.parse_args()
    loaded = {arm: load(*arm) for arm in ARMS}
    first = next(iter(loaded.values()))[0]
    texts = [first.apply_chat_template([{"role": "user", "content": p.text}]) for p in load_prompts("code", "dev")[:6]]
    for llm, _ in loaded.values():
        llm.generate(texts[:1], PARAMS)  # warm
    runs: dict[tuple[str, str], list[dict[str, float]]] = {arm: [] for arm in ARMS}
    for rep in range(a.repeats):
        for arm in ARMS if rep % 2 == 0 else reversed(ARMS):
            runs[arm].append(one_run(*loaded[arm], texts))
    rows = []
    for (arithmetic, method), got in runs.items():
        med = {k: statistics.median(r[k] for r in got) for k in got[0]}
        share = med["other_ms"] / med["wall_ms"]
        print(
            f"  {arithmetic:5s} {method:5s}: {med['wall_ms']:.3f} ms a forward, model {med['model_ms']:.3f}, "
            f"other {med['other_ms']:.3f} ({share:.1%})"
        )
        stages = stage_times(loaded[(arithmetic, method)][0], texts)
        print("    us a forward: " + ", ".join(f"{k} {v:.0f}" for k, v in stages.items() if v >= 5))
        row = {"arithmetic": arithmetic, "method": method, **med, "other_share": share, "repeats": got}
        rows.append({**row, "stages_us": stages})
    print(f"wrote {write_result(a.output, {**provenance(module='experiments.engine_overhead'), 'arms': rows})}")


if __name__ == "__main__":
    main()
