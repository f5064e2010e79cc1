"""The bench command line stopped where its first model would load: its peers' checks (tools built, extras
installed, a GGUF-backed target) run for real, and a test sees their one-line error or that they passed."""

from __future__ import annotations

import json

import pytest

import specdecode.llm_args


class ModelsLoaded(Exception):
    """Raised where the bench would load its first model: the checks passed."""


@pytest.fixture
def bench_argv(tmp_path, monkeypatch) -> list[str]:
    """`bench specbench` on one prompt without the default peers, stopped (ModelsLoaded) where the first model
    would load; a test adds the peer flags it checks."""

    def load(*args, **kwargs):
        raise ModelsLoaded

    monkeypatch.setattr(specdecode.llm_args, "llm_from_args", load)
    prompts = tmp_path / "q.jsonl"
    prompts.write_text(json.dumps({"category": "qa", "turns": ["What is 2 + 2?"]}) + "\n")
    return ["bench", "specbench", "--prompts", str(prompts), "--no-peers"]


def one_line_error(capsys) -> str:
    """What the command printed on stderr, checked to be one line and no traceback."""
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    return err
