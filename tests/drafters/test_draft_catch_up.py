"""A draft model reads a backlog longer than the attention kernel takes in pieces the kernel takes
(`DraftModelDrafter._feed_pieces`), and what it reads is the prompt: its logits after the last token are
transformers' on the same tokens, with a control that feeds the pieces wrong."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

import specdecode.drafters.draft_model as draft_model
from specdecode.config import SamplingParams
from specdecode.drafters.draft_model import DraftModelDrafter
from specdecode.models import few_rows
from specdecode.models.attention import KERNEL_MAX_QUERIES, kernel_piece
from specdecode.models.llama import load_llama
from specdecode.step.sequence import Sequence

PIECE = 32
PROMPT = [(7 * i + 3) % 90 + 3 for i in range(100)]  # 3 whole pieces and 4 tokens
TOLERANCE = 1e-4  # fp32 logits of two implementations of one model


@pytest.fixture(scope="module")
def hf_draft(tiny_draft):
    return AutoModelForCausalLM.from_pretrained(tiny_draft, dtype=torch.float32).eval()


def read_prompt(tiny_draft, monkeypatch) -> tuple[torch.Tensor, list[int]]:
    """The drafter's logits [vocab] after reading PROMPT in one catch-up, and the tokens each forward fed a row."""
    monkeypatch.setattr(draft_model, "kernel_piece", lambda device, dtype: PIECE)  # what an AVX-512 CPU gets
    drafter = DraftModelDrafter(load_llama(tiny_draft), max_num_seqs=1, max_len=256, prefill_budget=512)
    fed = []
    real_feed = drafter._feed

    def spy(slots, rows, tokens):
        fed.extend(map(len, tokens))
        return real_feed(slots, rows, tokens)

    drafter._feed = spy
    seq = Sequence("r", list(PROMPT), SamplingParams(max_tokens=4), max_len=256)
    drafter.add_sequence(seq)
    logits, ready = drafter._catch_up([seq], [drafter.slots["r"]], [1])
    assert ready == [1]
    return logits[0, 0], fed


def reference(hf) -> torch.Tensor:
    with torch.no_grad():
        return hf(input_ids=torch.tensor([PROMPT])).logits[0, -1]


def test_a_long_backlog_is_read_in_pieces_and_is_the_prompt(tiny_draft, hf_draft, monkeypatch):
    logits, fed = read_prompt(tiny_draft, monkeypatch)
    assert fed == [32, 32, 32, 4]
    assert (logits - reference(hf_draft)).abs().max().item() < TOLERANCE


def test_control_pieces_fed_out_of_order_are_caught(tiny_draft, hf_draft, monkeypatch):
    real = DraftModelDrafter._feed

    def reversed_pieces(self, slots, rows, tokens):  # each piece backwards: the fault a wrong slice makes
        return real(self, slots, rows, [t[::-1] for t in tokens])

    monkeypatch.setattr(DraftModelDrafter, "_feed", reversed_pieces)
    logits, fed = read_prompt(tiny_draft, monkeypatch)
    assert (logits - reference(hf_draft)).abs().max().item() > 100 * TOLERANCE  # ~21 here


def test_the_piece_is_the_kernels_where_it_serves():
    serves = few_rows.attention_usable()
    assert kernel_piece(torch.device("cpu"), torch.float32) == (KERNEL_MAX_QUERIES if serves else None)
    assert kernel_piece(torch.device("cpu"), torch.bfloat16) is None  # SDPA's: any length in one forward
    assert kernel_piece(torch.device("meta"), torch.float32) is None
