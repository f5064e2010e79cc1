"""Real server processes on free localhost ports, and the offline LLM they are compared with."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.tiny import write_tiny_model

MODEL = "smollm2"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """`specdecode serve` as a child process; `url` is its base URL once /health answers."""

    def __init__(self, target: Path, *flags: str, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "specdecode.cli", "serve", "--target", str(target), "--port", str(self.port)]
        cmd += ["--served-model-name", MODEL, "--log-level", "warning", *flags]
        self.log = log
        self.proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=os.environ.copy())
        self._wait_healthy()

    def _wait_healthy(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log.read_text()}")
            try:
                if httpx.get(self.url + "/health", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"server did not become healthy:\n{self.log.read_text()}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _serve(tmp_path_factory, target: Path, *flags: str) -> Iterator[ServerProcess]:
    server = ServerProcess(target, *flags, log=tmp_path_factory.mktemp("server") / "server.log")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def server(tmp_path_factory, smollm2_dir) -> Iterator[ServerProcess]:
    """The real SmolLM2 with n-gram speculation, room for 64 concurrent clients."""
    flags = ["--max-num-seqs", "16", "--max-queue", "64", "--max-model-len", "1024", "--num-speculative-tokens", "4"]
    yield from _serve(tmp_path_factory, smollm2_dir, *flags)


@pytest.fixture(scope="session")
def small_server(tmp_path_factory, smollm2_dir) -> Iterator[ServerProcess]:
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
