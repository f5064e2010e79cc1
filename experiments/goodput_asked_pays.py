"""`goodput` with and without pricing the drafts it asks once rows are cut (`GoodputController._asked_pays`).

    python -m experiments.goodput_asked_pays [--concurrency 4] [--rounds 12] [--prompts data/dev_chat_prompts.jsonl] \\
        [--arms none,before,after] [--output results/goodput_asked_pays_c4_dev.json]

The load sweep's closed loop (bench/sweep.py: 2C requests a round, the first C staggered, 64 new tokens, the pair's
0.5B draft at K_max 4 stopping below 0.7 with prompt lookup from 3 tokens, fast arithmetic) for three arms on the
same requests each round, their order rotating: K = 0, `goodput` as it was (`before`: the drafts asked are not
priced again) and `goodput` as it is (`after`). Dev prompts only: it is for working out the controller. Every step
is logged (rows, drafts proposed and accepted, seconds, drafting seconds), and per arm it reports whole-round
tokens/s (the same work for every arm: docs/benchmarks.md says why not the steady window), the ratios to K = 0 and
between the two goodputs (pooled and the median of the rounds' paired ratios), and the steps in which some rows of
a batch of two or more drafted and others did not: how many, and what they cost over a plain step of as many rows
against what their accepted drafts saved (each a plain step's share of a row), both at K = 0's median step time by
rows. Its ledger splits every decode step the same way by kind: every row drafted, some did, the draft model ran
and nothing was verified (drafts are counted after `truncate`, which may cut them all; a first draft is always
made, so such a step is no confidence stop), and counts the steps whose drafting took over 30 ms (catch-ups).
"""

from __future__ import annotations

import argparse
import statistics
from itertools import cycle, islice

from experiments.goodput_draft_context import pair_llm
from specdecode.bench.lib import provenance, turn_order, write_result
from specdecode.bench.sweep import NullBar, build_engine, closed_loop, encode_prompts, max_len_for
from specdecode.bench.sweep_config import ArmSpec
from specdecode.config import SamplingParams
from specdecode.control import StepStats
from specdecode.llm import LLM

MAX_TOKENS, K = 64, 4
ARMS = ("none", "before", "after")


def one_round(base: LLM, arm: str, prompts: list[list[int]], c: int, r: int, max_len: int) -> list[dict]:
    """One round of `arm` through the sweep's closed loop, every step logged."""
    steps: list[dict] = []

    def log(steady: bool, seconds: float, updates: list, stats: StepStats | None) -> None:
        steps.append(
            {
                "seconds": seconds,
                "tokens": sum(len(u.new_token_ids) for u in updates),
                "proposed": list(stats.num_proposed) if stats else [],
                "accepted": list(stats.num_accepted) if stats else [],
                "prefill_tokens": stats.prefill_tokens if stats else 0,
                "propose_s": stats.propose_time_s if stats else 0.0,
            }
        )

    spec = ArmSpec("none", "fixed", 0) if arm == "none" else ArmSpec("goodput", "goodput", K)
    engine = build_engine(base, spec, c, max_len)
    if arm == "before":
        engine.controller.inner._asked_pays = lambda *args: True
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    closed_loop(engine, islice(cycle(prompts), r * 2 * c, None), c, 2 * c, params, NullBar(), stagger=True, on_step=log)
    return steps


def tokens_per_s(steps: list[dict]) -> float:
    return sum(s["tokens"] for s in steps) / sum(s["seconds"] for s in steps)


def plain_step_s(steps: list[dict]) -> dict[int, float]:
    """K = 0's median seconds of a decode step without prefill, by rows."""
    by_rows: dict[int, list[float]] = {}
    for s in steps:
        if s["proposed"] and not s["prefill_tokens"]:
            by_rows.setdefault(len(s["proposed"]), []).append(s["seconds"])
    return {rows: statistics.median(times) for rows, times in by_rows.items()}


# A decode step's kind in `ledger`, by what its rows proposed and whether the draft model ran (propose_s past 2 ms:
# lookup alone takes well under that)
KINDS = {
    "every row drafted": lambda s: all(s["proposed"]),
    "some rows drafted": lambda s: any(s["proposed"]) and not all(s["proposed"]),
    "the draft ran, nothing proposed": lambda s: not any(s["proposed"]) and s["propose_s"] > 0.002,
}


def priced(part: list[dict], plain: dict[int, float]) -> dict:
    """Steps (each of a row count `plain` has): their count, their seconds over a plain step of as many rows, and
    what their accepted drafts saved (each a plain step's share of a row)."""
    return {
        "steps": len(part),
        "extra_s": sum(s["seconds"] - plain[len(s["proposed"])] for s in part),
        "saved_s": sum(sum(s["accepted"]) * plain[len(s["proposed"])] / len(s["proposed"]) for s in part),
    }


def partial_drafting(steps: list[dict], plain: dict[int, float]) -> dict:
    """The steps (prefill or not) of 2+ rows in which some rows drafted and others did not, `priced`."""
    some = KINDS["some rows drafted"]  # two rows at least: one row drafts or does not
    return priced([s for s in steps if some(s) and len(s["proposed"]) in plain], plain)


def ledger(steps: list[dict], plain: dict[int, float]) -> dict:
    """Decode steps (no prefill) of each kind in KINDS, `priced`, with their drafting seconds; besides, the steps
    whose drafting took over 30 ms (the draft model reading a row's prompt: a catch-up)."""
    decode = [s for s in steps if s["proposed"] and not s["prefill_tokens"] and len(s["proposed"]) in plain]
    out = {}
    for kind, belongs in KINDS.items():
        part = [s for s in decode if belongs(s)]
        out[kind] = priced(part, plain) | {"propose_s": sum(s["propose_s"] for s in part)}
    reading = [s["propose_s"] for s in decode if s["propose_s"] > 0.03]
    out["drafting over 30 ms"] = {"steps": len(reading), "propose_s": sum(reading)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--prompts", default="data/dev_chat_prompts.jsonl")
    ap.add_argument("--output", default="results/goodput_asked_pays_c4_dev.json")
    ap.add_argument("--arms", default=",".join(ARMS), help=f"a subset of {','.join(ARMS)}, in this order")
    a = ap.parse_args()
    arms = tuple(arm for arm in ARMS if arm in a.arms.split(","))
    if "none" not in arms or len(arms) < 2:
        ap.error("--arms needs none (the plain steps every other arm is priced against) and one more")
    base = pair_llm(num_speculative_tokens=K, draft_stop_below=0.7, draft_lookup=3, max_model_len=8192)
    prompts, _ = encode_prompts(base, argparse.Namespace(prompts=a.prompts, chat=True))
    max_len = max_len_for(prompts, MAX_TOKENS, K, base.max_model_len)
    rounds: dict[str, list[list[dict]]] = {arm: [] for arm in arms}
    n = len(arms)  # three arms rotate as well as reverse; two only reverse (rotating too would undo it)
    for r in range(a.rounds):
        for arm in turn_order(arms[r % n :] + arms[: r % n] if n > 2 else arms, r):
            rounds[arm].append(one_round(base, arm, prompts, a.concurrency, r, max_len))
        print(r, {arm: round(tokens_per_s(rounds[arm][-1]), 1) for arm in arms}, flush=True)
    pooled = {arm: tokens_per_s([s for rnd in rounds[arm] for s in rnd]) for arm in arms}
    plain = plain_step_s([s for rnd in rounds["none"] for s in rnd])
    out = {"arms": {}, "ratios": {}}
    for arm in arms:
        steps = [s for rnd in rounds[arm] for s in rnd]
        out["arms"][arm] = {
            "tokens_per_s": pooled[arm],
            "round_tokens_per_s": [tokens_per_s(rnd) for rnd in rounds[arm]],
            "partial_drafting": partial_drafting(steps, plain),
            "ledger": ledger(steps, plain),
        }
    for arm, ref in (("before", "none"), ("after", "none"), ("after", "before")):
        if arm not in arms or ref not in arms:
            continue
        paired = [tokens_per_s(x) / tokens_per_s(y) for x, y in zip(rounds[arm], rounds[ref], strict=True)]
        out["ratios"][f"{arm}/{ref}"] = {
            "pooled": pooled[arm] / pooled[ref],
            "median_paired": statistics.median(paired),
        }
    for arm, fig in out["arms"].items():
        part = fig["partial_drafting"]
        print(
            f"{arm:7s} {fig['tokens_per_s']:6.1f} tok/s  steps where some rows drafted: {part['steps']:4d}, "
            f"{part['extra_s']:5.2f} s over plain steps, {part['saved_s']:5.2f} s saved"
        )
        for kind, row in fig["ledger"].items():
            saved = f", {row['saved_s']:5.2f} s saved" if "saved_s" in row else ""
            over = f", {row['extra_s']:5.2f} s over plain" if "extra_s" in row else ""
            print(f"    {kind:32s} {row['steps']:4d} steps{over}{saved}, {row['propose_s']:5.2f} s drafting")
    for name, fig in out["ratios"].items():
        print(f"{name:13s} pooled {fig['pooled']:.3f}x  median of paired rounds {fig['median_paired']:.3f}x")
    meta = provenance(module="experiments.goodput_asked_pays")
    settings = {"concurrency": a.concurrency, "rounds": a.rounds, "prompts": a.prompts, "max_tokens": MAX_TOKENS}
    settings |= {"plain_step_s": plain}
    path = write_result(a.output, {**meta, **settings, **out})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
