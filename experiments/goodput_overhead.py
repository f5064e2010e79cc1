"""What `goodput` costs in Python per engine step: choose, truncate and observe on a synthetic pair-like batch.

    python -m experiments.goodput_overhead [--batches 1,8] [--steps 40] [--requests 20] [--cold 64]
        [--out results/goodput_overhead.json]

No model runs: a controller seeded as the Qwen2.5-Coder pair's load probe seeds it (prices of the 2026-11-29 probe
in results/goodput_replay_2048_s22.json), the target's verify priced by a fixed line, `batch` rows of 2,048 tokens
whose draft model is caught up, drafts accepted with probability 0.7 each. Every `--requests` a fresh controller
decodes `--steps` steps (bench long-context gives each arm's run a fresh one, so its first steps, where the draft's
price is refit every step, count as they do there). Reported: microseconds a step in each call, median over the
requests. Inside the engine the same calls take ~4x these: the forward between them streams ~1 GB of weights through
the caches and leaves the controller's code and data cold (on the pair at 2,048 tokens, batch 1: choose, truncate and
observe 1.50 ms a step of ~38 at 498e68f, timers around each call). `--cold MB` reproduces that: before each call a
buffer of MB megabytes is streamed (one thread), and the cells are timed about as the engine sees them (at 498e68f:
~1,040 us a step at batch 1 against ~285 warm). To compare with an older tree, run this file with PYTHONPATH set to that
tree's checkout.
"""

from __future__ import annotations

import argparse
import subprocess
import time

import numpy as np
import torch

from specdecode.bench.lib import provenance, write_result
from specdecode.config import SamplingParams
from specdecode.control.base import StepStats
from specdecode.control.cost import CostModel
from specdecode.control.goodput import GoodputController
from specdecode.drafters.base import Proposal
from specdecode.step.sequence import Sequence

CONTEXT = 2048
K_MAX = 4
ACCEPT = 0.7
STOP_BELOW = 0.7  # the pair's default arm stops a row's drafting below this confidence (its confidences judge drafts)
CALLS = ("choose", "truncate", "observe")


def pair_controller() -> GoodputController:
    """`goodput` priced as the pair at load: a target step of ~33 ms plus ~2.5 ms a verified token, the 0.5B's
    probe (a draft 9.6 ms after 86 tokens, 20.8 after 8,192, 11.6 for 4 rows; reading 2.1 / 3.5 ms a token), and the
    default arm's confidence stop, seeded from 64 probe tokens (so first drafts are judged by confidence)."""
    cost = CostModel.linear(30e-3, 1e-3, 2.5e-3, 0.3e-3, 1e-3)
    cost.packed = True
    ctrl = GoodputController(cost=cost)
    ctrl.draft_stop_below = STOP_BELOW  # as bind_drafter reads it off the default arm's drafter
    steps = ((1, 86, 9.6e-3), (1, 8192, 20.8e-3), (4, 86, 11.6e-3))
    confidences = np.linspace(0.2, 1.0, 64)  # [64] the probe's top probabilities: right where sure, mostly
    ctrl.seed_pair(
        0.75, 9.6e-3, 2.1e-3, catch_up_chunk=2048, steps=steps, reads=((86, 2.1e-3), (2048, 3.5e-3)),
        confidences=tuple(confidences.tolist()), agreed=tuple((confidences > 0.45).tolist()),
    )  # fmt: skip
    ctrl.unread = lambda seq: 1  # caught up: what it accepted last step
    return ctrl


def stream(buffer: torch.Tensor | None) -> None:
    """Read and write `buffer` [N] once on one thread (the other core stays as idle as the engine's leaves it):
    what a forward does to the caches before each controller call."""
    if buffer is None:
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    buffer.add_(1.0)
    torch.set_num_threads(threads)


def one_request(
    batch: int, steps: int, rng: np.random.Generator, buffer: torch.Tensor | None = None
) -> dict[str, float]:
    """Microseconds a step in each call, over `steps` steps of a fresh controller (each call after `stream`)."""
    ctrl = pair_controller()
    seqs = [
        Sequence(f"r{i}", list(range(CONTEXT)), SamplingParams(max_tokens=100_000), max_len=200_000)
        for i in range(batch)
    ]
    spent = dict.fromkeys(CALLS, 0.0)
    for _ in range(steps):
        stream(buffer)
        t0 = time.perf_counter()
        ks = ctrl.choose(seqs, K_MAX)
        t1 = time.perf_counter()
        proposal = Proposal.from_lists([[5] * k for k in ks], max(ks), torch.device("cpu"))
        stream(buffer)
        t2 = time.perf_counter()
        kept = ctrl.truncate(seqs, proposal).num_tokens.tolist()
        t3 = time.perf_counter()
        accepted = [int(np.argmin(np.append(rng.random(k) < ACCEPT, False))) for k in kept]
        stats = StepStats(
            seqs, kept, accepted, 0.05, sum(k + 1 for k in kept), float(CONTEXT), 0.012 * max(kept), 0.035
        )
        stream(buffer)
        t4 = time.perf_counter()
        ctrl.observe(stats)
        t5 = time.perf_counter()
        for call, seconds in zip(CALLS, (t1 - t0, t3 - t2, t5 - t4), strict=True):
            spent[call] += seconds
    return {call: 1e6 * seconds / steps for call, seconds in spent.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--cold", type=int, default=0, help="MB streamed before each call (0: warm caches)")
    ap.add_argument("--out", default="results/goodput_overhead.json")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    buffer = torch.zeros(a.cold * 2**20 // 4) if a.cold else None  # [MB of fp32]
    cells = []
    for batch in (int(b) for b in a.batches.split(",")):
        runs = [one_request(batch, a.steps, rng, buffer) for _ in range(a.requests)]
        us = {call: float(np.median([r[call] for r in runs])) for call in CALLS}
        us["total"] = float(np.median([sum(r.values()) for r in runs]))
        cells.append({"batch": batch, "us_per_step": us})
        print(f"batch {batch}: " + ", ".join(f"{call} {v:.0f}" for call, v in us.items()) + " us a step")
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    out = {**provenance(module="experiments.goodput_overhead"), "git": rev, "context": CONTEXT, "cold_mb": a.cold}
    out["cells"] = cells
    print(f"wrote {write_result(a.out, out)}")


if __name__ == "__main__":
    main()
