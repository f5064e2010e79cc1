"""Bounded capacity: a full queue answers 429 with Retry-After; a client that disconnects, mid-stream or before
a whole response, has its request aborted, which frees its slot so a queued request starts. The server has one
slot and one queue place. The abort is read from /metrics, never from how long anything took."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.server.conftest import MODEL
from tests.server.test_concurrency import scrape

AUTH = {"authorization": "Bearer sekrit"}
LONG = {"model": MODEL, "prompt": "Count:", "max_tokens": 1500, "temperature": 0, "ignore_eos": True}
SHORT = {"model": MODEL, "prompt": "Hi", "max_tokens": 4, "temperature": 0}


def wait_for(cond, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return False


def http_requests(url: str, status: str) -> float:
    """specdecode_http_requests_total for /v1/completions answered with `status`."""
    want = {"endpoint": "/v1/completions", "status": status}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for s in family.samples:
            if s.name == "specdecode_http_requests_total" and s.labels == want:
                return s.value
    return 0.0


def test_queue_full_then_disconnect_frees_the_slot(small_server):
    url = small_server.url
    before = scrape(url)
    queued: dict[str, object] = {}

    def run_queued() -> None:
        r = httpx.post(url + "/v1/completions", json=SHORT, headers=AUTH, timeout=120)
        queued["status"], queued["usage"] = r.status_code, r.json().get("usage")

    with httpx.Client(timeout=120) as client:
        with client.stream("POST", url + "/v1/completions", json={**LONG, "stream": True}, headers=AUTH) as long:
            assert long.status_code == 200
            lines = long.iter_lines()
            assert next(line for line in lines if line.startswith("data:"))  # it is decoding

            waiter = threading.Thread(target=run_queued)
            waiter.start()
            assert wait_for(lambda: scrape(url)["specdecode_num_requests_waiting"] == 1, 30)

            full = client.post(url + "/v1/completions", json=SHORT, headers=AUTH)
            assert full.status_code == 429
            assert full.headers["retry-after"] == "1"
            assert full.json()["error"]["type"] == "rate_limit_error"
            assert "status" not in queued  # still waiting behind the long stream
        # Leaving the block closes the connection mid-stream.
    waiter.join(timeout=120)
    assert queued.get("status") == 200
    assert wait_for(lambda: scrape(url)["specdecode_num_requests_running"] == 0, 30)
    # The long request was aborted, not run out: only the queued one finished (prompt tokens count finished
    # requests), and far fewer than its 1500 tokens were generated in all.
    after = scrape(url)
    assert after["specdecode_request_aborts_total"] - before["specdecode_request_aborts_total"] == 1
    short_prompt = queued["usage"]["prompt_tokens"]
    assert after["specdecode_prompt_tokens_total"] - before["specdecode_prompt_tokens_total"] == short_prompt
    assert after["specdecode_generation_tokens_total"] - before["specdecode_generation_tokens_total"] < 1000


def test_a_client_gone_before_its_response_is_aborted(small_server):
    """A non-streamed request whose client leaves: the server aborts it (the 499 it counts is recorded only
    after the abort) and the slot is free for the next request."""
    url = small_server.url
    gone, aborts = http_requests(url, "499"), scrape(url)["specdecode_request_aborts_total"]
    with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes the connection
        httpx.post(url + "/v1/completions", json=LONG, headers=AUTH, timeout=httpx.Timeout(30, read=2))
    assert wait_for(lambda: http_requests(url, "499") == gone + 1, 60)
    assert wait_for(lambda: scrape(url)["specdecode_request_aborts_total"] == aborts + 1, 30)
    assert wait_for(lambda: scrape(url)["specdecode_num_requests_running"] == 0, 30)
    r = httpx.post(url + "/v1/completions", json=SHORT, headers=AUTH, timeout=120)
    assert r.status_code == 200
