"""Bounded capacity: a full queue answers 429 with Retry-After; a client that disconnects mid-stream frees its
slot so a queued request starts. The server has one slot and one queue place."""

from __future__ import annotations

import threading
import time

import httpx

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


def test_queue_full_then_disconnect_frees_the_slot(small_server):
    url = small_server.url
    queued: dict[str, object] = {}

    def run_queued() -> None:
        r = httpx.post(url + "/v1/completions", json=SHORT, headers=AUTH, timeout=120)
        queued["status"], queued["done_at"] = r.status_code, time.monotonic()

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
            closed_at = time.monotonic()
        # Leaving the block closes the connection mid-stream.
    waiter.join(timeout=60)
    assert queued.get("status") == 200
    # 1500 tokens would take the long request most of a minute; the queued one ran as soon as it left.
    assert queued["done_at"] - closed_at < 15
    assert wait_for(lambda: scrape(url)["specdecode_num_requests_running"] == 0, 10)
