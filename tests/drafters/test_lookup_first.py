"""Prompt lookup ahead of a draft model (drafters/lookup_first.py): which rows it takes, and how their drafts
join the draft model's proposal. Losslessness end to end: tests/engine/test_greedy.py, test_distribution.py."""

from __future__ import annotations

import torch

from specdecode.config import SamplingParams
from specdecode.drafters import lookup_drafter
from specdecode.drafters.lookup_first import merge
from specdecode.step.proposal import Proposal
from specdecode.step.sequence import Sequence
from specdecode.verify.sampling import PAD_TOKEN_ID

VOCAB = 10


def seq(rid: str, tokens: list[int]) -> Sequence:
    return Sequence(rid, tokens, SamplingParams(max_tokens=8), max_len=64)


def test_rows_whose_suffix_recurs_take_what_followed_it():
    lookup = lookup_drafter(2, 4, "cpu")
    rows = [seq("a", [1, 2, 3, 4, 9, 1, 2, 3]), seq("b", [5, 6, 7, 8]), seq("c", [1, 2, 5, 1, 2])]
    for s in rows:
        lookup.add_sequence(s)
    found = lookup.propose(rows, [2, 3, 0], None)  # c recurs but is asked nothing
    assert found.token_ids[0].tolist() == [4, 9] and found.confidence[0].tolist() == [1.0, 1.0]  # "1 2 3" recurs
    assert found.num_tokens.tolist() == [2, 0, 0]
    rows[1].token_ids.extend([5, 6])  # now "5 6" recurs: the history follows the committed tokens
    assert lookup.propose(rows[1:2], [4], None).token_ids[0].tolist() == [7, 8, 5, 6]
    assert lookup_drafter(0, 4, "cpu") is None  # off


def test_merge_puts_lookup_drafts_in_their_rows_and_leaves_the_model_rows():
    model_ids = torch.tensor([[PAD_TOKEN_ID, PAD_TOKEN_ID], [3, 4]])  # row 0 asked nothing of the model
    q = torch.softmax(torch.randn(2, 2, VOCAB), -1)  # [2, 2, vocab]
    model = Proposal(model_ids, torch.tensor([0, 2]), q, torch.tensor([[0.0, 0.0], [0.9, 0.6]]))
    lookup = Proposal.from_lists([[7, 8, 9], []], 3, "cpu", [[1.0, 0.5, 0.5], []])
    out = merge(model, lookup, VOCAB)
    assert out.token_ids.tolist() == [[7, 8, 9], [3, 4, PAD_TOKEN_ID]]
    assert out.num_tokens.tolist() == [3, 2]
    assert torch.allclose(out.confidence[0], torch.tensor([1.0, 0.5, 0.5]))
    assert torch.allclose(out.confidence[1, :2], torch.tensor([0.9, 0.6]))
    assert out.probs[0].argmax(-1).tolist() == [7, 8, 9] and out.probs[0].sum(-1).tolist() == [1.0, 1.0, 1.0]
    assert torch.equal(out.probs[1, :2], q[1])  # the model's q untouched


def test_merge_without_hits_is_the_model_proposal_itself():
    model = Proposal.from_lists([[1, 2], [3]], 2, "cpu")
    assert merge(model, Proposal.from_lists([[], []], 0, "cpu", [[], []]), VOCAB) is model


def test_greedy_merge_keeps_one_hot_q_implicit():
    model = Proposal.from_lists([[], []], 0, "cpu")  # every row found by lookup: the model drafted nothing
    out = merge(model, Proposal.from_lists([[1], [2, 3]], 2, "cpu", [[1.0], [1.0, 1.0]]), VOCAB)
    assert out.probs is None and out.token_ids.tolist() == [[1, PAD_TOKEN_ID], [2, 3]]


def test_a_held_row_drafts_from_the_lookup_alone_until_the_commit(tiny_draft):
    """Held rows (`hold_model`) take the lookup's drafts where it finds some and none elsewhere; the model reads
    nothing for them. After the step's commit the hold is gone: the row the lookup found nothing for is the model's
    again, and it reads the row's text. Control: the same step unheld has the model read and draft that row."""
    from specdecode.drafters.draft_model import DraftModelDrafter
    from specdecode.engine.engine import sampling_tensors
    from specdecode.models.llama import load_llama

    drafter = DraftModelDrafter(load_llama(tiny_draft), 2, 256, lookup=lookup_drafter(2, 4, "cpu"))
    rows = [seq("a", [11, 12, 13, 14, 19, 11, 12, 13]), seq("b", [15, 16, 17, 18])]  # a's "11 12 13" recurs
    for s in rows:
        drafter.add_sequence(s)
    st = sampling_tensors(rows, "cpu", drafter.model.cfg.vocab_size)
    unread = [drafter.unread(s) for s in rows]
    drafter.hold_model({"a", "b"})
    held = drafter.propose(rows, [2, 2], st)
    assert held.num_tokens.tolist() == [2, 0] and held.token_ids[0].tolist() == [14, 19]
    assert [drafter.unread(s) for s in rows] == unread  # the model read nothing
    drafter.commit(rows)
    unheld = drafter.propose(rows, [2, 2], st)  # the control: b is the model's
    assert unheld.num_tokens.tolist() == [2, 2] and drafter.unread(rows[1]) == 0
