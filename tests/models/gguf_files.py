"""Hand-made GGUF files for the loader tests: tiny Hugging Face checkpoints of each family written the way
llama.cpp's converter lays them out (names, q/k row order, raw quant types), with gguf's own GGUFWriter."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import torch
from safetensors.numpy import load_file as load_numpy
from safetensors.torch import load_file, save_file

from tests.models.conftest import gguf_name, llamacpp_permute
from tests.tiny import write_tiny_model


def write_gguf(hf_dir: Path, out: Path, arch: str, tensor_types: dict[str, int] | None = None) -> Path:
    """An HF checkpoint as a GGUF the way llama.cpp's converter writes `arch`: q/k rows permuted for llama and
    mistral only, biases and q/k norms under llama.cpp's names. tensor_types: raw types to write some as."""
    cfg = json.loads((hf_dir / "config.json").read_text())
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    writer = gguf.GGUFWriter(str(out), arch)
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(cfg.get("head_dim") or cfg["hidden_size"] // heads)
    writer.add_rope_freq_base((cfg.get("rope_parameters") or cfg)["rope_theta"])
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    writer.add_bos_token_id(cfg["bos_token_id"])
    writer.add_eos_token_id(cfg["eos_token_id"])
    for name, w in load_numpy(hf_dir / "model.safetensors").items():  # [out, in], [out] or [dim]
        if arch in ("llama", "mistral") and ("q_proj" in name or "k_proj" in name):
            w = llamacpp_permute(w, heads if "q_proj" in name else kv_heads)
        target = llamacpp_name(name)
        raw = (tensor_types or {}).get(target)
        if raw is None:
            writer.add_tensor(target, np.ascontiguousarray(w, dtype=np.float32))
        else:  # zero bytes of the right size for that type: the loader must refuse before reading them
            rows, cols = w.shape
            block, nbytes = gguf.GGML_QUANT_SIZES[raw]
            writer.add_tensor(target, np.zeros((rows, cols // block * nbytes), np.uint8), raw_dtype=raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def llamacpp_name(hf_name: str) -> str:
    extra = {"self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"}
    if hf_name.endswith(".bias"):
        return gguf_name(hf_name.removesuffix(".bias") + ".weight").removesuffix(".weight") + ".bias"
    _, _, layer, rest = hf_name.split(".", 3) if hf_name.startswith("model.layers.") else ("", "", "", "")
    module = rest.removesuffix(".weight")
    return f"blk.{layer}.{extra[module]}.weight" if module in extra else gguf_name(hf_name)


def tiny_with_biases(out_dir: Path, family: str, **overrides) -> Path:
    """A tiny model whose attention biases are random (transformers initialises them to zero, which a
    dropped bias would match)."""
    write_tiny_model(out_dir, family, **overrides)
    tensors = load_file(out_dir / "model.safetensors")
    gen = torch.Generator().manual_seed(1)
    for name, t in tensors.items():
        if name.endswith(".bias"):
            tensors[name] = torch.randn(t.shape, generator=gen)
    save_file(tensors, out_dir / "model.safetensors", metadata={"format": "pt"})
    return out_dir
