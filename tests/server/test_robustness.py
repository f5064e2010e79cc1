"""In-process: a failing engine step fails its batch with 500 and the loop goes on; a slow request times out
with 504 and is aborted."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient

from specdecode.llm import LLM
from specdecode.server.app import ServerConfig, build_app

BODY = {"model": "tiny", "prompt": "Hello there", "max_tokens": 6, "temperature": 0}


@pytest.fixture()
def llm(tiny_full_vocab) -> LLM:
    return LLM(target=str(tiny_full_vocab), method="ngram", num_speculative_tokens=3, max_model_len=256)


def test_failing_step_gives_500_and_the_server_keeps_serving(llm, monkeypatch):
    """A failure of the shared forward (not attributable to one request) fails its batch, once."""
    asgi, _ = build_app(llm, ServerConfig("tiny"))
    forward = llm.target.forward
    calls = {"n": 0}

    def forward_failing_once(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("target exploded")
        return forward(*args, **kwargs)

    monkeypatch.setattr(llm.target, "forward", forward_failing_once)
    with TestClient(asgi) as client:
        r = client.post("/v1/completions", json=BODY)
        assert r.status_code == 500
        assert "target exploded" in r.json()["error"]["message"]
        assert client.get("/health").json()["last_step_failure"] == "RuntimeError: target exploded"
        ok = client.post("/v1/completions", json=BODY)
        assert ok.status_code == 200
        assert ok.json()["usage"]["completion_tokens"] == 6
        assert llm.engine.cache.num_free == llm.engine_config.max_num_seqs  # nothing leaked


def test_timeout_gives_504_and_frees_the_slot(llm, monkeypatch):
    asgi, _ = build_app(llm, ServerConfig("tiny", request_timeout_s=0.5))
    propose = llm.engine.drafter.propose

    def slow_propose(*args, **kwargs):
        time.sleep(0.05)
        return propose(*args, **kwargs)

    monkeypatch.setattr(llm.engine.drafter, "propose", slow_propose)
    with TestClient(asgi) as client:
        r = client.post("/v1/completions", json={**BODY, "max_tokens": 200, "ignore_eos": True})
        assert r.status_code == 504
        assert r.json()["error"]["type"] == "timeout_error"
        deadline = time.monotonic() + 5
        while llm.engine.has_work() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not llm.engine.has_work()
        assert llm.engine.cache.num_free == llm.engine_config.max_num_seqs
