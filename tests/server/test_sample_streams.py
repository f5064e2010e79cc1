"""A request of n samples gets every sample's final message, also when several samples end in the same step."""

from __future__ import annotations

import asyncio

from specdecode import LLM, SamplingParams
from specdecode.server.async_engine import AsyncEngine
from specdecode.server.metrics import ServerMetrics


def test_samples_ending_together_all_report(tiny_target):
    llm = LLM(target=str(tiny_target), method="ngram", num_speculative_tokens=4, max_num_seqs=8)
    engine = AsyncEngine(llm.engine, 8, ServerMetrics())
    engine.start()

    async def finals() -> tuple[list[int], dict]:
        # Greedy samples are identical, so all three reach max_tokens in the same step.
        stream = engine.submit("r", [5, 6, 7, 8, 5, 6], SamplingParams(max_tokens=10, ignore_eos=True, n=3))
        ended, usage = [], None
        while len(ended) < 3:
            out = await asyncio.wait_for(stream.queue.get(), timeout=30)
            assert out.error is None
            if out.final:
                ended.append(out.index)
                usage = out.usage or usage
        return sorted(ended), usage

    try:
        ended, usage = asyncio.run(finals())
    finally:
        engine.shutdown()
    assert ended == [0, 1, 2]
    assert usage["completion_tokens"] == 30 and usage["prompt_tokens"] == 6
