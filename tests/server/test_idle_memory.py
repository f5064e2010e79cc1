"""An idle server holds only the memory it uses: the engine loop hands the C heap's free pages back to the OS
each time it runs out of work (specdecode/free_memory.py)."""

from __future__ import annotations

import asyncio
import ctypes
import time
from pathlib import Path

import pytest

from specdecode import LLM, SamplingParams, free_memory
from specdecode.server import async_engine
from specdecode.server.async_engine import AsyncEngine
from specdecode.server.metrics import ServerMetrics

BLOCK = 64 * 1024  # under glibc's smallest mmap threshold: every block lives in the heap
BLOCKS = 1024  # 64 MiB


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def heap_left_holding_freed_blocks(release: bool) -> float:
    """MiB resident that 64 MiB of freed heap blocks still hold, with or without `release_free_memory()`.

    The last block stays allocated, so the freed ones sit below the heap's top, which glibc never trims on its
    own (as a step's temporaries sit below whatever was allocated after them)."""
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    blocks = [libc.malloc(BLOCK) for _ in range(BLOCKS)]
    for b in blocks:
        ctypes.memset(b, 1, BLOCK)  # resident
    before = rss_mib()
    for b in blocks[:-1]:
        libc.free(b)
    if release:
        free_memory.release_free_memory()
    held = rss_mib() - (before - BLOCK * BLOCKS / 2**20)
    libc.free(blocks[-1])
    free_memory.release_free_memory()
    return held


def test_release_returns_freed_heap_pages():
    if free_memory._malloc_trim() is None:
        pytest.skip("not glibc: nothing to trim")
    assert heap_left_holding_freed_blocks(release=True) < 16


def test_control_without_release_the_freed_pages_stay_resident():
    if free_memory._malloc_trim() is None:
        pytest.skip("not glibc: nothing to trim")
    assert heap_left_holding_freed_blocks(release=False) > 48  # the same measure: ~64 MiB still held


def test_the_loop_releases_once_each_time_it_runs_out_of_work(tiny_target, monkeypatch):
    calls: list[float] = []
    monkeypatch.setattr(async_engine, "release_free_memory", lambda: calls.append(time.monotonic()))
    llm = LLM(target=str(tiny_target), method="ngram", num_speculative_tokens=2)
    engine = AsyncEngine(llm.engine, 4, ServerMetrics())
    engine.start()

    async def one_request(rid: str) -> None:
        stream = engine.submit(rid, [5, 6, 7, 8], SamplingParams(max_tokens=6, ignore_eos=True))
        while not (await asyncio.wait_for(stream.queue.get(), timeout=30)).final:
            pass

    def idle_rounds() -> None:  # an idle loop goes round at least every 0.5 s
        time.sleep(1.2)

    try:
        idle_rounds()
        assert calls == []  # no step yet: nothing to release
        asyncio.run(one_request("a"))
        idle_rounds()
        assert len(calls) == 1
        asyncio.run(one_request("b"))
        idle_rounds()
        assert len(calls) == 2
    finally:
        engine.shutdown()
