"""A draft model with a drafting vocabulary drafts greedy rows from its subset's logits alone (compact drafts):
the same drafts and confidences as from the full vocabulary's logits, and the target's own tokens."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from specdecode.config import SamplingParams
from specdecode.drafters import draft_model
from specdecode.drafters.draft_model import DraftModelDrafter
from specdecode.drafters.subset_head import VOCAB_FILE, SubsetHead
from specdecode.llm import LLM

PROMPTS = [[5, 17, 40, 3, 77, 12], [9, 9, 31, 64, 2, 80, 11]]  # token ids below the tiny models' vocabulary of 96
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def subset_draft(tiny_target, tmp_path_factory):
    """The tiny target as its own draft, with a drafting vocabulary of every id but each fifth, written out of
    order (the head sorts it: argmax ties then break to the lowest id, as over the full vocabulary)."""
    draft = shutil.copytree(tiny_target, tmp_path_factory.mktemp("subset_draft") / "draft")
    ids = np.array([i for i in range(96) if i % 5], dtype=np.int64)[::-1].copy()
    np.save(draft / VOCAB_FILE, ids)
    return draft


def _proposals(llm: LLM, monkeypatch, compact: bool) -> tuple[list[list[int]], list[tuple], dict]:
    """Each request's tokens, every proposal the drafter made (drafts, confidences) and how often the head
    scored the full vocabulary and the subset alone, with compact drafts allowed or not."""
    made, calls = [], {"full": 0, "small": 0}
    propose, logits, small = DraftModelDrafter.propose, SubsetHead.logits, SubsetHead.small_logits

    def recording(self, seqs, num_tokens, st):
        proposal = propose(self, seqs, num_tokens, st)
        if proposal.confidence is not None:  # None: no row drafted this step
            made.append((proposal.token_ids.tolist(), proposal.confidence.tolist()))
        return proposal

    def counted(fn, key):
        def wrapper(self, hidden):
            calls[key] += 1
            return fn(self, hidden)

        return wrapper

    monkeypatch.setattr(DraftModelDrafter, "propose", recording)
    monkeypatch.setattr(SubsetHead, "logits", counted(logits, "full"))
    monkeypatch.setattr(SubsetHead, "small_logits", counted(small, "small"))
    if not compact:
        monkeypatch.setattr(DraftModelDrafter, "compact_drafts", lambda self, st: False)
    outs = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
    monkeypatch.undo()
    return outs, made, calls


@pytest.mark.parametrize("fault", [False, True])
def test_compact_drafts_are_the_full_vocabulary_drafts(fault, tiny_target, subset_draft, monkeypatch):
    """Greedy rows draft from the subset's logits alone (the head never expands them to the vocabulary) and make
    the drafts, in the same steps, that the full logits make, at the same confidences to fp32 rounding; the
    output is the target's own. The control maps the compact argmax without the subset (an index, not a token
    id): its drafts differ from the full path's."""
    plain = LLM(target=str(tiny_target), method="none").generate(PROMPTS, GREEDY)
    spec = LLM(
        target=str(tiny_target), draft=str(subset_draft), method="draft", num_speculative_tokens=3, controller="fixed"
    )
    full_out, full, full_calls = _proposals(spec, monkeypatch, compact=False)
    if fault:
        monkeypatch.setattr(draft_model, "subset_drafts", lambda small, subset: small.argmax(-1))
    out, compact, calls = _proposals(spec, monkeypatch, compact=True)
    assert full_out == [o.token_ids for o in plain] and full_calls["full"] > 0 and len(full) >= 8
    assert calls["full"] == 0 and calls["small"] > 0  # the compact path was the one taken
    assert out == full_out  # lossless either way: verification keeps the target's tokens
    drafts = [d for d, _ in compact]
    if fault:
        pairs = list(zip(drafts, [d for d, _ in full], strict=False))  # the runs part at the first wrong draft
        assert sum(a != b for a, b in pairs) >= len(pairs) // 2
        return
    assert drafts == [d for d, _ in full]
    got = torch.tensor([c for _, cs in compact for row in cs for c in row])
    want = torch.tensor([c for _, cs in full for row in cs for c in row])
    assert torch.allclose(got, want, atol=1e-6)


def test_sampled_rows_keep_the_full_vocabulary(tiny_target, subset_draft, monkeypatch):
    """A sampled row needs q over the whole vocabulary (rejection sampling): its batch drafts from the full
    logits, and the head is back to full logits after every proposal (the load probe's callers read them)."""
    spec = LLM(
        target=str(tiny_target), draft=str(subset_draft), method="draft", num_speculative_tokens=3, controller="fixed"
    )
    params = SamplingParams(temperature=0.8, seed=3, max_tokens=16, ignore_eos=True)
    calls = {"full": 0}
    full = SubsetHead.logits

    def counted(self, hidden):
        calls["full"] += 1
        return full(self, hidden)

    monkeypatch.setattr(SubsetHead, "logits", counted)
    out = spec.generate(PROMPTS[:1], params)[0]
    assert out.metrics["num_drafted"] > 0 and calls["full"] > 0
    assert spec.draft_model.lm_head.compact is False
