"""The GPU check (tools/gpu_check.py) runs on this CPU with tiny shapes, so that it cannot rot between GPU runs:
every section completes, its own negative controls are caught, and a fault in the engine fails the check."""

from __future__ import annotations

import json

import specdecode.verify.chain
from tools import gpu_check


def test_quick_check_runs_every_section_and_passes(tmp_path):
    assert gpu_check.main(["--device", "cpu", "--quick", "--out", str(tmp_path / "check")]) == 0
    result = json.loads((tmp_path / "check.json").read_text())
    assert set(result["sections"]) == {"env", "exactness_eager", "distribution_eager", "cost"}
    assert all(s["ok"] for s in result["sections"].values())
    cell = result["exactness_eager"]["llama/eager"]
    assert {m for m, v in cell.items() if isinstance(v, dict) and v["equal"]} >= {"draft", "ngram", "eagle", "self"}
    assert {k.split("/")[-1] for k in result["distribution_eager"]} == {"intact", "fault"}
    assert {r["batch"] for r in result["cost"]["curves"]["eager"]["rows"]} == set(gpu_check.BATCHES)
    assert (tmp_path / "check.png").stat().st_size > 0


def test_control_a_lossy_verify_fails_the_check(tmp_path, monkeypatch):
    """Fault: at a rejection the target's token is replaced by the draft's (every draft accepted)."""
    monkeypatch.setattr(specdecode.verify.chain, "residual", lambda p, q: q)
    args = ["--device", "cpu", "--quick", "--out", str(tmp_path / "check"), "--sections", "distribution_eager"]
    assert gpu_check.main(args) == 1
    result = json.loads((tmp_path / "check.json").read_text())
    assert not result["distribution_eager"]["eager/chain/intact"]["pass"]
