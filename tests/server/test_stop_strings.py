"""A stop string that spans two engine steps never reaches the client, streamed or not: the reply is the full
text cut at the stop string, as the offline LLM gives it. (The server builds replies from the engine's deltas;
those had already sent "wise" before " old" completed the stop string.) In process, over the real SmolLM2 with
n-gram speculation; every drafter: tests/engine/test_stopping.py.
"""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from specdecode.config import SamplingParams
from specdecode.llm import LLM
from specdecode.server.app import ServerConfig, build_app

PROMPT = "Once upon a time, in a small village by the sea,"
STOP = "wise old"


@pytest.fixture(scope="module")
def client(smollm2_dir):
    llm = LLM(target=str(smollm2_dir), method="ngram", num_speculative_tokens=4, max_num_seqs=2, max_model_len=256)
    asgi, _ = build_app(llm, ServerConfig("smollm2"))
    with TestClient(asgi) as c:
        yield c


def completion(client: TestClient, stream: bool) -> str:
    body = {"model": "smollm2", "prompt": PROMPT, "max_tokens": 16, "temperature": 0, "stop": [STOP], "stream": stream}
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    if not stream:
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "stop"
        return choice["text"]
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    assert events[-1]["choices"][0]["finish_reason"] == "stop"
    return "".join(e["choices"][0]["text"] for e in events)


@pytest.fixture(scope="module")
def want(reference_llm) -> str:
    """The offline greedy text cut at the stop string by hand; the offline LLM's stop gives the same."""
    full = reference_llm.generate(PROMPT, SamplingParams(max_tokens=16))[0].text
    assert STOP in full, "greedy SmolLM2 must say the stop string for this test to check anything"
    cut = full[: full.index(STOP)]
    assert cut == " there was a "
    assert reference_llm.generate(PROMPT, SamplingParams(max_tokens=16, stop=[STOP]))[0].text == cut
    return cut


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string_spanning_steps_is_cut(client, want, stream):
    assert completion(client, stream) == want
