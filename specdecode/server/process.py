"""`specdecode serve` as a child process on a free localhost port: for benchmarks and tests."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from specdecode.config import ConfigError


class LiveServer:
    """Started on creation; `url` answers once `wait_healthy()` (or entering the `with` block) returns."""

    def __init__(self, flags: list[str], log: Path, start_timeout_s: float = 300.0) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.start_timeout_s = start_timeout_s
        cmd = [sys.executable, "-m", "specdecode.cli", "serve", "--port", str(self.port), "--log-level", "warning"]
        self.proc = subprocess.Popen(cmd + flags, stdout=log.open("w"), stderr=subprocess.STDOUT)

    def wait_healthy(self) -> LiveServer:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ConfigError(f"server exited with {self.proc.returncode}: {self._log_tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.stop()
        raise ConfigError(f"server did not become healthy within {self.start_timeout_s:g} s: {self._log_tail()}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()

    def _log_tail(self, lines: int = 20) -> str:
        return " | ".join(self.log.read_text().strip().splitlines()[-lines:])

    def __enter__(self) -> LiveServer:
        try:
            return self.wait_healthy()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()
