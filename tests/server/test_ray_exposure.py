"""What the Ray cluster behind `serve --replicas` exposes: the local one listens on loopback alone (GCS, raylet,
agents, workers, Serve's controller and proxy) with Ray's token authentication on, and the API key never
travels in the job's environment (a joined cluster's workers would all see it)."""

from __future__ import annotations

import os
import socket

import psutil
import pytest

from tests.listeners import is_loopback, tcp_listeners

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")

from ray._private import ray_constants  # noqa: E402 - after the guard: these import ray
from ray._raylet import AuthenticationMode, get_authentication_mode  # noqa: E402

from specdecode.server import ray_app  # noqa: E402


def test_worker_env_never_carries_the_api_key(monkeypatch):
    monkeypatch.setenv("SPECDECODE_API_KEY", "sk-secret")
    monkeypatch.setenv("SPECDECODE_CACHE", "/somewhere")
    env = ray_app.worker_env()
    assert "sk-secret" not in env.values() and "SPECDECODE_API_KEY" not in env
    assert env["SPECDECODE_CACHE"] == "/somewhere"  # the other settings still travel


@pytest.fixture
def local_cluster():
    """`connect(None)` as `serve --replicas` makes it, with Serve's controller and proxy started, from an
    environment that turned Ray's token authentication off; this process's environment and Ray's import-time
    switch restored after."""
    environ, switch = os.environ.copy(), ray_constants.ENABLE_RAY_CLUSTER
    os.environ["RAY_AUTH_MODE"] = "disabled"
    ray_app.connect(None, num_cpus=1)
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        yield
    finally:
        serve.shutdown()
        ray_app.disconnect(False)
        os.environ.clear()
        os.environ.update(environ)
        ray_constants.ENABLE_RAY_CLUSTER = switch


def test_local_cluster_listens_on_loopback_only_with_token_auth(local_cluster):
    @ray.remote
    def worker_pid() -> int:
        return os.getpid()

    assert get_authentication_mode() == AuthenticationMode.TOKEN
    task_worker = ray.get(worker_pid.remote())
    pids = [os.getpid(), *(p.pid for p in psutil.Process().children(recursive=True))]
    assert task_worker in pids  # the check below covers the workers too
    listeners = tcp_listeners(pids)
    names = {pid: psutil.Process(pid).name() for pid, _ in listeners if pid != os.getpid()}
    assert {"gcs_server", "raylet"} <= set(names.values()), names  # the check saw Ray's own servers
    assert [(names.get(pid), a) for pid, a in listeners if not is_loopback(a)] == []
