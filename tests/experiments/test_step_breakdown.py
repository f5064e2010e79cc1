"""experiments.step_breakdown splits each arm's steps of a real bench command, times goodput's calls, and puts the
controller and the bench back."""

from __future__ import annotations

from experiments import step_breakdown
from specdecode.bench import long_context
from specdecode.control.goodput import GoodputController

ARGV = ["--contexts", "64", "--batches", "1", "--max-tokens", "4", "--repeats", "1", "--arms", "none,goodput"]
ARGV += ["--enforce-eager"]


def goodput_share(tmp_path, time_goodput: bool = True) -> float:
    """goodput's calls' ms a step over its whole step's, from a run of the tiny bench; checks the split adds up."""
    result = step_breakdown.run(str(tmp_path / "sb.json"), [*ARGV, "--output", str(tmp_path / "lc.json")], time_goodput)
    arms = result["arms"]
    assert set(arms) == {"none", "goodput"} and arms["none"]["goodput_ms"] == 0.0
    for summ in arms.values():
        assert summ["steps"] >= 4 and summ["step_ms"] > summ["verify_ms"] > 0
        parts = summ["propose_ms"] + summ["verify_ms"] + summ["rest_ms"]
        assert abs(parts - summ["step_ms"]) < 1e-6 * summ["steps"] + 1e-9
    return arms["goodput"]["goodput_ms"] / arms["goodput"]["step_ms"]


def test_each_step_is_split_and_goodputs_calls_are_timed(tmp_path):
    choose, decode = GoodputController.choose, long_context.decode
    assert 0.0 < goodput_share(tmp_path) < 1.0
    assert GoodputController.choose is choose and long_context.decode is decode  # put back


def test_control_goodput_untimed_reads_nothing(tmp_path):
    assert goodput_share(tmp_path, time_goodput=False) == 0.0
