"""Shared fixtures: the real SmolLM2 (converted once per machine into the user cache) and tiny random pairs."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from tests.tiny import write_tiny_model

# The suite runs the eager step unless a test asks for the compiled one (tests/models/test_compiled.py,
# tests/test_real_model.py): compiling each of the suite's hundreds of engines would take hours. Servers and
# commands the tests start inherit this too.
os.environ.setdefault("SPECDECODE_ENFORCE_EAGER", "1")


@pytest.fixture(scope="session", autouse=True)
def keep_every_step_package():
    """The suite compiles about a dozen steps into the user's cache (tiny models with and without the few-rows
    GEMM, SmolLM2's quantized, int8 and fp32 steps, the pair) and comes back to some of them across files:
    with the four packages a user keeps (models/aot_package.py MAX_PACKAGES), tests/server/test_compiled_server
    found the tiny target's package pruned by the files in between and compiled it again (~20 s). For the
    session, none is pruned (they are a few MB each, SmolLM2's fp32 one ~0.6 GB); a test that passes its own
    limit (test_aot_package's prune test) still gets it, and a user's next compile prunes down to four."""
    from specdecode.models import aot_package

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(aot_package, "prune", functools.partial(aot_package.prune, max_packages=1000))
        yield


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
