"""The step-cost bench's target ratios: present when the batch-1 one-token cell was measured, absent otherwise."""

from __future__ import annotations

import argparse

import pytest

from specdecode.bench.cost import ratios


def test_ratios_divide_by_the_one_token_step():
    a = argparse.Namespace(contexts=[256, 1024])
    ms = {"1x1@256": 25.0, "1x9@256": 30.0, "8x9@256": 150.0, "1x9@1024": 99.0}
    out = ratios(a, ms)
    assert out == {"1x1_ms": 25.0, "1x9_over_1x1": pytest.approx(1.2), "8x9_over_1x1": pytest.approx(6.0)}


def test_a_run_without_the_one_token_step_has_no_ratios():
    # `bench cost --batches 8,16,32` measures no 1 x 1 cell: it once died on a KeyError after the whole run
    a = argparse.Namespace(contexts=[256])
    assert ratios(a, {"8x1@256": 40.0, "16x1@256": 56.0}) == {}


def test_floor_ratios_sit_beside_the_measured_ones():
    a = argparse.Namespace(contexts=[256])
    ms = {"1x1@256": 20.0, "8x9@256": 130.0}
    out = ratios(a, ms, {"1x1@256": 4.0, "8x9@256": 110.0})
    assert out["8x9_floor_over_1x1"] == pytest.approx(5.5) and out["8x9_over_1x1"] == pytest.approx(6.5)


def test_forward_work_counts_every_linear_weight():
    """The floor's multiply-adds per token are the model's own linear weights (LM head included), counted from a
    built model; the same count for a model one layer short is the control that the comparison can fail."""
    from dataclasses import replace

    from torch import nn

    from specdecode.bench.floor import forward_gflop, linear_params, peak_gflops
    from specdecode.models.llama import LlamaConfig, LlamaModel

    cfg = LlamaConfig("llama", 96, 64, 160, 3, 4, 2, 16, 1e4, 1e-5, 256, True, False, False, False)
    weights = sum(m.weight.numel() for m in LlamaModel(cfg).modules() if isinstance(m, nn.Linear))
    assert linear_params(cfg) == weights
    assert linear_params(replace(cfg, num_layers=2)) != weights
    one, nine = forward_gflop(cfg, 1, 1, 100), forward_gflop(cfg, 8, 9, 100)
    assert one == pytest.approx((2 * weights + 4 * 4 * 16 * 101 * 3) / 1e9)
    assert nine > 72 * one  # 72 rows, each attending to a few more keys
    assert 0 < peak_gflops(2, ((64, 64, 64),), ((16, 64, 64),)) < 1e5


class FakeWorker:
    def __init__(self, name: str) -> None:
        self.name = name

    def time_ms(self, batch: int, tokens: int, context: int) -> float:
        return float(batch * tokens)


def test_llama_cpp_curve_sits_beside_ours_at_batch_one(monkeypatch, tmp_path):
    """`--llama-cpp-native`: llama-bench times every batch-1 cell (and only those: it runs one sequence), between
    our arms' cells; the table and the plot show '-' / no line where it has no cell."""
    from pathlib import Path

    from rich.console import Console

    from specdecode.bench import cost

    calls = []

    def llama_bench_ms(gguf: Path, tokens: int, context: int, repeats: int) -> float:
        calls.append((tokens, context, repeats))
        return 100.0 + tokens

    monkeypatch.setattr(cost, "llama_bench_ms", llama_bench_ms)
    a = argparse.Namespace(contexts=[512], batches=[1, 4], new_tokens=[1, 5], repeats=3)
    ms = cost.measure(a, [FakeWorker("compiled")], Path("t.gguf"))
    assert ms[cost.NATIVE] == {"1x1@512": 101.0, "1x5@512": 105.0}
    assert calls == [(1, 512, 3), (5, 512, 3)]
    assert ms["compiled"]["4x5@512"] == 20.0
    md = cost.render(a, ms, Console(file=open(tmp_path / "out.txt", "w")))
    assert "| 1 | 1.0 (101.0) | 5.0 (105.0) |" in md and "| 4 | 4.0 (-) | 20.0 (-) |" in md
    cost.plot(tmp_path / "c.png", a, ms, {k: 1.0 for k in ms["compiled"]})  # the floor beside the curves
    assert (tmp_path / "c.png").stat().st_size > 0
    assert cost.ratios(a, ms[cost.NATIVE])["1x1_ms"] == 101.0
