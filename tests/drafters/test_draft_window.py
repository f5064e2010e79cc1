"""A windowed draft model (drafters/draft_window.py) reads its sink and last window at their own positions, and
speculation with it stays lossless.

The reference is transformers itself, run on exactly the tokens the window keeps (the first SINK and the last
WINDOW) with their positions in the sequence given explicitly: the draft's logits after each token must be that
model's, through skips (a long prompt read as its sink and tail) and slides (the window moved down to the sink).
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from specdecode import LLM, SamplingParams
from specdecode.config import SamplingParams as Params
from specdecode.drafters.draft_model import DraftModelDrafter
from specdecode.drafters.draft_window import SINK
from specdecode.models.llama import load_llama
from specdecode.step.sequence import Sequence

WINDOW = 8
TOLERANCE = 1e-4  # fp32 logits of two implementations of one model


@pytest.fixture(scope="module")
def hf_draft(tiny_draft):
    return AutoModelForCausalLM.from_pretrained(tiny_draft, dtype=torch.float32).eval()


def windowed_reference(hf, token_ids: list[int], first: int) -> torch.Tensor:
    """transformers' logits [vocab] after token_ids, attending to the first SINK and those from `first` on only,
    at their positions in token_ids."""
    kept = list(range(min(SINK, len(token_ids)))) + list(range(max(first, SINK), len(token_ids)))
    ids = torch.tensor([[token_ids[i] for i in kept]])
    with torch.no_grad():
        return hf(input_ids=ids, position_ids=torch.tensor([kept])).logits[0, -1]


def draft_logits_along(
    drafter: DraftModelDrafter, prompt: list[int], extra: list[int]
) -> list[tuple[torch.Tensor, int]]:
    """The drafter's logits [vocab] after the prompt and after each token of `extra` appended one at a time (as
    accepted tokens are), read through its own catch-up; with each, the first token it keeps past the sink."""
    seq = Sequence("r", prompt, Params(max_tokens=len(extra) + 1), max_len=10_000)
    drafter.add_sequence(seq)
    slot = drafter.slots["r"]
    out = []
    for token in [None, *extra]:
        if token is not None:
            seq.token_ids.append(token)
        drafter.commit([seq])
        while True:
            logits, ready = drafter._catch_up([seq], [slot], [1])
            if ready[0]:
                break
        out.append((logits[0, 0], SINK + drafter.shift[slot]))
    return out


def worst_gap(drafter: DraftModelDrafter, hf, prompt: list[int], extra: list[int]) -> float:
    """The largest logit difference from transformers on the tokens the window keeps; and checks that it keeps
    the last WINDOW tokens at least, and no more than its cache holds."""
    gaps = []
    for i, (logits, first) in enumerate(draft_logits_along(drafter, prompt, extra)):
        seen = prompt + extra[:i]
        assert first == SINK or len(seen) - first >= WINDOW
        assert SINK + len(seen) - first <= drafter.window.capacity
        gaps.append((logits - windowed_reference(hf, seen, first)).abs().max().item())
    return max(gaps)


def make_drafter(tiny_draft, budget: int = 512) -> DraftModelDrafter:
    return DraftModelDrafter(load_llama(tiny_draft), max_num_seqs=2, max_len=512, prefill_budget=budget, window=WINDOW)


PROMPT = [(7 * i + 3) % 90 + 3 for i in range(40)]  # longer than the sink and the window: the middle is skipped
EXTRA = [(5 * i + 11) % 90 + 3 for i in range(160)]  # past the capacity: the window slides more than once


@pytest.mark.parametrize("budget", [512, 3])  # the prompt's tail read at once, or a few tokens a step
def test_windowed_draft_is_transformers_on_the_kept_tokens(budget, tiny_draft, hf_draft):
    drafter = make_drafter(tiny_draft, budget)
    assert drafter.cache.max_len == drafter.window.capacity < 512  # the cache is the window's, not the context's
    assert worst_gap(drafter, hf_draft, PROMPT, EXTRA) < TOLERANCE
    assert drafter.shift[drafter.slots["r"]] > len(PROMPT) - SINK - WINDOW  # skipped, then slid


def test_control_a_slide_that_forgets_positions_fails(tiny_draft, hf_draft, monkeypatch):
    """The same check with one fault in the real slide: the moved tokens' shift is not recorded, so the tokens
    read after it get positions that are too small."""
    drafter = make_drafter(tiny_draft)
    real = DraftModelDrafter._make_room

    def forgetful(self, slots, feeds):
        before = list(self.shift)
        real(self, slots, feeds)
        self.shift[:] = before

    monkeypatch.setattr(DraftModelDrafter, "_make_room", forgetful)
    assert worst_gap(drafter, hf_draft, PROMPT, EXTRA) > 100 * TOLERANCE  # 0.12 when written


def test_short_contexts_are_read_whole(tiny_draft, hf_draft):
    """Below SINK + window nothing is skipped: the reference is the whole sequence."""
    drafter = make_drafter(tiny_draft)
    assert worst_gap(drafter, hf_draft, PROMPT[:6], EXTRA[:5]) < TOLERANCE
    assert drafter.shift[drafter.slots["r"]] == 0


def test_a_rollback_past_a_skip_reads_the_row_afresh(tiny_draft, hf_draft):
    """Cut a row back to before the tokens its window skipped to (bench long-context's rewind can): the draft
    forgets the row and reads it again, and its logits are the window's on the shorter sequence."""
    drafter = make_drafter(tiny_draft)
    draft_logits_along(drafter, PROMPT, EXTRA[:3])
    slot = drafter.slots["r"]
    assert drafter.shift[slot] > 0
    seq = Sequence("r", PROMPT[:10], Params(), max_len=10_000)  # what the row is now: 10 tokens, the last pending
    drafter.commit([seq])
    assert (drafter.cache.lengths[slot], drafter.shift[slot]) == (0, 0)
    logits, ready = drafter._catch_up([seq], [slot], [1])
    assert ready == [1]
    assert (logits[0, 0] - windowed_reference(hf_draft, PROMPT[:10], 0)).abs().max() < TOLERANCE


def test_unread_counts_what_the_window_will_read(tiny_draft):
    drafter = make_drafter(tiny_draft)
    seq = Sequence("r", list(range(3, 1003)), Params(), max_len=10_000)
    drafter.add_sequence(seq)
    assert drafter.unread(seq) == SINK + WINDOW  # not 1,000: the middle will be skipped


GREEDY = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
PROMPTS = [PROMPT, PROMPT[5:30], [11, 12, 13], EXTRA]


@pytest.mark.parametrize("controller", ["fixed", "goodput"])
def test_windowed_draft_speculation_equals_plain_greedy(controller, tiny_target, tiny_draft):
    plain = LLM(target=str(tiny_target), method="none", max_num_seqs=2).generate(PROMPTS, GREEDY)
    llm = LLM(
        target=str(tiny_target),
        draft=str(tiny_draft),
        method="draft",
        num_speculative_tokens=4,
        controller=controller,
        max_num_seqs=2,
        draft_window=WINDOW,
    )
    outs = llm.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    assert llm.engine.drafter.window is not None
    assert sum(o.metrics["num_drafted"] for o in outs) > 0
