"""The draft's architecture: a narrow, shallow Llama sharing the target's vocabulary and tokenizer.

Defaults keep the target's width and head size, so the target's embedding (and LM head) can seed the draft;
a draft only needs to agree with the target on likely next tokens, and the embedding table is most of a small
model's parameters. Any Llama-family target (llama, mistral, qwen2, qwen3) yields a plain Llama draft, which
specdecode's own loader and Hugging Face both run.
"""

from __future__ import annotations

import torch
import transformers

from specdecode.config import ConfigError
from specdecode.train.config import DraftOptions

# Fields a draft inherits unchanged: they define tokens, positions and normalisation, not capacity.
INHERITED = (
    "vocab_size",
    "max_position_embeddings",
    "rms_norm_eps",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "tie_word_embeddings",
    "hidden_act",
)


def _rope_theta(target: dict) -> float:
    rope = target.get("rope_parameters") or target.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise ConfigError("the target uses a scaled RoPE; drafts only support the default RoPE")
    return float(rope.get("rope_theta", target.get("rope_theta", 10000.0)))


def _heads(target: dict, hidden: int, opts: DraftOptions) -> tuple[int, int]:
    t_heads = target["num_attention_heads"]
    head_dim = target.get("head_dim") or target["hidden_size"] // t_heads
    heads = opts.num_heads or max(hidden // head_dim, 1)
    if hidden % heads:
        raise ConfigError(f"hidden size {hidden} is not divisible by {heads} attention heads")
    group = t_heads // (target.get("num_key_value_heads") or t_heads)  # query heads per kv head in the target
    kv = opts.num_kv_heads or max(heads // group, 1)
    if heads % kv:
        raise ConfigError(f"{heads} attention heads are not divisible by {kv} key/value heads")
    return heads, kv


def build_draft_config(target: dict, opts: DraftOptions) -> transformers.LlamaConfig:
    """A LlamaConfig for the draft from the target's config.json contents."""
    hidden = opts.hidden_size or target["hidden_size"]
    heads, kv = _heads(target, hidden, opts)
    ratio = target["intermediate_size"] / target["hidden_size"]
    intermediate = opts.intermediate_size or max(64, round(hidden * ratio / 64) * 64)
    inherited = {k: target[k] for k in INHERITED if target.get(k) is not None}
    return transformers.LlamaConfig(
        **inherited,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=opts.num_layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=hidden // heads,
        rope_parameters={"rope_type": "default", "rope_theta": _rope_theta(target)},
    )


def init_from_target(student: torch.nn.Module, teacher: torch.nn.Module) -> list[str]:
    """Copy every student tensor whose name and shape the teacher shares: embedding, LM head, final norm, and
    the first decoder layers when the widths match. Returns the copied names (empty when nothing fits)."""
    teacher_state = teacher.state_dict()
    copied = []
    with torch.no_grad():
        for name, p in student.state_dict().items():
            src = teacher_state.get(name)
            if src is not None and src.shape == p.shape:
                p.copy_(src)
                copied.append(name)
    return copied


def freeze_embeddings(student: transformers.LlamaForCausalLM) -> None:
    """Freeze the input embedding (and so the LM head too when they are tied)."""
    student.get_input_embeddings().weight.requires_grad_(False)


def summary(cfg: transformers.LlamaConfig) -> dict:
    keys = (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "tie_word_embeddings",
    )
    return {k: getattr(cfg, k) for k in keys}
