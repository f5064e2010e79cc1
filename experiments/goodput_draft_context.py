"""goodput with a draft model priced by context and exploring K = 1 on thin evidence (as it is now) against the
price of one short-context step and no exploration (as it was), at long contexts, in one run: the same prefilled
rows, the arms taking turns.

    python -m experiments.goodput_draft_context [--contexts 256,2048,8192] [--repeats 5] [--max-tokens 64]
        [--split dev] [--out results/goodput_draft_context.json]

The Qwen2.5-Coder pair (1.5B target, 0.5B draft, fast arithmetic). Arms: none, fixed:1, fixed:2, fixed:3, and two
goodput controllers started from the same load probe: `goodput` seeded as `LLM.new_controller` seeds it (draft
steps timed at the probe's prompt and at 8,192 cached tokens, the draft's window), and `goodput-short` seeded with
the short-prompt step alone at no context and no window, and `explore` 0 (the controller before both).
The machinery is `bench long-context`'s (prefill once, rewind between arms, decode speed only); the text is the
code set's --split part (dev by default: this chooses how the controller prices, so never the eval prompts).
Reported per context: tok/s per arm (median over repeats), K asked, each goodput's ratio to the best fixed arm
and to the other goodput per repeat (paired: the same repeat's drift hits both).
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np
from tqdm import tqdm

from specdecode.bench import long_context as lc
from specdecode.bench.lib import provenance, write_result
from specdecode.bench.sweep import RecordingController
from specdecode.bench.sweep_config import ArmSpec
from specdecode.control.goodput import GoodputController
from specdecode.llm import LLM

K_MAX = 5
FIXED = [ArmSpec("none", "fixed", 0), *(ArmSpec(f"fixed:{k}", "fixed", k) for k in (1, 2, 3))]
GOODPUTS = ("goodput", "goodput-short")


def pair_llm(**settings) -> LLM:
    """The Qwen2.5-Coder pair as these experiments load it: the 1.5B target and its 0.5B draft, fast arithmetic,
    `goodput` (whose load probe prices the pair: LLM._controller), K_MAX drafts, one row; `settings` add to it or
    replace those."""
    defaults = {"arithmetic": "fast", "controller": "goodput", "num_speculative_tokens": K_MAX, "max_num_seqs": 1}
    pair = {"target": "qwen2.5-coder-1.5b-instruct", "draft": "qwen2.5-coder-0.5b-instruct", "method": "draft"}
    return LLM(**pair, **{**defaults, **settings})


def short_priced(base: LLM) -> GoodputController:
    """goodput as seeded before the context term: the probe's short-prompt step, taken as a step after no context."""
    price = base.pair_price
    ctrl = GoodputController(explore=0.0)
    chunk = base.engine_config.max_num_batched_tokens
    ctrl.seed_pair(price.acceptance, price.draft_step_s, price.draft_read_s, catch_up_chunk=chunk)
    return ctrl


def set_goodput(engine, base: LLM, name: str) -> None:
    fresh = base.new_controller("goodput") if name == "goodput" else short_priced(base)
    fresh.bind_drafter(engine.drafter)
    engine.controller = RecordingController(fresh)
    engine.k_max = K_MAX


def run_arm(engine, base: LLM, seqs, name: str, tokens: int) -> lc.ArmRun:
    if name in GOODPUTS:
        set_goodput(engine, base, name)
    else:
        lc.set_arm(engine, next(a for a in FIXED if a.name == name), base)
    run = lc.decode(engine, seqs, tokens)
    lc.rewind(engine, seqs)
    return run


def run_context(base: LLM, text: list[int], n: int, repeats: int, max_tokens: int, bar) -> dict:
    budget = base.engine_config.max_num_batched_tokens
    room = lc.row_room(n, 1, max_tokens, K_MAX, budget)
    engine = lc.build_engine(base, ArmSpec(f"fixed:{K_MAX}", "fixed", K_MAX), 1, n + room)
    seqs = lc.prefill(engine, lc.context_prompts(base, text, n, 1, True), room)
    lc.rewind(engine, seqs)
    lc.warm_up(engine, seqs, ArmSpec("fixed:1", "fixed", 1), until_drafted=True)
    names = [a.name for a in FIXED] + list(GOODPUTS)
    for name in names:  # untimed first uses
        run_arm(engine, base, seqs, name, 8)
    runs: dict[str, list[lc.ArmRun]] = {name: [] for name in names}
    for r in range(repeats):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            bar.set_postfix_str(f"N={n} {name} repeat {r + 1}/{repeats}")
            runs[name].append(run_arm(engine, base, seqs, name, max_tokens))
            bar.update(1)
    for s in seqs:
        engine.abort(s.request_id)
    tps = {name: [x.tokens / x.seconds for x in rs] for name, rs in runs.items()}
    best = max((a.name for a in FIXED), key=lambda name: statistics.median(tps[name]))
    cell = {
        "context": n,
        "tokens_per_s": {name: statistics.median(v) for name, v in tps.items()},
        "tokens_per_s_repeats": tps,
        "k_asked": {name: float(np.mean([k for x in runs[name] for k in x.k_chosen])) for name in GOODPUTS},
        "best_fixed": best,
        "lossless": lc.lossless(runs),
    }
    for name in GOODPUTS:
        cell[f"{name}_over_best_fixed"] = cell["tokens_per_s"][name] / cell["tokens_per_s"][best]
    cell["goodput_over_short_paired"] = statistics.median(
        a / b for a, b in zip(tps["goodput"], tps["goodput-short"], strict=True)
    )
    return cell


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--contexts", default="256,2048,8192")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--split", default="dev", choices=("dev", "eval"))
    ap.add_argument("--out", default="results/goodput_draft_context.json")
    a = ap.parse_args()
    contexts = [int(x) for x in a.contexts.split(",")]
    base = pair_llm(max_model_len=64, max_num_batched_tokens=lc.PREFILL_BUDGET)
    text = lc.text_ids(base, contexts, 1, "code", a.split)
    cells = []
    with tqdm(total=len(contexts) * a.repeats * (len(FIXED) + len(GOODPUTS)), unit="arm") as bar:
        for n in contexts:
            cell = run_context(base, text, n, a.repeats, a.max_tokens, bar)
            cells.append(cell)
            figs = "  ".join(f"{k} {v:.1f}" for k, v in cell["tokens_per_s"].items())
            tqdm.write(
                f"N={n}: {figs} | K asked {cell['k_asked']} | goodput {cell['goodput_over_best_fixed']:.3f}x, "
                f"goodput-short {cell['goodput-short_over_best_fixed']:.3f}x best fixed ({cell['best_fixed']}); "
                f"goodput / goodput-short paired {cell['goodput_over_short_paired']:.3f}"
            )
    price = base.pair_price
    result = {
        **provenance(model=base.target),
        "command": "python -m experiments.goodput_draft_context "
        f"--contexts {a.contexts} --repeats {a.repeats} --max-tokens {a.max_tokens} --split {a.split}",
        "pair_price": price.__dict__,
        "cells": cells,
    }
    print(f"wrote {write_result(a.out, result)}")


if __name__ == "__main__":
    main()
