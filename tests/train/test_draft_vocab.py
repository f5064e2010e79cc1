"""A reduced draft vocabulary (`--draft-vocab`): the loss over a subset, the vocab.npy a draft carries, and a
draft that drafts only inside it while the output stays the target's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specdecode.config import ConfigError, SamplingParams
from specdecode.drafters.subset_head import VOCAB_FILE, SubsetLMHead, load_subset
from specdecode.train.distill import DistillConfig, distill
from specdecode.train.draft_config import DraftOptions
from specdecode.train.objective import _subset_labels, distill_loss
from tests.train.conftest import VOCAB

SMALL = dict(batch_size=4, seq_len=24, warmup=3, progress=False)


def _logits(seed: int, vocab: int = 20) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    student = torch.randn(2, 5, vocab, generator=g)  # [batch, seq_len, vocab]
    teacher = torch.randn(2, 5, vocab, generator=g) * 3  # [batch, seq_len, vocab]
    mask = torch.rand(2, 5, generator=g) > 0.3  # [batch, seq_len]
    labels = torch.randint(0, vocab, (2, 5), generator=g)  # [batch, seq_len]
    return student, teacher, mask, labels


def test_whole_vocabulary_subset_equals_no_subset():
    student, teacher, mask, labels = _logits(0)
    full = distill_loss(student[mask], teacher, mask, labels, ce_weight=0.5)
    same = distill_loss(student[mask], teacher, mask, labels, ce_weight=0.5, subset=torch.arange(20))
    assert torch.allclose(full.loss, same.loss) and full.accuracy == same.accuracy


def test_subset_loss_renormalises_the_teacher_over_the_subset():
    student, teacher, mask, labels = _logits(1)
    subset = torch.tensor([0, 3, 4, 9, 15])
    got = distill_loss(student[mask][:, subset], teacher, mask, labels, subset=subset)
    q_log = student[mask][:, subset].log_softmax(-1)
    p_log = teacher[mask][:, subset].log_softmax(-1)
    expected = (p_log.exp() * (p_log - q_log)).sum(-1).mean()
    assert torch.allclose(got.loss, expected, atol=1e-5)
    # Negative control: the unrenormalised target (mass outside the subset kept) is a different objective.
    p_raw = teacher[mask].log_softmax(-1)[:, subset]
    assert not torch.allclose(got.loss, (p_raw.exp() * (p_raw - q_log)).sum(-1).mean(), atol=1e-3)
    # Accuracy compares with the target's argmax over the WHOLE vocabulary: outside the subset is a miss.
    hits = (subset[q_log.argmax(-1)] == teacher[mask].argmax(-1)).float().mean().item()
    assert got.accuracy == pytest.approx(hits)


def test_hard_labels_outside_the_subset_are_ignored():
    subset = torch.tensor([2, 5, 7])
    assert _subset_labels(torch.tensor([5, 6, 2, 7, 9]), subset).tolist() == [1, -100, 0, 2, -100]


def test_distill_with_draft_vocab_drafts_inside_it(tiny_target, train_npz, tmp_path):
    out = tmp_path / "draft"
    draft = DraftOptions(num_layers=1, vocab_subset=40)
    cfg = DistillConfig(str(tiny_target), [str(train_npz)], str(out), draft=draft, steps=20, lr=3e-3, **SMALL)
    result = distill(cfg)
    assert np.mean(result.losses[-5:]) < np.mean(result.losses[:5])
    subset = load_subset(out / VOCAB_FILE, VOCAB)
    assert len(subset) == 40 and subset.tolist() == sorted(subset.tolist())
    assert 2 in subset.tolist()  # the end-of-sequence id is always draftable
    assert result.manifest["draft_vocab"] == 40

    from specdecode.llm import LLM

    prompt = [5, 17, 40, 3, 77, 12]
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    plain = LLM(target=str(tiny_target), method="none").generate([prompt], greedy)[0].token_ids
    spec = LLM(target=str(tiny_target), draft=str(out), method="draft", num_speculative_tokens=3)
    assert isinstance(spec.draft_model.lm_head, SubsetLMHead)  # vocab.npy was picked up
    out_spec = spec.generate([prompt], greedy)[0]
    assert out_spec.token_ids == plain and out_spec.metrics["num_drafted"] > 0
    outside = torch.ones(VOCAB, dtype=torch.bool)
    outside[subset] = False
    with torch.inference_mode():
        hidden = torch.randn(3, spec.draft_model.cfg.hidden_size)
        logits = spec.draft_model.lm_head(hidden)  # [3, vocab]
    assert torch.isinf(logits[:, outside]).all() and torch.isfinite(logits[:, subset]).all()


def test_a_draft_with_another_vocabulary_is_refused(tiny_target, tmp_path):
    from specdecode.llm import LLM
    from tests.tiny import write_tiny_model

    other = write_tiny_model(tmp_path / "other", vocab_size=VOCAB + 4)
    with pytest.raises(ConfigError, match="vocabulary"):
        LLM(target=str(tiny_target), draft=str(other), method="draft")


def test_a_broken_vocab_file_beside_a_draft_is_refused(tiny_target, tiny_draft, tmp_path):
    import shutil

    from specdecode.llm import LLM

    draft = shutil.copytree(tiny_draft, tmp_path / "draft")
    np.save(draft / VOCAB_FILE, np.array([3, 3, 500]))  # a repeat and an id outside the vocabulary
    with pytest.raises(ConfigError, match="vocabulary subset"):
        LLM(target=str(tiny_target), draft=str(draft), method="draft")
