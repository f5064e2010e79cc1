"""The drafting head's precision: bf16 where it is native (half the bytes), the same drafts up to rounding."""

from __future__ import annotations

import pytest
import torch

from specdecode.config import ConfigError
from specdecode.drafters.subset_head import DRAFTING_DTYPE_ENV, SubsetHead, drafting_dtype
from specdecode.models.llama import load_llama


@pytest.mark.parametrize("forced", ["float32", "bfloat16"])
def test_forced_drafting_dtype_is_used_and_scores_like_fp32(forced, tiny_target, monkeypatch):
    """Either precision scores the subset as the fp32 weights do, to bf16 rounding, -inf outside it; its
    control, a head over the wrong rows (the subset shifted by one token), is far off."""
    target = load_llama(tiny_target)
    subset = torch.arange(0, 90, 3)
    monkeypatch.setenv(DRAFTING_DTYPE_ENV, forced)
    head = SubsetHead(target, subset)
    assert head.dtype == getattr(torch, forced)
    hidden = torch.randn(4, target.cfg.hidden_size)  # [rows, hidden]
    want = hidden @ target.lm_head_weight()[subset].T  # [rows, S] fp32
    got = head.logits(hidden)  # [rows, vocab]
    outside = torch.ones(target.cfg.vocab_size, dtype=torch.bool)
    outside[subset] = False
    assert torch.isinf(got[:, outside]).all()
    scale = want.abs().max().item()
    assert (got[:, subset] - want).abs().max().item() < 2e-2 * scale
    wrong = hidden @ target.lm_head_weight()[subset + 1].T
    assert (got[:, subset] - wrong).abs().max().item() > 0.3 * scale


def test_drafting_dtype_defaults_and_refusal(monkeypatch):
    monkeypatch.delenv(DRAFTING_DTYPE_ENV, raising=False)
    native = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    assert drafting_dtype(torch.zeros(2, 2)) == (torch.bfloat16 if native else torch.float32)
    assert drafting_dtype(torch.zeros(2, 2, dtype=torch.float16)) == torch.float16  # a head in its own dtype
    monkeypatch.setenv(DRAFTING_DTYPE_ENV, "int4")
    with pytest.raises(ConfigError, match="must be float32 or bfloat16"):
        drafting_dtype(torch.zeros(2, 2))
