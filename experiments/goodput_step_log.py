"""Any `specdecode` command with `goodput`'s every step logged: what it asked, what it predicted, what it got.

    python -m experiments.goodput_step_log LOG.json bench long-context --target qwen2.5-coder-1.5b-instruct \\
        --arithmetic fast --contexts 8192 --batches 1 --max-tokens 64 --repeats 2 --texts 2 \\
        --arms none,fixed:2,fixed:3,fixed:4,goodput --prompts code --split dev --output OUT.json

The command runs as the CLI runs it; `GoodputController.choose` and `observe` are wrapped so that each step of every
goodput controller (a bench gives each arm and repeat its own: `controller` tells them apart) appends to LOG.json:
the K asked per row, the drafts proposed and accepted, the step's and its drafting's ms; whether drafting has been
priced by a steady step (`measured`), whether one row's drafts could pay (`alone`, at the measured price), the steps
since the last widening probe and the spacing in force; and the curve `choose` maximised: each row's acceptance
estimates, the continuation, and per batch K the expected tokens and predicted ms (`curve_parts`), with the price
of each width made. Bench long-context says whether `goodput` met its target; this says what it believed. Use dev
text (`--prompts code --split dev`): it is for working out how the controller works.
"""

from __future__ import annotations

import json
import sys

import numpy as np

from specdecode.cli import main
from specdecode.control import goodput as g

LOG: list[dict] = []
_choose, _observe = g.GoodputController.choose, g.GoodputController.observe


def rounded(x: np.ndarray, digits: int = 3) -> list[float]:
    return np.round(np.asarray(x, dtype=float), digits).tolist()


def choose(self: g.GoodputController, seqs, k_max: int) -> list[int]:
    context = float(np.mean([s.num_cached for s in seqs])) if seqs else 0.0
    entry: dict = {"controller": id(self), "context": context}
    if seqs and k_max > 0:
        caps = np.array([g.row_cap(s, k_max) for s in seqs])  # [B]
        p = self._estimates(seqs, k_max, context)  # [B, k_max]
        go_on = self._go_on(seqs, p, k_max)  # as choose's: (every row [k_max], after a hit [k_max] or [B, k_max])
        reach = self._reach(seqs, p, self._drafting_is_cheap(len(seqs), k_max, context), context)  # [B, k_max]
        tokens, seconds = g.curve_parts(reach, caps, self.cost, context, *go_on)  # [k_max + 1]
        widths = np.arange(k_max + 1)
        entry |= {
            "p": rounded(p.mean(0)),
            "go_on": rounded(go_on[0]),
            "go_on_accepted": rounded(go_on[1]),
            "tokens": rounded(tokens),
            "ms": rounded(seconds * 1e3, 1),
            "width_ms": rounded(self.cost.predict_many(len(seqs), widths, context) * 1e3, 1),
            "alone": bool(self._alone_could_pay(len(seqs), k_max, context)),
        }
    ks = _choose(self, seqs, k_max)
    entry |= {
        "ks": list(ks),
        "measured": self.cost.draft_measured,
        "since_probe": self.since_probe,
        "interval": self.probe_interval,
    }
    self._step_log = entry
    return ks


def observe(self: g.GoodputController, stats) -> None:
    entry = getattr(self, "_step_log", None)
    if entry is not None:
        entry |= {
            "proposed": list(stats.num_proposed),
            "accepted": list(stats.num_accepted),
            "step_ms": round(stats.step_time_s * 1e3, 1),
            "propose_ms": round(stats.propose_time_s * 1e3, 1),
        }
        LOG.append(entry)
        self._step_log = None
    _observe(self, stats)


def run(path: str, argv: list[str]) -> int:
    """The CLI on argv with goodput's steps logged to `path`; the controller's methods are put back after."""
    LOG.clear()
    g.GoodputController.choose, g.GoodputController.observe = choose, observe
    try:
        return main(argv)
    finally:
        g.GoodputController.choose, g.GoodputController.observe = _choose, _observe
        with open(path, "w") as f:
            json.dump(LOG, f)


if __name__ == "__main__":
    sys.exit(run(sys.argv[1], sys.argv[2:]))
