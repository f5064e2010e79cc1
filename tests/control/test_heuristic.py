"""The heuristic controller on synthetic traces: K falls when drafts fail, probes at 0, grows back on success."""

from __future__ import annotations

from specdecode.config import SamplingParams
from specdecode.control.base import StepStats
from specdecode.control.heuristic import HeuristicController
from specdecode.step.sequence import Sequence

K_MAX = 8


def run_trace(ctrl: HeuristicController, seq: Sequence, accept_fraction: float, steps: int) -> list[int]:
    ks = []
    for _ in range(steps):
        k = ctrl.choose([seq], K_MAX)[0]
        ks.append(k)
        ctrl.observe(StepStats([seq], [k], [int(k * accept_fraction)], 0.01, k + 1))
    return ks


def test_k_falls_probes_and_recovers():
    ctrl = HeuristicController(probe_every=4)
    seq = Sequence("r", [1, 2, 3], SamplingParams(), max_len=64)
    falling = run_trace(ctrl, seq, accept_fraction=0.0, steps=12)
    assert falling[0] == K_MAX and falling[:9] == sorted(falling[:9], reverse=True)
    assert 0 in falling  # speculation switches off when every draft fails
    idle = run_trace(ctrl, seq, accept_fraction=0.0, steps=10)
    assert 1 in idle  # ...but it is probed again
    recovering = run_trace(ctrl, seq, accept_fraction=1.0, steps=12)
    assert recovering[-1] == K_MAX  # a request that became predictable gets K back within a few steps


def test_forget_resets_state():
    ctrl = HeuristicController()
    seq = Sequence("r", [1], SamplingParams(), max_len=64)
    run_trace(ctrl, seq, 0.0, 5)
    ctrl.forget(seq)
    assert ctrl.choose([seq], K_MAX) == [K_MAX]
