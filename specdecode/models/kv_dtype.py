"""The KV cache's dtype: fp32, or bf16 (`EngineConfig.kv_cache_dtype`; "auto": bf16 under the fast arithmetic).

At long contexts a CPU step is bound by attention: on the Qwen2.5-Coder 1.5B at 8,192 cached tokens the fp32
few-queries kernel takes 31.9 ms of a one-token step, reading 470 MB of keys and values, and 67.3 ms of a 5-token
verify. A bf16 cache halves the bytes and, with AVX512_BF16, the dot products' instructions
(kernels/few_queries_attention_bf16.cpp): 17.7 and 45.4 ms (results/kv_bf16_attention.json, 2-core AMD EPYC,
2026-11-29).
llama.cpp keeps its cache in f16 by default for the same reason. bf16 keeps fp32's range, so no key overflows.

It is a different arithmetic from fp32's, and the fast arithmetic (already not the exact product) takes it:
speculation stays exact with respect to it, since a query's result never depends on the rows or tokens beside it.
The exact arithmetic keeps fp32, the reference.
"""

from __future__ import annotations

import torch

from specdecode.config import KV_CACHE_DTYPES, ConfigError
from specdecode.models import few_rows
from specdecode.models.attention import BF16_HEAD_DIMS
from specdecode.models.llama import LlamaModel

__all__ = ["KV_CACHE_DTYPES", "bf16_serves", "resolve", "set_kv_dtype"]


def bf16_serves(model: LlamaModel) -> bool:
    """Whether a bf16 cache has its kernel here: fp32 activations on a CPU whose few-queries attention serves, and
    a head size the bf16 kernel takes."""
    return (
        model.device.type == "cpu"
        and model.dtype == torch.float32
        and model.cfg.head_dim in BF16_HEAD_DIMS
        and few_rows.attention_usable()
    )


def resolve(model: LlamaModel, setting: str, arithmetic: str) -> torch.dtype:
    """The cache dtype `setting` names for `model` in `arithmetic`; an explicit bf16 the kernel cannot serve is
    refused (a bf16 cache read by SDPA alone would be slower than fp32, not faster)."""
    if setting == "fp32" or (setting == "auto" and arithmetic != "fast"):
        return model.dtype
    if bf16_serves(model):
        return torch.bfloat16
    if setting == "bf16":
        raise ConfigError(
            "kv_cache_dtype='bf16' needs fp32 activations on an AVX-512 CPU whose few-queries attention kernel "
            f"builds, and a head size of {', '.join(map(str, BF16_HEAD_DIMS))} (this model's: {model.cfg.head_dim})"
        )
    return model.dtype


def set_kv_dtype(model: LlamaModel, setting: str, arithmetic: str) -> LlamaModel:
    """`model`, its caches from now on in the dtype `setting` resolves to (`resolve`)."""
    dtype = resolve(model, setting, arithmetic)
    model.kv_dtype = None if dtype == model.dtype else dtype
    return model
