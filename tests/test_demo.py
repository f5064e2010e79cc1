"""`make demo` picks the Qwen2.5-Coder pair where both models are installed and SmolLM2 otherwise."""

from __future__ import annotations

import pytest

from specdecode import demo
from specdecode.models.provision import ProvisionError


def missing(name: str) -> None:
    raise ProvisionError(f"built-in model {name!r} needs the package x")


def test_pair_when_installed(monkeypatch):
    monkeypatch.setattr(demo, "check_installed", lambda name: None)
    assert demo.pick(None) is demo.PAIR
    assert demo.pick("smollm2") is demo.SMOLLM2


def test_smollm2_when_the_pair_is_missing(monkeypatch):
    monkeypatch.setattr(demo, "check_installed", missing)
    assert demo.pick(None) is demo.SMOLLM2
    with pytest.raises(ProvisionError, match="needs the package"):
        demo.pick("pair")


def test_missing_pair_asked_for_is_one_line_and_exit_2(monkeypatch, capsys):
    monkeypatch.setattr(demo, "check_installed", missing)
    monkeypatch.setattr("sys.argv", ["demo", "--model", "pair"])
    assert demo.main() == 2
    err = capsys.readouterr().err
    assert err.startswith("demo: built-in model") and err.count("\n") == 1
