"""Schemathesis fuzzes the API from the server's own /openapi.json: never a 5xx, never a hang.

The negative control fuzzes an in-process app with a planted bug and must find the 500.
"""

from __future__ import annotations

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings

from specdecode.llm import LLM
from specdecode.server.app import ServerConfig, build_app
from tests.server.conftest import MODEL, start_server

PATHS = {"/v1/completions", "/v1/chat/completions", "/v1/models"}


def fuzz_operation(op, max_examples: int, found: list[str]) -> None:
    @given(case=op.as_strategy())
    @settings(max_examples=max_examples, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def call(case) -> None:
        if isinstance(case.body, dict) and "model" in case.body:
            case.body["model"] = MODEL  # else nearly every case stops at the 404 for an unknown model
        try:
            response = case.call(timeout=30)
        except Exception as e:  # noqa: BLE001 - a hang (timeout) or, in process, the server's own exception
            found.append(f"{op.method} {op.path}: raised {type(e).__name__}: {e}")
            return
        if response.status_code >= 500:
            found.append(f"{op.method} {op.path}: {response.status_code} {response.text[:200]}")

    call()


def server_errors(schema, max_examples: int) -> list[str]:
    """Fuzz every operation; the 5xx responses seen."""
    found: list[str] = []
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= PATHS
    for op in operations:
        fuzz_operation(op, max_examples, found)
    return found


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory, tiny_full_vocab):
    flags = ["--max-model-len", "64", "--request-timeout", "20", "--max-num-seqs", "4"]
    server = start_server(tiny_full_vocab, *flags, log=tmp_path_factory.mktemp("fuzz") / "server.log")
    yield server
    server.stop()


def test_no_server_errors(fuzz_server):
    schema = schemathesis.openapi.from_url(fuzz_server.url + "/openapi.json")
    assert server_errors(schema, max_examples=60) == []


def test_fuzzing_finds_a_planted_bug(tiny_full_vocab, monkeypatch):
    llm = LLM(target=str(tiny_full_vocab), max_model_len=64)
    asgi, app = build_app(llm, ServerConfig(MODEL))
    server = app.state.server
    encode = server.encode

    def buggy_encode(text: str) -> list[int]:
        ids = encode(text)
        if len(ids) % 2:
            raise RuntimeError("planted bug")
        return ids

    monkeypatch.setattr(server, "encode", buggy_encode)
    with TestClient(asgi):  # runs the lifespan: the engine loop starts
        schema = schemathesis.openapi.from_asgi("/openapi.json", asgi)
        found = server_errors(schema, max_examples=30)
    assert any("planted bug" in f for f in found)
