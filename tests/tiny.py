"""Tiny random Hugging Face checkpoints of each supported family, written with transformers itself."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

FAMILIES = ("llama", "mistral", "qwen2", "qwen3")


def tiny_hf_config(family: str, vocab_size: int = 96, **overrides):
    common = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=family == "qwen3",
    )
    common.update(overrides)
    cls = {
        "llama": transformers.LlamaConfig,
        "mistral": transformers.MistralConfig,
        "qwen2": transformers.Qwen2Config,
        "qwen3": transformers.Qwen3Config,
    }[family]
    if family == "qwen3":
        common.setdefault("head_dim", 16)
    return cls(**common)


def write_tiny_model(
    out_dir: Path, family: str = "llama", seed: int = 0, embed_scale: float = 30.0, **overrides
) -> Path:
    """A random model of `family` saved as safetensors; returns the directory."""
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(tiny_hf_config(family, **overrides))
    with torch.no_grad():  # a strong embedding/head gives peaked, varied logits (not one repeated token)
        for name, p in model.named_parameters():
            if "embed" in name or "lm_head" in name:
                p.mul_(embed_scale)
    model.save_pretrained(out_dir)
    return Path(out_dir)
