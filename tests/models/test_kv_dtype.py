"""The KV cache's dtype (models/kv_dtype.py, `EngineConfig.kv_cache_dtype`): "auto" is bf16 under the fast
arithmetic and fp32 under the exact one; an explicit choice wins; bf16 where its kernel cannot serve is one clear
error (or, under "auto", fp32); and the engine's caches, the target's and the draft's, take the dtype."""

from __future__ import annotations

import pytest
import torch

from specdecode import LLM
from specdecode.config import ConfigError
from specdecode.models import few_rows, kv_dtype
from specdecode.models.llama import LlamaConfig, LlamaModel
from tests.models.test_few_queries_attention import kernel, needs_kernel  # noqa: F401 (a fixture)


def _model(head_dim: int) -> LlamaModel:
    cfg = LlamaConfig("llama", 32, 2 * head_dim, 64, 1, 2, 1, head_dim, 1e4, 1e-5, 64, False, False, False, False)
    return LlamaModel(cfg)


@needs_kernel
@pytest.mark.parametrize(
    "setting,arithmetic,want",
    [
        ("auto", "fast", torch.bfloat16),
        ("auto", "exact", torch.float32),
        ("fp32", "fast", torch.float32),
        ("bf16", "exact", torch.bfloat16),
    ],
)
def test_the_setting_resolves(setting, arithmetic, want):
    model = kv_dtype.set_kv_dtype(_model(64), setting, arithmetic)
    assert model.new_cache(1, 8).k.dtype == want


@needs_kernel
def test_bf16_where_its_kernel_cannot_serve_is_refused_or_left_at_fp32(monkeypatch):
    with pytest.raises(ConfigError, match="head size of 32, 64, 128"):
        kv_dtype.resolve(_model(16), "bf16", "fast")
    assert kv_dtype.resolve(_model(16), "auto", "fast") == torch.float32
    monkeypatch.setattr(few_rows, "attention_usable", lambda: False)
    with pytest.raises(ConfigError, match="AVX-512"):
        kv_dtype.resolve(_model(64), "bf16", "fast")
    assert kv_dtype.resolve(_model(64), "auto", "fast") == torch.float32


@needs_kernel
@pytest.mark.parametrize("setting,want", [("auto", torch.bfloat16), ("fp32", torch.float32)])
def test_the_engine_caches_take_it(setting, want):
    """SmolLM2 (its Q4_1 file) in the fast arithmetic, eager: the engine's cache in the dtype. (The pair's 0.5B
    draft: tests/models/test_qwen2.py.)"""
    llm = LLM(
        target="smollm2-135m-instruct",
        method="none",
        controller="fixed",
        arithmetic="fast",
        kv_cache_dtype=setting,
        enforce_eager=True,
        max_num_seqs=1,
        max_model_len=64,
    )
    assert llm.engine.cache.k.dtype == want and llm.engine.cache.v.dtype == want


def test_a_bad_setting_is_one_clear_error():
    with pytest.raises(ConfigError, match="kv_cache_dtype 'fp8'"):
        LLM(target="smollm2-135m-instruct", method="none", kv_cache_dtype="fp8")
