"""What the load sweep's steady-state window holds for each arm: K = 0 against fixed K = 3 on the pair at C = 8.

    python -m experiments.sweep_steady_window [--rounds 4] [--output results/sweep_steady_window.json]

The sweep's rounds (bench/sweep.py: 16 Spec-Bench requests a round at C = 8, the first 8 staggered, 64 new tokens,
the pair's draft in the fast arithmetic), each arm on the same prompts, the arms taking turns; every engine step is
logged with whether it falls in the steady window the sweep reads (a request has finished and been replaced, all C
in flight), the rows it decoded and the prompt tokens it prefilled. Then per arm, in the window and outside it:
steps, seconds, tokens/s, mean rows, prompt tokens prefilled beside decoding rows. Every arm serves the same
requests, so the whole round is the same work for each; the window is not: on 2026-12-01 (4 rounds) K = 0's window
held 69% of the prompt tokens its decoding steps prefilled and fixed K = 3's 27% (its new requests' prefill waited
while its rows verified drafts, and ran after the window), so the window's tokens/s favoured fixed K = 3 by 14%
(79.7 against 70.1) where over the whole round it ran at 0.74x K = 0 (46.0 against 62.1).
"""

from __future__ import annotations

import argparse
from itertools import cycle, islice

from experiments.goodput_draft_context import pair_llm
from specdecode.bench.lib import provenance, write_result
from specdecode.bench.sweep import NullBar, build_engine, closed_loop, encode_prompts, max_len_for
from specdecode.bench.sweep_config import ArmSpec
from specdecode.config import SamplingParams
from specdecode.control import StepStats
from specdecode.llm import LLM

C, N, MAX_TOKENS, K = 8, 16, 64, 3
ARMS = (ArmSpec("none", "fixed", 0), ArmSpec("fixed:3", "fixed", K))


def one_round(base: LLM, arm: ArmSpec, prompts: list[list[int]], r: int, max_len: int) -> list[dict]:
    """One round of `arm` through the sweep's own closed loop (staggered), every step logged."""
    steps: list[dict] = []

    def log(steady: bool, seconds: float, updates: list, stats: StepStats | None) -> None:
        steps.append(
            {
                "steady": steady,
                "seconds": seconds,
                "tokens": sum(len(u.new_token_ids) for u in updates),
                "rows": len(stats.num_proposed) if stats else 0,
                "prefill_tokens": stats.prefill_tokens if stats else 0,
            }
        )

    engine = build_engine(base, arm, C, max_len)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    closed_loop(engine, islice(cycle(prompts), r * N, None), C, N, params, NullBar(), stagger=True, on_step=log)
    return steps


def summary(steps: list[dict]) -> dict:
    seconds = sum(s["seconds"] for s in steps)
    return {
        "steps": len(steps),
        "seconds": seconds,
        "tokens_per_s": sum(s["tokens"] for s in steps) / seconds if seconds else 0.0,
        "mean_rows": sum(s["rows"] for s in steps) / len(steps) if steps else 0.0,
        "prefill_tokens": sum(s["prefill_tokens"] for s in steps),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--output", default="results/sweep_steady_window.json")
    a = ap.parse_args()
    base = pair_llm(num_speculative_tokens=K, draft_stop_below=0.7, max_model_len=8192)
    prompts, _ = encode_prompts(base, argparse.Namespace(prompts="../shared/data/specbench_question.jsonl", chat=True))
    max_len = max_len_for(prompts, MAX_TOKENS, K, base.max_model_len)
    logged: dict[str, list[dict]] = {arm.name: [] for arm in ARMS}
    for r in range(a.rounds):
        for arm in ARMS if r % 2 == 0 else ARMS[::-1]:
            logged[arm.name] += one_round(base, arm, prompts, r, max_len)
    out = {}
    for name, steps in logged.items():
        out[name] = {
            "steady": summary([s for s in steps if s["steady"]]),
            "outside": summary([s for s in steps if not s["steady"]]),
            "whole": summary(steps),
        }
        for part, fig in out[name].items():
            print(
                f"{name:8s} {part:8s} {fig['steps']:4d} steps {fig['seconds']:6.1f} s {fig['tokens_per_s']:6.1f} tok/s "
                f"rows {fig['mean_rows']:.2f} prompt tokens {fig['prefill_tokens']}"
            )
    meta = provenance(module="experiments.sweep_steady_window")
    path = write_result(a.output, {**meta, "concurrency": C, "requests_per_round": N, "rounds": a.rounds, "arms": out})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
