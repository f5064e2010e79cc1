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
