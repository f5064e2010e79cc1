"""A bounded soak of a live server on loopback: mixed requests, what each client saw, and the checks on it.

Requests: short and long prompts (up to the context limit), completions and chat, streaming and not, greedy and
sampled, clients that disconnect after their first chunk, requests the server must refuse (over the context,
unknown model) and requests sent on top of a full server (429). Every request goes to the
given loopback URL; their number and concurrency are bounded by the caller.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.server.conftest import MODEL

WORDS = "the quick brown fox jumps over a lazy dog while seven tired cats watch from an old red barn".split()
# A disconnecting client sends this exact request: if the server finishes it before noticing the client left,
# it adds exactly DISCONNECT_TOKENS tokens of this prompt to /metrics (greedy, EOS ignored).
DISCONNECT_TOKENS = 24
DISCONNECT_BODY = {
    "model": MODEL,
    "prompt": "one two three four",
    "max_tokens": DISCONNECT_TOKENS,
    "temperature": 0,
    "ignore_eos": True,
    "stream": True,
}


RETRY_FOR_S = 60.0
OVERFLOW_BURST = 4
STREAM = {"stream": True, "stream_options": {"include_usage": True}}


@dataclass
class Outcome:
    kind: str
    endpoint: str
    status: int
    body: dict | None = None  # the request sent
    ids: set[str] = field(default_factory=set)  # response ids seen (one per request)
    finishes: list[str] = field(default_factory=list)  # finish reasons seen (one per completed request)
    text: str = ""
    usage: dict | None = None
    done: bool = False  # a stream's [DONE] arrived
    errors: list[str] = field(default_factory=list)  # error events inside a 200 stream
    rejected: int = 0  # 429s before this final status (the client retried, as Retry-After asks)


def prompt_text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def request_plan(rng: random.Random, context: int) -> tuple[str, str, dict]:
    """(kind, endpoint, body) of one random request."""
    greedy = rng.random() < 0.6
    sampling = {"temperature": 0} if greedy else {"temperature": 0.9, "top_p": 0.9, "seed": rng.randrange(1000)}
    kind = rng.choices(
        ["short", "short_stream", "chat", "chat_stream", "long", "disconnect", "overflow", "too_long", "bad_model"],
        weights=[28, 24, 4, 4, 12, 10, 8, 5, 5],
    )[0]
    completions, chat = "/v1/completions", "/v1/chat/completions"
    if kind in ("short", "short_stream", "overflow"):
        body = {"prompt": prompt_text(rng, rng.randint(1, 12)), "max_tokens": rng.randint(1, 16)} | sampling
        return kind, completions, body | (STREAM if kind == "short_stream" else {})
    if kind in ("chat", "chat_stream"):  # no max_tokens: the rest of the context
        messages = [{"role": "user", "content": prompt_text(rng, rng.randint(1, 20))}]
        return kind, chat, {"messages": messages} | sampling | (STREAM if kind == "chat_stream" else {})
    if kind == "long":  # near the context limit: the default max_tokens is cut to what is left
        # Each word is one token, but for the first, which may take two: at most context - 1 tokens.
        return kind, completions, {"prompt": prompt_text(rng, rng.randint(context - 24, context - 2))} | sampling
    if kind == "disconnect":
        return kind, completions, DISCONNECT_BODY
    if kind == "too_long":
        return kind, completions, {"prompt": prompt_text(rng, 2 * context), "max_tokens": 4}
    return kind, completions, {"model": "no-such-model", "prompt": "hi", "max_tokens": 4}


async def send(client: httpx.AsyncClient, kind: str, endpoint: str, body: dict) -> Outcome:
    body = {"model": MODEL} | body
    out = Outcome(kind, endpoint, 0, body)
    if not body.get("stream"):
        r = await client.post(endpoint, json=body)
        out.status = r.status_code
        if r.status_code == 200:
            data = r.json()
            out.ids.add(data["id"])
            out.finishes = [c["finish_reason"] for c in data["choices"]]
            choice = data["choices"][0]
            out.text = choice["message"]["content"] if "message" in choice else choice["text"]
            out.usage = data["usage"]
        return out
    async with client.stream("POST", endpoint, json=body) as r:
        out.status = r.status_code
        if r.status_code != 200:
            await r.aread()
            return out
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                out.done = True
                continue
            event = json.loads(line[len("data: ") :])
            if "error" in event:
                out.errors.append(event["error"].get("message", ""))
                continue
            out.ids.add(event["id"])
            for c in event["choices"]:
                out.text += (c.get("delta") or {}).get("content") or c.get("text") or ""
                if c.get("finish_reason"):
                    out.finishes.append(c["finish_reason"])
            if event.get("usage"):
                out.usage = event["usage"]
            if kind == "disconnect":
                break  # leaving the block closes the connection mid-stream
    return out


async def soak(url: str, num_requests: int, capacity: int, seed: int, context: int) -> list[Outcome]:
    """num_requests random requests, at most `capacity` in flight (the server's running + queued requests) but
    for the "overflow" ones, sent on top: those get 429 while the server is full."""
    rng = random.Random(seed)
    plans = [request_plan(rng, context) for _ in range(num_requests)]
    limit = asyncio.Semaphore(capacity)
    timeout = httpx.Timeout(120.0)
    transport = httpx.AsyncHTTPTransport(retries=0)
    async with httpx.AsyncClient(base_url=url, timeout=timeout, transport=transport) as client:

        async def retrying(plan: tuple[str, str, dict]) -> Outcome:
            """Honour 429 as a client should: retry shortly (overflow requests may hold the server's places)."""
            rejected, deadline = 0, time.monotonic() + RETRY_FOR_S
            while (out := await send(client, *plan)).status == 429 and time.monotonic() < deadline:
                rejected += 1
                await asyncio.sleep(0.05)
            out.rejected = rejected
            return out

        async def one(plan: tuple[str, str, dict]) -> list[Outcome]:
            async with limit:
                if plan[0] == "overflow":  # a burst on top of this place: the queue fills, the rest get 429
                    return list(await asyncio.gather(*(send(client, *plan) for _ in range(OVERFLOW_BURST))))
                return [await retrying(plan)]

        return [o for outs in await asyncio.gather(*(one(p) for p in plans)) for o in outs]


def rss_bytes(pid: int) -> int:
    """Resident memory of a process (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def status_counts(outcomes: list[Outcome]) -> Counter:
    return Counter((o.endpoint, o.status) for o in outcomes)


def scrape(url: str) -> Counter:
    """/metrics samples by (name, sorted labels)."""
    values: Counter = Counter()
    for family in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for s in family.samples:
            values[(s.name, tuple(sorted(s.labels.items())))] += s.value
    return values


# Within capacity a request is served; an overflow one may find the queue full; refused ones get their 4xx.
EXPECTED_STATUS = {"overflow": {200, 429}, "too_long": {400}, "bad_model": {404}}


def completed(outcomes: list[Outcome]) -> list[Outcome]:
    """Requests the server accepted and the client read to the end."""
    return [o for o in outcomes if o.status == 200 and not o.errors and o.kind != "disconnect"]


def check_outcomes(outcomes: list[Outcome]) -> None:
    """No 5xx; each request got the status its kind calls for; every accepted request completed exactly once;
    greedy requests with the same body got the same text."""
    failed = [(o.kind, o.status, o.errors) for o in outcomes if o.status >= 500 or o.errors]
    assert failed == [], f"server error: {failed[:3]}"  # a 5xx, or an error event inside a stream
    for o in outcomes:
        assert o.status in EXPECTED_STATUS.get(o.kind, {200}), f"unexpected status {o.status} for {o.kind}"
    done = completed(outcomes)
    for o in done:
        assert len(o.ids) == 1 and len(o.finishes) == 1, f"{o.kind}: ids {o.ids}, finish reasons {o.finishes}"
        assert o.finishes[0] in ("stop", "length"), f"{o.kind}: finish reason {o.finishes[0]}"
        assert o.usage is not None and (not o.body.get("stream") or o.done), f"{o.kind}: no usage or no [DONE]"
        limit = o.body.get("max_tokens", o.usage["completion_tokens"])
        assert o.usage["completion_tokens"] <= limit, f"{o.kind}: {o.usage['completion_tokens']} > max_tokens"
    all_ids = [i for o in done for i in o.ids]
    assert len(all_ids) == len(set(all_ids)), "two requests answered with one id"
    texts: dict[str, set[str]] = {}
    for o in done:
        if o.body.get("temperature") == 0:
            key = json.dumps({k: v for k, v in o.body.items() if k not in ("stream", "stream_options")}, sort_keys=True)
            texts.setdefault(key, set()).add(o.text)
    assert all(len(t) == 1 for t in texts.values()), "one greedy request gave two different texts"


def check_metrics(outcomes: list[Outcome], before: Counter, after: Counter, disconnect_prompt_tokens: int) -> None:
    """/metrics moved by exactly what the clients saw.

    HTTP statuses per endpoint match one for one. Token counters and the finished-request count match the
    completed requests' usage, plus F disconnected requests that the server finished before it noticed the
    client had gone (F is read off the request count and must then explain both token counters)."""
    delta = after - before
    seen = Counter((o.endpoint, str(o.status)) for o in outcomes)
    for o in outcomes:
        seen[(o.endpoint, "429")] += o.rejected
    served = Counter(
        {
            (dict(labels)["endpoint"], dict(labels)["status"]): v
            for (name, labels), v in delta.items()
            if name == "specdecode_http_requests_total" and dict(labels)["endpoint"].startswith("/v1")
        }
    )
    assert served == seen, f"HTTP statuses in /metrics {dict(served)} != seen by clients {dict(seen)}"
    done = completed(outcomes)
    finished = delta[("specdecode_e2e_request_latency_seconds_count", ())]
    late = finished - len(done)  # disconnected requests that finished anyway
    assert 0 <= late <= sum(o.kind == "disconnect" and o.status == 200 for o in outcomes), "finished requests"
    generated = sum(o.usage["completion_tokens"] for o in done) + late * DISCONNECT_TOKENS
    prompted = sum(o.usage["prompt_tokens"] for o in done) + late * disconnect_prompt_tokens
    assert delta[("specdecode_generation_tokens_total", ())] == generated, "generation_tokens"
    assert delta[("specdecode_prompt_tokens_total", ())] == prompted, "prompt_tokens"
