"""experiments.goodput_step_log logs every goodput step of a real bench command, and puts the controller back."""

from __future__ import annotations

import json

from experiments import goodput_step_log
from specdecode.control.goodput import GoodputController

ARGV = ["bench", "long-context", "--contexts", "64", "--batches", "1", "--max-tokens", "4", "--repeats", "1"]
ARGV += ["--arms", "none,goodput", "--enforce-eager"]


def test_every_goodput_step_is_logged_with_its_curve(tmp_path):
    choose = GoodputController.choose
    log = tmp_path / "log.json"
    assert goodput_step_log.run(str(log), [*ARGV, "--output", str(tmp_path / "lc.json")]) == 0
    steps = json.loads(log.read_text())
    assert len(steps) >= 4  # the timed run's steps at least (the warm-up's too)
    for step in steps:
        assert step["step_ms"] > 0 and len(step["ks"]) == len(step["proposed"]) == 1
        assert len(step["tokens"]) == len(step["ms"]) == len(step["width_ms"]) == len(step["p"]) + 1
    assert GoodputController.choose is choose  # put back


def test_control_without_the_wrappers_nothing_is_logged(tmp_path, monkeypatch):
    monkeypatch.setattr(goodput_step_log, "choose", goodput_step_log._choose)  # the fault: the wrappers lost
    monkeypatch.setattr(goodput_step_log, "observe", goodput_step_log._observe)
    log = tmp_path / "log.json"
    assert goodput_step_log.run(str(log), [*ARGV, "--output", str(tmp_path / "lc.json")]) == 0
    assert json.loads(log.read_text()) == []
