"""OpenAI-style errors with the right status; the server keeps serving after each."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.server.conftest import MODEL

GOOD = {"model": MODEL, "prompt": "Hello", "max_tokens": 2, "temperature": 0}


def post(server, body, path: str = "/v1/completions", **kwargs) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=60, **kwargs)


def assert_error(r: httpx.Response, status: int, words: str) -> None:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert words in err["message"]


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({**GOOD, "max_tokens": "many"}, 400, "max_tokens"),
        ({**GOOD, "temperature": -1}, 400, "temperature"),
        ({"prompt": "Hello"}, 400, "model"),
        ({**GOOD, "model": "gpt-4"}, 404, "does not exist"),
        ({**GOOD, "n": 17}, 400, "n"),
        ({**GOOD, "logprobs": 21}, 400, "logprobs"),
        ({**GOOD, "echo": True}, 400, "echo"),
        ({**GOOD, "presence_penalty": 2.5}, 400, "presence_penalty"),
        ({**GOOD, "frequency_penalty": -3}, 400, "frequency_penalty"),
        ({**GOOD, "repetition_penalty": 0}, 400, "repetition_penalty"),
        ({**GOOD, "logit_bias": {"5": 101}}, 400, "logit_bias"),
        ({**GOOD, "logit_bias": {"word": 1}}, 400, "logit_bias keys must be token ids"),
        ({**GOOD, "logit_bias": {"99999999": 1}}, 400, "logit_bias keys must be token ids in 0.."),
        ({**GOOD, "best_of": 3}, 400, "best_of"),
        ({**GOOD, "frobnicate": 1}, 400, "frobnicate"),
        ({**GOOD, "prompt": ""}, 400, "prompt"),
        ({**GOOD, "prompt": [1, 2, 10**9]}, 400, "token ids"),
        ({**GOOD, "prompt": ["a", "b"]}, 400, "batched prompts"),
        ({**GOOD, "prompt": "word " * 1100}, 400, "maximum context length is 1024"),
        ({**GOOD, "max_tokens": 5000}, 400, "maximum context length is 1024"),
        ({**GOOD, "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ],
)
def test_completion_errors(server, body, status, words):
    assert_error(post(server, body), status, words)


def test_chat_errors(server):
    chat = {"model": MODEL, "max_tokens": 2}
    assert_error(post(server, {**chat, "messages": []}, "/v1/chat/completions"), 400, "messages")
    bad_role = {**chat, "messages": [{"role": "robot", "content": "hi"}]}
    assert_error(post(server, bad_role, "/v1/chat/completions"), 400, "role")
    tools = {**chat, "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}
    assert_error(post(server, tools, "/v1/chat/completions"), 400, "tools")
    hi = {**chat, "messages": [{"role": "user", "content": "hi"}]}
    bad_schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}
    for body, words in [
        ({**hi, "response_format": bad_schema}, "schema"),
        ({**hi, "response_format": {"type": "xml"}}, "response_format"),
        ({**hi, "response_format": {"type": "json_schema"}}, "needs a json_schema"),
        ({**hi, "top_logprobs": 2}, "top_logprobs needs logprobs"),
        ({**hi, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ]:
        assert_error(post(server, body, "/v1/chat/completions"), 400, words)
    assert post(server, hi, "/v1/chat/completions").status_code == 200  # still serving


def test_malformed_json_and_oversized_body(server):
    r = httpx.post(server.url + "/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert_error(r, 400, "invalid request")
    assert_error(post(server, {**GOOD, "prompt": "x" * (5 * 1024 * 1024)}), 413, "request body over")
    assert_error(httpx.get(server.url + "/v1/nothing"), 404, "Not Found")
    assert post(server, GOOD).status_code == 200  # still serving


def test_client_sees_openai_exceptions(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="hi", max_tokens=1)
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.completions.create(model=MODEL, prompt="hi", max_tokens=10_000)


def test_api_key(small_server):
    headers = {"authorization": "Bearer sekrit"}
    assert_error(post(small_server, GOOD), 401, "API key")
    assert_error(post(small_server, GOOD, headers={"authorization": "Bearer wrong"}), 401, "API key")
    assert post(small_server, GOOD, headers=headers).status_code == 200
    assert httpx.get(small_server.url + "/health").status_code == 200  # health and metrics stay open
    client = openai.OpenAI(base_url=small_server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        client.models.list()
