"""The official openai client against a real server: completions and chat, streaming or not, sync and async."""

from __future__ import annotations

import asyncio

import openai
import pytest

from specdecode.config import SamplingParams
from tests.server.conftest import MODEL

PROMPT = "The three primary colors are"
CHAT = [{"role": "user", "content": "List three fruits, one per line."}]


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_models_lists_the_served_name(client):
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_completion_equals_offline_greedy(client, reference_llm):
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0)
    want = reference_llm.generate(PROMPT, SamplingParams(max_tokens=24))[0]
    assert r.choices[0].text == want.text
    assert r.choices[0].finish_reason == want.finish_reason
    assert r.usage.completion_tokens == len(want.token_ids)
    assert r.usage.prompt_tokens == len(want.prompt_token_ids)
    spec = r.usage.model_extra["speculative"]
    assert spec["target_forwards"] <= r.usage.completion_tokens
    assert spec["accepted_tokens"] <= spec["drafted_tokens"]


def test_completion_from_token_ids(client, reference_llm):
    ids = reference_llm.encode(PROMPT)
    by_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=8, temperature=0)
    by_text = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0)
    assert by_ids.choices[0].text == by_text.choices[0].text


def test_streamed_completion_equals_non_streamed(client):
    full = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=20, temperature=0)
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=20, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == full.choices[0].text
    assert chunks[-1].choices[0].finish_reason == full.choices[0].finish_reason
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])


def test_chat_equals_offline_chat(client, reference_llm):
    r = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=24, temperature=0)
    want = reference_llm.chat(CHAT, SamplingParams(max_tokens=24))[0]
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == want.text


def test_chat_stream_with_usage(client):
    stream = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=16, temperature=0, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = chunks[-1].usage
    assert chunks[-1].choices == []
    full = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=16, temperature=0)
    assert text == full.choices[0].message.content
    assert usage.completion_tokens == full.usage.completion_tokens


def test_async_client_and_seeded_sampling(server):
    async def run() -> list[str]:
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        kwargs = dict(model=MODEL, messages=CHAT, max_tokens=12, temperature=1.0, top_p=0.95)
        rs = await asyncio.gather(*(client.chat.completions.create(seed=s, **kwargs) for s in (7, 7, 8)))
        return [r.choices[0].message.content for r in rs]

    a, b, c = asyncio.run(run())
    assert a == b  # the same seed gives the same sample, whatever else shares the batch
    assert a != c or len(a) == 0


def test_stop_string(client):
    r = client.completions.create(model=MODEL, prompt="1, 2, 3, 4,", max_tokens=30, temperature=0, stop=[" 7"])
    assert r.choices[0].finish_reason == "stop"
    assert " 7" not in r.choices[0].text
