"""Real server processes on free localhost ports, and the offline LLM they are compared with."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from specdecode.server.process import LiveServer
from tests.tiny import write_tiny_model

MODEL = "smollm2"


def start_server(target: Path, *flags: str, log: Path) -> LiveServer:
    """A healthy `specdecode serve` of `target` under the test model name."""
    return LiveServer(
        ["--target", str(target), "--served-model-name", MODEL, *flags], log, start_timeout_s=120
    ).wait_healthy()


def _serve(tmp_path_factory, target: Path, *flags: str) -> Iterator[LiveServer]:
    server = start_server(target, *flags, log=tmp_path_factory.mktemp("server") / "server.log")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def server(tmp_path_factory, smollm2_dir) -> Iterator[LiveServer]:
    """The real SmolLM2 with n-gram speculation, room for 64 concurrent clients."""
    flags = ["--max-num-seqs", "16", "--max-queue", "64", "--max-model-len", "1024", "--num-speculative-tokens", "4"]
    yield from _serve(tmp_path_factory, smollm2_dir, *flags)


@pytest.fixture(scope="session")
def small_server(tmp_path_factory, smollm2_dir) -> Iterator[LiveServer]:
    """One slot and one queue place, behind an API key: capacity is easy to exhaust."""
    flags = ["--max-num-seqs", "1", "--max-queue", "1", "--max-model-len", "2048", "--api-key", "sekrit"]
    yield from _serve(tmp_path_factory, smollm2_dir, *flags)


@pytest.fixture(scope="session")
def tiny_full_vocab(tmp_path_factory, smollm2_tokenizer) -> Path:
    """A tiny random model with SmolLM2's whole vocabulary: any text is a valid prompt, decoding is fast."""
    path = tmp_path_factory.mktemp("tiny_full_vocab")
    write_tiny_model(path, vocab_size=len(smollm2_tokenizer), embed_scale=3.0)
    smollm2_tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def reference_llm(smollm2_dir):
    from specdecode.llm import LLM

    return LLM(target=str(smollm2_dir), method="none", max_num_seqs=16, max_model_len=1024)
