"""The API key: a wrong one is a 401 whatever its characters (a non-ASCII one was a 500). In process, over a
tiny model with SmolLM2's vocabulary; the live server's key checks are in test_errors.py."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from specdecode.llm import LLM
from specdecode.server.app import ServerConfig, build_app

COMPLETION = {"model": "tiny", "prompt": "Hello there", "max_tokens": 2, "temperature": 0}


@pytest.fixture(scope="module")
def client(tiny_full_vocab):
    llm = LLM(target=str(tiny_full_vocab), method="none", max_model_len=128)
    asgi, _ = build_app(llm, ServerConfig("tiny", api_key="sekrit"))
    with TestClient(asgi) as c:
        yield c


@pytest.mark.parametrize("token", ["sékrit", "sekrit☃", "секрет", "sekrit"])
def test_a_non_ascii_api_key_is_401(client, token):
    """compare_digest on str raised TypeError for non-ASCII, which the handler turned into a 500."""
    r = client.post("/v1/completions", json=COMPLETION, headers={"authorization": f"Bearer {token}".encode()})
    if token == "sekrit":
        assert r.status_code == 200
    else:
        assert r.status_code == 401, r.text
        assert r.json()["error"]["code"] == "invalid_api_key"
