"""Does the load probe price long contexts? The probe's fit (control/calibrate.py PROBE: 64 and 512 cached tokens),
and the same with one row timed at 4,096 tokens besides, against forwards timed at the contexts `bench
long-context` runs. Neither is the whole answer (results/README.md: the long row at 1, 3, 5 and 9 tokens priced the
pair's 8 rows of 8,192 tokens close and moved the hinge past 4 tokens; at 1, 1, 4 and 4 it moved neither), so the
probe stays the grid.

    python -m experiments.calibrate_long_points [--target qwen2.5-coder-1.5b-instruct] [--arithmetic fast]
        [--out results/calibrate_long_points.json]

Each probe times the grid and the long points once, and both fits are made from its samples; `--probes` such
probes show how much the fit moves from one to the next. Then each check point (rows, tokens a row, context) is
timed in a cache of its own and printed beside every fit's predictions. What matters to `goodput` is a plain
step's price and what a second and third token a row add to it: the columns `plain`, `+1`, `+2`.
"""

from __future__ import annotations

import argparse

from specdecode.bench.lib import provenance, write_result
from specdecode.control.calibrate import PROBE, time_forward
from specdecode.control.cost import CostModel
from specdecode.llm import LLM

LONG_CONTEXT = 4096  # the long row's cached tokens: one row, so that a probe's cache would stay small
CHECKS = [(8, 2048), (8, 8192), (1, 8192), (1, 16384)]  # (rows, context): each timed at 1, 2 and 3 tokens a row


def long_row(tokens: str, model) -> list[tuple[int, int, int]]:
    """[(rows, tokens a row, context)] one row at LONG_CONTEXT (or the longest the model takes), at each of tokens."""
    counts = [int(t) for t in tokens.split(",")]
    return [(1, t, min(LONG_CONTEXT, model.cfg.context_limit - max(counts))) for t in counts]


def timed(model, rows: int, tokens: int, context: int, repeats: int) -> float:
    """Median seconds of a [rows, tokens] forward on `context` cached tokens, in a cache of just that size."""
    return time_forward(model, model.new_cache(rows, context + tokens), rows, tokens, context, repeats)


def prices(one: float, two: float, three: float) -> dict[str, float]:
    """Seconds of 1, 2 and 3 tokens a row -> a plain step's ms and what a second and a third token a row add."""
    return {"plain_ms": one * 1e3, "plus1_ms": (two - one) * 1e3, "plus2_ms": (three - two) * 1e3}


def line(rows: str, context: str, name: str, ms: dict[str, float]) -> str:
    return f"{rows:>4} {context:>7} {name:>12} {ms['plain_ms']:9.1f} {ms['plus1_ms']:7.1f} {ms['plus2_ms']:7.1f}"


def grid_samples(model, repeats: int) -> list[tuple[int, int, int, float]]:
    cache = model.new_cache(max(PROBE["batch_sizes"]), max(PROBE["context_lengths"]) + max(PROBE["token_counts"]))
    return [
        (b, b * t, c, time_forward(model, cache, b, t, c, repeats))
        for b in PROBE["batch_sizes"]
        for t in PROBE["token_counts"]
        for c in PROBE["context_lengths"]
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--arithmetic", default="fast", choices=["exact", "fast"])
    ap.add_argument("--repeats", type=int, default=PROBE["repeats"])
    ap.add_argument("--long-tokens", default="1,1,4,4", help="the long row's tokens, one timing each")
    ap.add_argument("--probes", type=int, default=2, help="probes timed, each fitted both ways (the fit varies)")
    ap.add_argument("--out", default="results/calibrate_long_points.json")
    a = ap.parse_args()
    model = LLM(target=a.target, method="none", arithmetic=a.arithmetic).target
    fits = {}
    for i in range(1, a.probes + 1):
        grid = grid_samples(model, a.repeats)
        long = [(b, b * t, c, timed(model, b, t, c, a.repeats)) for b, t, c in long_row(a.long_tokens, model)]
        fits |= {f"grid {i}": CostModel.fit(grid), f"grid+long {i}": CostModel.fit(grid + long)}
    rows = []
    print(f"{'rows':>4} {'context':>7} {'fit':>12} {'plain ms':>9} {'+1 ms':>7} {'+2 ms':>7}")
    for b, c in CHECKS:
        if c + 3 > model.cfg.context_limit:
            continue
        row = {"rows": b, "context": c, "measured": prices(*(timed(model, b, t, c, a.repeats) for t in (1, 2, 3)))}
        print(line(str(b), str(c), "measured", row["measured"]))
        for name, fit in fits.items():
            row[name] = prices(*(fit.predict_tokens(b, b * t, c) for t in (1, 2, 3)))
            print(line("", "", name, row[name]))
        rows.append(row)
    coef = {name: fit.to_json()["verify"] for name, fit in fits.items()}
    head = {**provenance("experiments.calibrate_long_points", model), "target": a.target, "arithmetic": a.arithmetic}
    write_result(a.out, {**head, "checks": rows, "fits": coef})


if __name__ == "__main__":
    main()
