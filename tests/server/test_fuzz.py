"""Schemathesis fuzzes the API from the server's own /openapi.json: never a 5xx, never a hang; behind --api-key,
the same with the key, and without it every /v1 request is a 401 (never a 500 nor an answer).

Generation is derandomized (the same cases every run), so a failure here reproduces. The negative controls fuzz
an in-process app with a planted bug, and one whose key check is bypassed, and must find them.
"""

from __future__ import annotations

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings

from specdecode.llm import LLM
from specdecode.server.app import Server, ServerConfig, build_app
from tests.server.conftest import MODEL, start_server

PATHS = {"/v1/completions", "/v1/chat/completions", "/v1/models"}
API_KEY = "fuzz-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}


def fuzz_operation(
    op, max_examples: int, found: list[str], headers: dict | None, must_be: int | None, timeout_s: float
) -> None:
    """Fuzz one operation with `headers`; record 5xx responses, hangs and, with `must_be`, any other status."""

    @given(case=op.as_strategy())
    @settings(
        max_examples=max_examples,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
        derandomize=True,  # the same cases every run: a failure reproduces
    )
    def call(case) -> None:
        if isinstance(case.body, dict) and "model" in case.body:
            case.body["model"] = MODEL  # else nearly every case stops at the 404 for an unknown model
        try:
            response = case.call(timeout=timeout_s, headers=headers)
        except Exception as e:  # noqa: BLE001 - a hang (timeout) or, in process, the server's own exception
            found.append(f"{op.method} {op.path}: raised {type(e).__name__}: {e}")
            return
        if response.status_code >= 500 or must_be not in (None, response.status_code):
            found.append(f"{op.method} {op.path}: {response.status_code} {response.text[:200]}")

    call()


def server_errors(
    schema, max_examples: int, headers: dict | None = None, unauthenticated: bool = False, timeout_s: float = 30
) -> list[str]:
    """Fuzz every operation; the 5xx responses seen and, `unauthenticated` behind a key, /v1 answers not 401."""
    found: list[str] = []
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= PATHS
    for op in operations:
        must_be = 401 if unauthenticated and op.path.startswith("/v1/") else None
        fuzz_operation(op, max_examples, found, headers, must_be, timeout_s)
    return found


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory, tiny_full_vocab):
    flags = ["--max-model-len", "64", "--request-timeout", "20", "--max-num-seqs", "4"]
    server = start_server(tiny_full_vocab, *flags, log=tmp_path_factory.mktemp("fuzz") / "server.log")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory, tiny_full_vocab):
    """Behind a key. Its runs are about the key, so the request timeout is generous (on two cores shared with
    other jobs an empty chat took up to 20 s, fuzz_server's timeout, and came back a 504)."""
    flags = ["--max-model-len", "64", "--request-timeout", "120", "--max-num-seqs", "4", "--api-key", API_KEY]
    server = start_server(tiny_full_vocab, *flags, log=tmp_path_factory.mktemp("fuzz_auth") / "server.log")
    yield server
    server.stop()


def test_no_server_errors(fuzz_server):
    schema = schemathesis.openapi.from_url(fuzz_server.url + "/openapi.json")
    assert server_errors(schema, max_examples=60) == []


def test_behind_an_api_key_no_server_errors_and_401_without_it(auth_server):
    schema = schemathesis.openapi.from_url(auth_server.url + "/openapi.json")
    assert server_errors(schema, max_examples=40, headers=AUTH, timeout_s=150) == []
    assert server_errors(schema, max_examples=20, unauthenticated=True) == []
    wrong = {"Authorization": "Bearer not-the-key"}
    assert server_errors(schema, max_examples=10, headers=wrong, unauthenticated=True) == []


def test_fuzzing_finds_a_planted_bug(tiny_full_vocab, monkeypatch):
    llm = LLM(target=str(tiny_full_vocab), max_model_len=64)
    asgi, app = build_app(llm, ServerConfig(MODEL))
    server = app.state.server
    encode = server.encode

    async def buggy_encode(text: str) -> list[int]:  # Server.encode tokenizes off the event loop
        ids = await encode(text)
        if len(ids) % 2:
            raise RuntimeError("planted bug")
        return ids

    monkeypatch.setattr(server, "encode", buggy_encode)
    with TestClient(asgi):  # runs the lifespan: the engine loop starts
        schema = schemathesis.openapi.from_asgi("/openapi.json", asgi)
        found = server_errors(schema, max_examples=30)
    assert any("planted bug" in f for f in found)


def test_fuzzing_finds_a_bypassed_key_check(tiny_full_vocab, monkeypatch):
    """Negative control of the 401 check: with the key check bypassed, unauthenticated requests get answers."""
    monkeypatch.setattr(Server, "check_auth", lambda self, request: None)
    llm = LLM(target=str(tiny_full_vocab), max_model_len=64, controller="fixed")
    asgi, _ = build_app(llm, ServerConfig(MODEL, api_key=API_KEY))
    with TestClient(asgi):
        schema = schemathesis.openapi.from_asgi("/openapi.json", asgi)
        found = server_errors(schema, max_examples=10, unauthenticated=True)
    assert any(": 200 " in f for f in found)  # answered without the key
