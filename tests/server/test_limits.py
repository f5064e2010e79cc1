"""Bounds on what one request may ask for (ServerConfig, the one place they are set): just under each is
served, just over is a 400 with an OpenAI error body. Schemas compile off the event loop within a time bound,
and tokenizing and the chat template run off it too: /health answers while either is stuck. In process, over
a tiny model with SmolLM2's vocabulary.
"""

from __future__ import annotations

import json
import threading

import pytest
from fastapi.testclient import TestClient

import specdecode.grammar
from specdecode.llm import LLM
from specdecode.server.app import Server, ServerConfig, build_app

MODEL = "tiny"
BOUNDS = dict(
    max_stop_strings=2,
    max_stop_chars=8,
    max_logit_bias=3,
    max_messages=3,
    max_schema_bytes=300,
    max_schema_depth=4,
    max_schema_enum=3,
    max_schema_repeat=8,
)
COMPLETION = {"model": MODEL, "prompt": "Hello there", "max_tokens": 4, "temperature": 0}
USER = {"role": "user", "content": "hi"}
CHAT = {"model": MODEL, "messages": [USER], "max_tokens": 6, "temperature": 0}
BLOCKED_S = 60  # how long a stuck compile or template waits to be released before giving up (never, if it works)


@pytest.fixture(scope="module")
def llm(tiny_full_vocab) -> LLM:
    return LLM(target=str(tiny_full_vocab), method="ngram", num_speculative_tokens=3, max_model_len=256)


@pytest.fixture(scope="module")
def client(llm):
    asgi, _ = build_app(llm, ServerConfig(MODEL, **BOUNDS))
    with TestClient(asgi) as c:
        yield c


def schema_format(schema: dict) -> dict:
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}}


def nested_arrays(depth: int) -> dict:
    """A schema whose JSON nests `depth` levels deep: arrays of arrays ... of integers."""
    schema = {"type": "integer"}
    for _ in range(depth - 1):
        schema = {"type": "array", "items": schema}
    return schema


def padded(size: int) -> dict:
    """An object schema exactly `size` bytes long as JSON."""
    schema = {"type": "object", "description": ""}
    schema["description"] = "x" * (size - len(json.dumps(schema)))
    assert len(json.dumps(schema)) == size
    return schema


def string_schema(**string) -> dict:
    return {"type": "object", "properties": {"s": {"type": "string", **string}}, "required": ["s"]}


def schema_case(under: dict, over: dict) -> tuple[str, dict, dict, str]:
    return "chat", schema_format(under), schema_format(over), "response_format"


def bias(n: int) -> dict:
    return {"logit_bias": {str(i): 1 for i in range(1, n + 1)}}


# (endpoint, body just under the bound, body just over it, the param the 400 names)
CASES = {
    "stop strings": ("c", {"stop": ["a", "b"]}, {"stop": ["a", "b", "c"]}, "stop"),
    "stop length": ("c", {"stop": "x" * 8}, {"stop": ["x" * 9]}, "stop"),
    "logit_bias": ("c", bias(3), bias(4), "logit_bias"),
    "messages": ("chat", {"messages": [USER] * 3}, {"messages": [USER] * 4}, "messages"),
    "schema bytes": schema_case(padded(300), padded(301)),
    "schema depth": schema_case(nested_arrays(4), nested_arrays(5)),
    "enum": schema_case({"enum": ["a", "b", "c"]}, {"enum": ["a", "b", "c", "d"]}),
    "maxLength": schema_case(string_schema(maxLength=8), string_schema(maxLength=9)),
    "minLength": schema_case(string_schema(minLength=8), string_schema(minLength=9)),
    "pattern": schema_case(string_schema(pattern="^a{1,8}$"), string_schema(pattern="^a{9}$")),
}


def post(client: TestClient, endpoint: str, extra: dict):
    if endpoint == "chat":
        return client.post("/v1/chat/completions", json={**CHAT, **extra})
    return client.post("/v1/completions", json={**COMPLETION, **extra})


@pytest.mark.parametrize("case", list(CASES))
def test_just_under_a_bound_is_served_just_over_is_400(client, case):
    endpoint, under, over, param = CASES[case]
    assert post(client, endpoint, under).status_code == 200, post(client, endpoint, under).text
    r = post(client, endpoint, over)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["param"] == param


def test_depth_counts_every_level():
    """Guard on the cases above: the two depth schemas straddle the bound as the test's own count says."""

    def depth(node) -> int:  # objects and arrays nested in one another; the schema itself is level 1
        if not isinstance(node, (dict, list)):
            return 0
        return 1 + max((depth(c) for c in (node.values() if isinstance(node, dict) else node)), default=0)

    assert (depth(nested_arrays(4)), depth(nested_arrays(5))) == (4, 5)


def test_defaults_are_bounded():
    config = ServerConfig(MODEL)
    assert config.max_stop_strings == 4 and config.max_logit_bias == 300  # OpenAI's limits
    assert 0 < config.max_schema_repeat <= 4096 and 0 < config.grammar_timeout_s <= 60
    assert specdecode.grammar.CACHE_BYTES > 0  # xgrammar's compiler cache is unbounded at -1


class Stuck:
    """Wraps a function so that its next call signals `entered` and waits for `release` (BLOCKED_S at most);
    `order` records when it returned, beside what the test records."""

    def __init__(self, fn, wait_s: float = BLOCKED_S) -> None:
        self.fn, self.entered, self.release, self.order = fn, threading.Event(), threading.Event(), []
        self.wait_s = wait_s

    def __call__(self, *args, **kwargs):
        if not self.release.is_set():
            self.entered.set()
            self.release.wait(self.wait_s)
            self.order.append("stuck call returned")
        return self.fn(*args, **kwargs)


def health_while_stuck(client: TestClient, stuck: Stuck, endpoint: str, extra: dict) -> int:
    """Send a request that gets stuck, ask /health meanwhile, then release it; the request's status."""
    result = {}
    sender = threading.Thread(target=lambda: result.update(r=post(client, endpoint, extra)))
    sender.start()
    try:
        assert stuck.entered.wait(BLOCKED_S), "the request never reached the stuck call"
        assert client.get("/health").status_code == 200
        stuck.order.append("health answered")
    finally:
        stuck.release.set()
        sender.join(BLOCKED_S)
    assert stuck.order == ["health answered", "stuck call returned"]
    return result["r"].status_code


def test_health_answers_while_a_schema_compiles(client, monkeypatch):
    stuck = Stuck(specdecode.grammar.GrammarCompiler.compile_json)
    monkeypatch.setattr(specdecode.grammar.GrammarCompiler, "compile_json", lambda self, schema: stuck(self, schema))
    schema = {"type": "object", "properties": {"slow": {"type": "integer"}}, "required": ["slow"]}
    assert health_while_stuck(client, stuck, "chat", schema_format(schema)) == 200


def test_compiling_on_the_event_loop_is_caught(client, monkeypatch):
    """Fault: the schema compiles on the event loop, as it did. /health waits until the compile gives up waiting,
    and the same order check fails."""

    async def on_the_loop(self, ids, params):
        self.llm.check_request(ids, params)

    monkeypatch.setattr(Server, "compile_bounded", on_the_loop)
    stuck = Stuck(specdecode.grammar.GrammarCompiler.compile_json, wait_s=2)
    monkeypatch.setattr(specdecode.grammar.GrammarCompiler, "compile_json", lambda self, schema: stuck(self, schema))
    schema = {"type": "object", "properties": {"blocking": {"type": "integer"}}, "required": ["blocking"]}
    with pytest.raises(AssertionError, match="stuck call returned"):
        health_while_stuck(client, stuck, "chat", schema_format(schema))


def test_health_answers_while_the_chat_template_runs(client, llm, monkeypatch):
    stuck = Stuck(llm.apply_chat_template)
    monkeypatch.setattr(llm, "apply_chat_template", stuck)
    assert health_while_stuck(client, stuck, "chat", {}) == 200


def test_health_answers_while_a_prompt_is_tokenized(client, llm, monkeypatch):
    stuck = Stuck(llm.encode)
    monkeypatch.setattr(llm, "encode", stuck)
    assert health_while_stuck(client, stuck, "c", {}) == 200


def test_schema_past_the_time_bound_is_400(llm, monkeypatch):
    stuck = Stuck(specdecode.grammar.GrammarCompiler.compile_json)
    monkeypatch.setattr(specdecode.grammar.GrammarCompiler, "compile_json", lambda self, schema: stuck(self, schema))
    asgi, _ = build_app(llm, ServerConfig(MODEL, grammar_timeout_s=0.2))
    schema = {"type": "object", "properties": {"late": {"type": "integer"}}, "required": ["late"]}
    with TestClient(asgi) as c:
        try:
            r = post(c, "chat", schema_format(schema))
        finally:
            stuck.release.set()
        assert r.status_code == 400, r.text
        assert "did not compile within" in r.json()["error"]["message"]
        assert r.json()["error"]["param"] == "response_format"
        assert stuck.entered.is_set()
        assert post(c, "chat", schema_format(schema)).status_code == 200  # once compiled (and cached), served
