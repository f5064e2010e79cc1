"""The bench command line stopped where its first model would load: its peers' checks (tools built, extras
installed, a GGUF-backed target) run for real, and a test sees their one-line error or that they passed."""

from __future__ import annotations

import json

import pytest

import specdecode.llm_args
from specdecode.llm import LLM


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


def eager_smollm2_ngram(max_num_seqs: int, max_model_len: int, max_num_batched_tokens: int) -> LLM:
    """SmolLM2 with n-gram drafting at K = 2, eager: the small engine the bench modes' tests drive."""
    return LLM(
        "smollm2-135m-instruct",
        method="ngram",
        num_speculative_tokens=2,
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        max_num_batched_tokens=max_num_batched_tokens,
        enforce_eager=True,
    )
