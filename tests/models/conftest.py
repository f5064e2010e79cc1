"""Fixtures for the loader tests: a fresh conversion of the real SmolLM2 GGUF, and tiny GGUFs written here; the
quantized kernels, built and loaded for the tests that run them."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import pytest
from safetensors.numpy import load_file

from specdecode.models import quant_int8, quant_rows
from specdecode.models.loader import BUILTIN_MODELS, resolve_model_dir
from specdecode.models.provision import ProvisionError, check_installed
from specdecode.models.torch_op import compiler

SMOLLM2 = "smollm2-135m-instruct"

# llama.cpp's tensor names, written out independently of the converter's own table.
GGUF_BLOCK_NAMES = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def build_kernel(library: Callable[[], Path]) -> None:
    """Skip only without a C++ compiler; where there is one, a build error raises here: the tests error, they do
    not skip."""
    if compiler() is None:
        pytest.skip("no C++ compiler here")
    library()


@pytest.fixture(scope="module")
def quant_rows_kernel() -> None:
    build_kernel(quant_rows.library)


@pytest.fixture(scope="module")
def quant_int8_kernel() -> None:
    build_kernel(quant_int8.library)


@pytest.fixture(scope="session")
def smollm2_cache(tmp_path_factory) -> Path:
    """An empty cache, so the conversion below really runs (once per session)."""
    return tmp_path_factory.mktemp("specdecode_cache")


@pytest.fixture(scope="session")
def converted_smollm2(smollm2_cache) -> Path:
    return resolve_model_dir(SMOLLM2, cache_dir=smollm2_cache, progress=False)


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    return BUILTIN_MODELS[SMOLLM2].gguf_path(SMOLLM2)


def llamacpp_permute(w: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py reordering of q/k rows (HF halves -> interleaved pairs)."""
    return w.reshape(num_heads, 2, w.shape[0] // num_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_name(hf_name: str) -> str:
    top = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    if hf_name in top:
        return top[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)  # model.layers.<i>.<module>.weight
    return f"blk.{layer}.{GGUF_BLOCK_NAMES[rest.removesuffix('.weight')]}.weight"


def write_gguf_from_hf(hf_dir: Path, out: Path, arch: str = "llama") -> Path:
    """Write an HF Llama checkpoint as a float32 GGUF the way llama.cpp's converter lays it out."""
    cfg = json.loads((hf_dir / "config.json").read_text())
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    writer = gguf.GGUFWriter(str(out), arch)
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base((cfg.get("rope_parameters") or cfg)["rope_theta"])
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    writer.add_vocab_size(cfg["vocab_size"])
    writer.add_bos_token_id(cfg["bos_token_id"])
    writer.add_eos_token_id(cfg["eos_token_id"])
    for name, w in load_file(hf_dir / "model.safetensors").items():  # each [out, in] or [dim]
        if "q_proj" in name:
            w = llamacpp_permute(w, heads)
        elif "k_proj" in name:
            w = llamacpp_permute(w, kv_heads)
        writer.add_tensor(gguf_name(name), np.ascontiguousarray(w, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def pair_missing() -> str:
    """Why the Qwen2.5-Coder pair can't be used here ('' when it can)."""
    try:
        for name in ("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"):
            check_installed(name)
    except ProvisionError as e:
        return str(e)
    return ""
