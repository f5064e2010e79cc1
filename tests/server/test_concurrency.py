"""64 concurrent streaming clients: all complete, none lost or duplicated, greedy texts equal LLM.generate,
and /metrics agrees with the responses' usage."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

from specdecode.config import SamplingParams
from tests.server.conftest import MODEL

NUM_CLIENTS = 64
MAX_TOKENS = 12


def conversation(i: int) -> list[dict[str, str]]:
    """Client i's chat. A system turn of its own: SmolLM2's template otherwise puts its default one in, which made
    each prompt 184 tokens and the prefills most of this test's time (64 x 184 tokens here, again in the reference)."""
    return [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"Give me one fact about {i}."}]


def scrape(url: str) -> dict[str, float]:
    """Samples of /metrics by name (labels dropped and summed), parsed with prometheus_client."""
    text = httpx.get(url + "/metrics").text
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            values[s.name] = values.get(s.name, 0.0) + s.value
    return values


async def stream_one(client: openai.AsyncOpenAI, i: int) -> tuple[int, str, list[str], object]:
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=conversation(i),
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, ids, usage = "", [], None
    async for chunk in stream:
        ids.append(chunk.id)
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
        if chunk.usage is not None:
            usage = chunk.usage
    return i, text, ids, usage


def test_64_concurrent_streams(server, reference_llm):
    before = scrape(server.url)

    async def run():
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)
        return await asyncio.gather(*(stream_one(client, i) for i in range(NUM_CLIENTS)))

    results = asyncio.run(run())
    after = scrape(server.url)

    assert sorted(i for i, *_ in results) == list(range(NUM_CLIENTS))
    request_ids = [set(ids) for _, _, ids, _ in results]
    assert all(len(ids) == 1 for ids in request_ids)  # one id per stream ...
    assert len(set.union(*request_ids)) == NUM_CLIENTS  # ... and no two streams share one

    want = reference_llm.chat([conversation(i) for i in range(NUM_CLIENTS)], SamplingParams(max_tokens=MAX_TOKENS))
    assert [text for _, text, _, _ in results] == [w.text for w in want]

    usages = [u for *_, u in results]
    assert all(u is not None for u in usages)

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    assert delta("specdecode_generation_tokens_total") == sum(u.completion_tokens for u in usages)
    assert delta("specdecode_prompt_tokens_total") == sum(u.prompt_tokens for u in usages)
    spec = [u.model_extra["speculative"] for u in usages]
    assert delta("specdecode_draft_tokens_total") == sum(s["drafted_tokens"] for s in spec)
    assert delta("specdecode_accepted_tokens_total") == sum(s["accepted_tokens"] for s in spec)
    assert delta("specdecode_target_forwards_total") == sum(s["target_forwards"] for s in spec)
    assert delta("specdecode_draft_position_tokens_total") == delta("specdecode_draft_tokens_total")
    assert delta("specdecode_time_to_first_token_seconds_count") == NUM_CLIENTS
    for _ in range(50):  # the gauge is refreshed when the loop next goes round
        if scrape(server.url)["specdecode_num_requests_running"] == 0:
            break
        time.sleep(0.1)
    assert scrape(server.url)["specdecode_num_requests_running"] == 0
