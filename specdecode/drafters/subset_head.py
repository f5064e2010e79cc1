"""The target's LM head restricted to a vocabulary subset: the cheap head of a drafter that reuses the target's.

On a small target the LM head is a large share of a step (49k x 576 of SmolLM2-135M's weights, ~21%); scoring
only the S most frequent tokens reads S / V of it. Drafts then stay inside the subset: a sampled draft has
q = 0 outside it and a greedy or tree candidate is one-hot, so verification stays lossless either way. Where
bf16 is native the subset's rows are kept and multiplied in bf16 (drafting_dtype): half the bytes again. A head
kept in GGUF blocks (models/quant_rows.py) keeps the subset's rows as blocks, in the head's own arithmetic: the
Qwen2.5-Coder 0.5B's Q8_0 head is 139 MB, a third of what a draft step reads, and its subset is a copy of S / V
of that, with no dense copy at all.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from torch import nn

from specdecode.config import ConfigError
from specdecode.models import fp32_linears
from specdecode.models.llama import LlamaModel
from specdecode.models.quant_int8 import Int8QuantLinear
from specdecode.models.quant_rows import QuantLinear

DRAFTING_DTYPE_ENV = "SPECDECODE_DRAFTING_DTYPE"
FORCED_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
VOCAB_FILE = "vocab.npy"  # beside a draft model or EAGLE head: the token ids it drafts from


def drafting_dtype(weight: torch.Tensor) -> torch.dtype:
    """The dtype a drafting head multiplies in: an fp32 head in bf16 where bf16 is native (a CPU with
    AVX512_BF16 or AMX, a CUDA GPU that has it), half the bytes of a step that mostly reads the weight; any other
    head in its own dtype. A draft need not be exact: verification keeps the output the target's whatever it
    proposes, and q is the distribution the drafts were drawn from, in whatever precision it was computed.
    $SPECDECODE_DRAFTING_DTYPE=float32|bfloat16 forces it."""
    forced = os.environ.get(DRAFTING_DTYPE_ENV)
    if forced:
        if forced not in FORCED_DTYPES:
            raise ConfigError(f"${DRAFTING_DTYPE_ENV} must be float32 or bfloat16, got {forced!r}")
        return FORCED_DTYPES[forced]
    if weight.dtype != torch.float32:
        return weight.dtype
    if weight.device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    native = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    return torch.bfloat16 if weight.device.type == "cpu" and native else torch.float32


def quantized_rows(head: nn.Module, subset: torch.Tensor) -> nn.Module | None:
    """The rows `subset` [S] of a head kept in GGUF blocks, as a linear of its kind (exact or int8) over a copy
    of those rows' blocks; None for a dense head."""
    if not isinstance(head, (QuantLinear, Int8QuantLinear)):
        return None
    bias = None if head.bias is None else head.bias[subset]  # [S]
    rows = QuantLinear(head.blocks[subset].contiguous(), head.qtype, head.in_features, bias)  # blocks [S, bytes]
    return Int8QuantLinear(rows) if isinstance(head, Int8QuantLinear) else rows


class SubsetHead:
    def __init__(self, target: LlamaModel, subset: torch.Tensor) -> None:
        self.vocab_size = target.cfg.vocab_size
        self.subset = subset.sort().values.to(target.device)  # [S] int64 token ids, ascending (as argmax breaks ties)
        self.linear = quantized_rows(target.lm_head, self.subset)
        if self.linear is not None:
            self.dtype = target.dtype  # the kernels take the model's fp32 activations
            return
        weight = target.lm_head_weight()
        self.dtype = drafting_dtype(weight)
        head = nn.Linear(weight.shape[1], len(self.subset), bias=False, device=weight.device, dtype=self.dtype)
        head.weight.data.copy_(weight[self.subset])  # [S, hidden]
        holder = nn.Sequential(head.requires_grad_(False))
        fp32_linears.install(holder, weight.device, self.dtype)  # as the target's own linears
        self.linear = holder[0]

    def small_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., hidden] -> float logits of the subset's tokens only [..., S], in the subset's order."""
        return self.linear(hidden.to(self.dtype)).float()

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., hidden] -> float logits [..., vocab], -inf outside the subset."""
        small = self.small_logits(hidden)  # [..., S]
        full = torch.full((*small.shape[:-1], self.vocab_size), float("-inf"), device=small.device)
        return full.index_copy_(-1, self.subset, small)


def load_subset(path: str | Path, vocab_size: int) -> torch.Tensor:
    """[S] int64 token ids from a .npy file: distinct, inside the vocabulary."""
    try:
        ids = torch.from_numpy(np.load(path).astype(np.int64)).flatten()
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path}: cannot read a vocabulary subset ({e})") from None
    if len(ids) == 0 or int(ids.min()) < 0 or int(ids.max()) >= vocab_size or len(ids.unique()) != len(ids):
        raise ConfigError(f"{path}: a vocabulary subset must be distinct token ids in 0..{vocab_size - 1}")
    return ids


class SubsetLMHead(nn.Module):
    """A model's LM head restricted to a subset, as a module: a draft model scores only its drafting
    vocabulary. Installed by `install(model, subset)`; the model's forward then returns -inf outside it."""

    def __init__(self, head: SubsetHead) -> None:
        super().__init__()
        self.head = head
        # Compact: the forward returns the subset's logits alone [..., S] (token subset[i] at i), for a caller
        # that needs no full-vocabulary distribution (a greedy draft: its argmax and top probability).
        self.compact = False

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        # [..., hidden] -> [..., vocab], or [..., S] when compact
        return self.head.small_logits(hidden) if self.compact else self.head.logits(hidden)

    @staticmethod
    def install(model: LlamaModel, subset: torch.Tensor) -> None:
        model.lm_head = SubsetLMHead(SubsetHead(model, subset))


def frequent_tokens(token_arrays: list[np.ndarray], size: int, always: list[int] | None = None) -> torch.Tensor:
    """[size] the most frequent token ids (a draft vocabulary subset), sorted by id; ids in `always` are in it
    whatever their count (they take the places of the least frequent)."""
    always = always or []
    counts = np.bincount(np.concatenate(token_arrays).astype(np.int64), minlength=max(always, default=-1) + 1)
    counts[always] = counts.max() + 1
    top = np.argsort(-counts, kind="stable")[:size]
    return torch.from_numpy(np.sort(top))
