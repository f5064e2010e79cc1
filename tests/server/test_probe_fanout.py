"""/health and /metrics under `serve --replicas` ask every replica; unauthenticated probes at any rate must not
multiply that work: concurrent probes and probes within a second share one fan-out (server/ingress.py)."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("ray")
from specdecode.server import ingress  # noqa: E402
from specdecode.server.ingress import RemoteEngine  # noqa: E402


class Replicas:
    """A stand-in for the replicas' deployment handle: counts broadcasts, answers after a short delay."""

    def __init__(self) -> None:
        self.broadcasts = 0

    def broadcast(self, method: str):
        self.broadcasts += 1
        replicas = self

        class Response:
            async def results_async(self, timeout_s: float, return_exceptions: bool):
                await asyncio.sleep(0.05)
                return [{"status": "ok", "n": replicas.broadcasts}]

        return Response()


async def probe_storm(engine: RemoteEngine, probes: int) -> list:
    return await asyncio.gather(*(engine.ask_all("health") for _ in range(probes)))


def fan_outs(probes: int, rounds: int) -> int:
    replicas = Replicas()
    engine = RemoteEngine(replicas, capacity=8)

    async def run() -> None:
        for _ in range(rounds):
            answers = await probe_storm(engine, probes)
            assert all(a == answers[0] for a in answers)  # every probe of a storm got the same answer

    asyncio.run(run())
    return replicas.broadcasts


def test_probes_share_one_fan_out():
    assert fan_outs(probes=200, rounds=3) == 1  # three storms within a second: one fan-out


def test_probes_after_the_ttl_ask_again(monkeypatch):
    monkeypatch.setattr(ingress, "PROBE_TTL_S", 0.0)
    assert fan_outs(probes=5, rounds=3) == 3


def test_control_without_sharing_every_probe_fans_out(monkeypatch):
    """Fault: the old ask_all, one broadcast per probe."""

    async def unshared(self, method):
        return await self._broadcast(method)

    monkeypatch.setattr(RemoteEngine, "ask_all", unshared)
    with pytest.raises(AssertionError):
        test_probes_share_one_fan_out()
