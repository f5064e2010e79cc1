"""The drafting head's precision: bf16 where it is native (half the bytes), the same drafts up to rounding; a head
kept in GGUF blocks keeps its subset as blocks."""

from __future__ import annotations

import gguf
import pytest
import torch
from gguf import GGMLQuantizationType

from specdecode.config import ConfigError
from specdecode.drafters.subset_head import DRAFTING_DTYPE_ENV, SubsetHead, drafting_dtype
from specdecode.models.llama import load_llama
from specdecode.models.quant_int8 import Int8QuantLinear, use_int8
from specdecode.models.quant_rows import QuantLinear


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


@pytest.mark.parametrize("int8", [False, True])
@pytest.mark.parametrize("wrong_rows", [False, True])
def test_a_head_in_gguf_blocks_keeps_the_subset_as_blocks(int8, wrong_rows, tiny_target, monkeypatch):
    """A head kept in GGUF blocks (here Q8_0 of the tiny target's head) gives a subset head over a copy of those
    rows' blocks, in the head's own arithmetic, bitwise the full head's logits on the subset (a row's activation
    quantization never depends on the weight rows) and -inf outside. The control takes the rows of the subset
    shifted by one token (a misindexed copy) and the same check fails by far."""
    target = load_llama(tiny_target)
    weight = target.lm_head_weight().numpy()  # [vocab, hidden]
    blocks = torch.from_numpy(gguf.quants.quantize(weight, GGMLQuantizationType.Q8_0))  # [vocab, bytes]
    target.lm_head = QuantLinear(blocks, GGMLQuantizationType.Q8_0, target.cfg.hidden_size)
    if int8:
        use_int8(target)
    subset = torch.arange(0, 90, 3)
    if wrong_rows:
        monkeypatch.setattr(QuantLinear, "__init__", _shifted_rows(QuantLinear.__init__))
    head = SubsetHead(target, subset)
    assert isinstance(head.linear, Int8QuantLinear if int8 else QuantLinear)
    assert head.linear.blocks.shape == (len(subset), blocks.shape[1])
    hidden = torch.randn(4, target.cfg.hidden_size)  # [rows, hidden]
    with torch.inference_mode():
        got = head.logits(hidden)  # [rows, vocab]
        monkeypatch.undo()
        want = target.lm_head(hidden)[:, subset]  # [rows, S]
    outside = torch.ones(target.cfg.vocab_size, dtype=torch.bool)
    outside[subset] = False
    assert torch.isinf(got[:, outside]).all()
    gap = (got[:, subset] - want).abs().max().item()
    assert (gap > 0.1 * want.abs().max().item()) if wrong_rows else gap == 0.0


def _shifted_rows(init):
    """QuantLinear.__init__ that keeps the rows one past the ones given (their last row wraps to the first)."""

    def shifted(self, blocks, *args, **kwargs):
        return init(self, torch.roll(blocks, -1, dims=0), *args, **kwargs)

    return shifted
