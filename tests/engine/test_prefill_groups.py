"""Prompt chunks of unlike lengths are prefilled in separate forwards, not padded to the longest.

A forward pads each row to its longest; when a long prompt and the tail of another shared the step's chunk
budget, the short one ran as many padded tokens as the long one had real ones (in a probe under load, ~40%
of the prefill forwards' tokens were padding). Greedy outputs must not change; a feature drafter (EAGLE) must
still see each prompt's features at the right positions.
"""

from __future__ import annotations

import pytest

import specdecode.engine.engine as engine_module
from specdecode import LLM
from specdecode.models.ragged import pad_groups
from specdecode.step.runner import PAD_SLACK
from tests.engine.test_context_edges import greedy, plain_outputs, ramp

PROMPTS = [ramp(120, 7), ramp(9, 5), ramp(110, 11), ramp(3, 13)]


@pytest.mark.parametrize("lengths", [[120, 9, 110, 3], [5, 5, 5], [1], [40, 30, 20, 10, 0]])
def test_groups_cover_every_row_once_within_the_slack(lengths):
    groups = pad_groups(lengths, PAD_SLACK)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    for g in groups:
        assert max(lengths[i] for i in g) - min(lengths[i] for i in g) <= PAD_SLACK


def prefill_rows(llm: LLM, monkeypatch) -> tuple[int, int]:
    """(real, padded) prompt tokens the engine ran through prefill forwards for PROMPTS, all admitted at once."""
    seen = {"real": 0, "padded": 0}
    forward = engine_module.forward_ragged

    def counting(model, cache, slots, chunks, last_only, *args, **kwargs):
        if last_only:  # prefill chunks; decode steps score every position
            seen["real"] += sum(map(len, chunks))
            seen["padded"] += len(chunks) * max(map(len, chunks))
        return forward(model, cache, slots, chunks, last_only, *args, **kwargs)

    monkeypatch.setattr(engine_module, "forward_ragged", counting)
    llm.generate(PROMPTS, greedy(4))
    return seen["real"], seen["padded"]


def test_unlike_chunks_are_not_padded_to_the_longest(tiny_target, monkeypatch):
    llm = LLM(target=str(tiny_target), method="none", max_num_seqs=4, max_num_batched_tokens=512)
    real, padded = prefill_rows(llm, monkeypatch)
    assert real == sum(len(p) - 1 for p in PROMPTS)  # the last prompt token is fed with the first decode
    assert padded <= real + PAD_SLACK * len(PROMPTS)


def test_the_padding_count_sees_one_padded_forward(tiny_target, monkeypatch):
    """Negative control: the same count with every chunk in one forward (the old prefill) shows the waste."""
    monkeypatch.setattr(engine_module, "pad_groups", lambda lengths, slack: [list(range(len(lengths)))])
    llm = LLM(target=str(tiny_target), method="none", max_num_seqs=4, max_num_batched_tokens=512)
    real, padded = prefill_rows(llm, monkeypatch)
    assert padded > 1.8 * real


@pytest.mark.parametrize("method", ["none", "eagle"])
def test_grouped_prefill_keeps_greedy_outputs(method, tiny_target, drafts):
    llm = LLM(
        target=str(tiny_target),
        draft=drafts.get(method),
        method=method,
        num_speculative_tokens=3,
        controller="fixed",
        max_num_seqs=4,
        max_model_len=200,
    )
    params = [greedy(30)] * len(PROMPTS)
    outs = llm.generate(PROMPTS, params)
    assert [o.token_ids for o in outs] == plain_outputs(tiny_target, PROMPTS, 200, params)
