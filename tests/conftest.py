"""Shared fixtures: the real SmolLM2 (converted once per machine into the user cache) and tiny random pairs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from tests.tiny import write_tiny_model

# The suite runs the eager step unless a test asks for the compiled one (tests/models/test_compiled.py,
# tests/test_real_model.py): compiling each of the suite's hundreds of engines would take hours. Servers and
# commands the tests start inherit this too.
os.environ.setdefault("SPECDECODE_ENFORCE_EAGER", "1")


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    from specdecode.models.loader import resolve_model_dir

    return resolve_model_dir("smollm2-135m-instruct", progress=False)


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_dir):
    return AutoTokenizer.from_pretrained(smollm2_dir)


def _tiny_with_tokenizer(path: Path, tokenizer, **kwargs) -> Path:
    write_tiny_model(path, **kwargs)
    tokenizer.save_pretrained(path)  # only token ids < vocab_size occur; the tokenizer just renders them
    return path


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory, smollm2_tokenizer) -> Path:
    return _tiny_with_tokenizer(tmp_path_factory.mktemp("tiny_target"), smollm2_tokenizer, seed=0)


@pytest.fixture(scope="session")
def tiny_draft(tmp_path_factory, smollm2_tokenizer) -> Path:
    """A different random model of the same vocabulary: it agrees with the target only sometimes."""
    return _tiny_with_tokenizer(tmp_path_factory.mktemp("tiny_draft"), smollm2_tokenizer, seed=1, num_hidden_layers=1)
