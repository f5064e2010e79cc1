"""`goodput` at a batch of long rows, step by step: the controller as it is against the one of an earlier commit.

    python -m experiments.goodput_batch_trace --before REV [--target NAME --draft NAME --method draft]
        [--context 2048] [--batch 8] [--max-tokens 64] [--repeats 3] [--prompts code]
        [--out results/goodput_batch_trace.json]

One process, one prefill: `batch` rows of `context` tokens of the code set's dev text (bench long-context's rows,
`--split dev`: this chooses how the controller works, so never the eval text), then K = 0, fixed K = 1, `goodput`
as committed at REV (its goodput.py loaded from git, the controller's class swapped in) and `goodput` as it is in
this tree decode `max-tokens` a row each from the same rewound state, arms in turn, `repeats` times. Besides each
arm's tok/s, every step of the goodput arms that drafted is kept: the K asked per row, the drafts made and kept
(after `truncate`), each row's first-draft estimate and the step's time and drafting time. Bench long-context
tells whether `goodput` meets its target; this shows why it does or not.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from specdecode.bench import long_context as lc
from specdecode.bench.lib import provenance, write_result
from specdecode.bench.sweep_config import ArmSpec
from specdecode.control.goodput import GoodputController
from specdecode.llm import LLM

ARMS = ("none", "fixed:1", "before", "now")


def controller_class_at(rev: str) -> type:
    """GoodputController as control/goodput.py defined it at git revision `rev`."""
    source = subprocess.run(
        ["git", "show", f"{rev}:specdecode/control/goodput.py"], capture_output=True, text=True, check=True
    ).stdout
    path = Path(tempfile.mkdtemp()) / "goodput_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("goodput_before", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.GoodputController


def traced(ctrl: GoodputController, steps: list[dict]) -> None:
    """Record each step's choices into `steps` (a dict a step) as the engine calls the controller."""
    choose, truncate, observe = ctrl.choose, ctrl.truncate, ctrl.observe

    def traced_choose(seqs, k_max):
        unread = [ctrl.unread(s) for s in seqs] if ctrl.unread is not None else []
        asked = choose(seqs, k_max)
        p1 = [round(float(ctrl.acceptance.estimate(s.request_id, 1)[0]), 3) for s in seqs]
        steps.append({"asked": asked, "p1": p1, "made": [0] * len(seqs), "kept": [0] * len(seqs), "unread": unread})
        steps[-1]["priced_ms"] = priced(ctrl, seqs)
        return asked

    def traced_truncate(seqs, proposal):
        out = truncate(seqs, proposal)
        steps[-1].update(made=proposal.num_tokens.tolist(), kept=out.num_tokens.tolist())
        return out

    def traced_observe(stats):
        steps[-1].update(step_ms=1e3 * stats.step_time_s, propose_ms=1e3 * stats.propose_time_s)
        observe(stats)

    ctrl.choose, ctrl.truncate, ctrl.observe = traced_choose, traced_truncate, traced_observe


def priced(ctrl: GoodputController, seqs) -> dict:
    """What the controller's cost model predicted for this step: a plain step, a step of one draft a row, its
    drafting alone (ms), the seeded price's level and the factors of the verify's extra tokens by width."""
    b, context = len(seqs), float(np.mean([s.num_cached for s in seqs]))
    cost = ctrl.cost
    return {
        "plain": round(1e3 * cost.predict(b, 0, context), 1),
        "k1": round(1e3 * cost.predict(b, 1, context), 1),
        "draft_k1": round(1e3 * cost.predict_draft(b, 1, context), 1),
        "seed_level": round(cost.seed_level, 3),
        "extra_scales": [round(float(x), 3) for x in getattr(cost, "extra_scales", [])],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="the git revision whose goodput.py is the 'before' arm")
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--method", default="draft")
    ap.add_argument("--arithmetic", default="fast")
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prompts", default="code", help="the rows' text: the code set (its dev split), or a prompts file")
    ap.add_argument("--out", default="results/goodput_batch_trace.json")
    ap.add_argument("--arms", default=",".join(ARMS), help=f"which of {', '.join(ARMS)} to run, in turn")
    a = ap.parse_args()
    before = controller_class_at(a.before)
    draft = {"draft": a.draft} if a.method == "draft" else {}
    base = LLM(
        target=a.target, method=a.method, arithmetic=a.arithmetic, max_num_seqs=1, max_model_len=64,
        max_num_batched_tokens=lc.PREFILL_BUDGET, **draft,
    )  # fmt: skip
    k = base.spec.num_speculative_tokens
    text = lc.text_ids(base, [a.context], a.batch, a.prompts, "dev")
    prompts = lc.context_prompts(base, text, a.context, a.batch, True)
    room = lc.row_room(a.context, a.batch, a.max_tokens, k, base.engine_config.max_num_batched_tokens)
    engine = lc.build_engine(base, ArmSpec(f"fixed:{k}", "fixed", k), a.batch, a.context + room)
    t0 = time.perf_counter()
    seqs = lc.prefill(engine, prompts, room)
    lc.rewind(engine, seqs)
    if hasattr(engine.drafter, "prefill_budget"):  # a draft model reads the prompts before any arm is timed
        lc.warm_up(engine, seqs, ArmSpec("fixed:1", "fixed", 1), until_drafted=True)
    specs = {"none": ArmSpec("none", "fixed", 0), "fixed:1": ArmSpec("fixed:1", "fixed", 1)}
    specs["before"] = specs["now"] = ArmSpec("goodput", "goodput", k)
    for name in ("none", "fixed:1", "now"):
        lc.warm_up(engine, seqs, specs[name], base=base)
    print(f"prefill and warm-up {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    arms = a.arms.split(",")
    runs: dict[str, list[dict]] = {name: [] for name in arms}
    for r in range(a.repeats):
        for name in arms:
            lc.set_arm(engine, specs[name], base)
            steps: list[dict] = []
            ctrl = engine.controller.inner
            if isinstance(ctrl, GoodputController):
                if name == "before":
                    ctrl.__class__ = before
                traced(ctrl, steps)
            run = lc.decode(engine, seqs, a.batch * a.max_tokens)
            lc.rewind(engine, seqs)
            runs[name].append(
                {
                    "tokens_per_s": run.tokens / run.seconds,
                    "mean_k_asked": float(np.mean(run.k_chosen)),
                    "mean_k_verified": float(np.mean(run.k_verified)),
                    "accepted": run.accepted,
                    "drafted": run.drafted,
                    "drafting_steps": [dict(step=i, **s) for i, s in enumerate(steps) if any(s["made"])],
                }
            )
            print(
                f"repeat {r} {name:8s} {runs[name][-1]['tokens_per_s']:6.1f} tok/s, K asked "
                f"{runs[name][-1]['mean_k_asked']:.3f}, verified {runs[name][-1]['mean_k_verified']:.3f}"
            )
    result = {
        **provenance("experiments.goodput_batch_trace", model=base.target),
        "args": vars(a),
        "k_max": k,
        "runs": runs,
        "median_tokens_per_s": {n: float(np.median([x["tokens_per_s"] for x in rs])) for n, rs in runs.items()},
    }
    print(f"wrote {write_result(a.out, result)}")


if __name__ == "__main__":
    main()
