"""Requests near the context limit, long prompts joining a running batch, and drafters' own prefill.

Each case once failed on a tiny random Llama: prefill padding wrote past the cache (IndexError), EAGLE padded a
newcomer's whole prompt against a row near the limit (IndexError), the draft model advanced rows clamped to
fewer drafts past the context (CacheFullError), layer skip wrote such rows' K/V past the slot (IndexError).
Drafters with a cache of their own catch up on a prompt within the engine's prefill chunk per step, as the
engine does.
"""

from __future__ import annotations

import pytest

from specdecode import LLM, SamplingParams
from specdecode.drafters.layer_select import LayerSkipChoice
from specdecode.engine.engine import Engine
from specdecode.step.sequence import Status
from tests.engine.test_head_drafters import write_heads


def ramp(n: int, stride: int) -> list[int]:
    """A prompt of n varied token ids (a tiny model's vocabulary is 96)."""
    return [3 + (i * stride) % 90 for i in range(n)]


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


@pytest.fixture(scope="module")
def layer_choice(tmp_path_factory):
    path = tmp_path_factory.mktemp("choice") / "choice.json"
    LayerSkipChoice([0], 0.5, 1.1).save(path)  # the tiny target has 2 layers: draft through the first
    return path


@pytest.fixture(scope="module")
def eagle_heads(tmp_path_factory, tiny_target):
    return write_heads(tmp_path_factory.mktemp("eagle") / "eagle", tiny_target, "eagle", 3)


def plain_outputs(target, prompts: list[list[int]], max_len: int, params: list[SamplingParams]) -> list[list[int]]:
    llm = LLM(target=str(target), method="none", max_model_len=max_len, max_num_seqs=1)
    return [llm.generate([p], sp)[0].token_ids for p, sp in zip(prompts, params, strict=True)]


def run_joining(engine: Engine, first: list[int], first_at: int, second: list[int], max_len: int) -> list[list[int]]:
    """`first` decodes until it holds `first_at` tokens; then `second` joins. Both run to the context limit."""
    a = engine.add_request("a", first, greedy(max_len - len(first)))
    while len(a.token_ids) < first_at:
        engine.step()
    assert a.status is Status.RUNNING
    b = engine.add_request("b", second, greedy(max_len - len(second)))
    while engine.has_work():
        engine.step()
    return [a.output_ids, b.output_ids]


@pytest.mark.parametrize("method", ["none", "ngram", "draft"])
def test_prefill_near_the_limit_beside_short_prompts(tiny_target, tiny_draft, method):
    # Chunk 100: the 9- and 150-token prompts were padded to 100 beside the 199-token one's last chunk.
    prompts = [ramp(9, 7), ramp(199, 5), ramp(150, 11)]
    params = [greedy(200 - len(p)) for p in prompts]
    draft = str(tiny_draft) if method == "draft" else None
    llm = LLM(target=str(tiny_target), draft=draft, method=method, max_model_len=200, max_num_batched_tokens=100)
    outs = llm.generate(prompts, params)
    assert [o.token_ids for o in outs] == plain_outputs(tiny_target, prompts, 200, params)


def test_eagle_newcomer_beside_a_row_near_the_limit(tiny_target, eagle_heads):
    # A request at 260 of 300 tokens, then a 150-token prompt: EAGLE's catch-up once padded it to 149 wide.
    llm = LLM(
        target=str(tiny_target),
        draft=str(eagle_heads),
        method="eagle",
        num_speculative_tokens=4,
        controller="fixed",
        max_model_len=300,
        max_num_batched_tokens=100,
        max_num_seqs=2,
    )
    prompts = [ramp(40, 7), ramp(150, 5)]
    outs = run_joining(llm.engine, prompts[0], 260, prompts[1], 300)
    assert outs == plain_outputs(tiny_target, prompts, 300, [greedy(300 - len(p)) for p in prompts])


@pytest.mark.parametrize("method", ["draft", "layer_skip"])
def test_rows_clamped_near_the_limit(tiny_target, tiny_draft, layer_choice, method):
    # K = 5 and a 50-token prompt in a 64-token context: that row may draft fewer than the other, which once
    # advanced both rows' draft caches K - 1 times (length 65 of 64); layer skip wrote its K/V past the slot.
    prompts = [ramp(50, 7), ramp(5, 5)]
    params = [greedy(64 - len(p)) for p in prompts]
    llm = LLM(
        target=str(tiny_target),
        draft=str(tiny_draft if method == "draft" else layer_choice),
        method=method,
        num_speculative_tokens=5,
        controller="fixed",
        max_model_len=64,
        max_num_seqs=2,
    )
    outs = llm.generate(prompts, params)
    assert [o.token_ids for o in outs] == plain_outputs(tiny_target, prompts, 64, params)
    assert sum(o.metrics["num_drafted"] for o in outs) > 0


def drafter_cache_growth(engine: Engine) -> list[int]:
    """Run the engine to the end; the drafter cache's total growth (tokens cached, all slots) in each step."""
    cache = engine.drafter.cache
    growth = []
    while engine.has_work():
        before = list(cache.lengths)
        engine.step()
        growth.append(sum(max(0, n - m) for n, m in zip(cache.lengths, before, strict=True)))
    return growth


@pytest.mark.parametrize("method", ["draft", "eagle"])
def test_drafter_prefill_is_one_chunk_per_step(tiny_target, tiny_draft, eagle_heads, method):
    """A 300-token prompt joining a decoding row: the drafter's own cache takes at most a prefill chunk (plus
    each row's kept tokens) per step, never the whole prompt at once."""
    chunk, k = 32, 3
    llm = LLM(
        target=str(tiny_target),
        draft=str(tiny_draft if method == "draft" else eagle_heads),
        method=method,
        num_speculative_tokens=k,
        controller="fixed",
        max_model_len=400,
        max_num_batched_tokens=chunk,
        max_num_seqs=2,
    )
    engine = llm.engine
    engine.add_request("a", ramp(20, 7), greedy(60))
    engine.step()
    engine.step()
    engine.add_request("b", ramp(300, 5), greedy(20))
    growth = drafter_cache_growth(engine)
    assert sum(growth) >= 300  # the prompt did reach the drafter's cache
    assert max(growth) <= chunk + 2 * (k + 1)
