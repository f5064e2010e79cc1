"""A Llama model straight from a GGUF file, its linears kept in the file's quantized blocks.

models/loader.py dequantizes a GGUF file to fp32 safetensors: SmolLM2-135M's 92 MiB Q4_1 file becomes ~540 MB
read per decode step. Here every linear whose tensor is one of the types models/quant_rows.py multiplies
(Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K) keeps the raw blocks in a `QuantLinear`; F32/F16/BF16 tensors and other
quant types are dequantized to fp32 (`load_gguf_quantized` returns which). The model is the loader's
`LlamaModel`, and its logits are the dequantized model's up to fp32 summation order: every weight decodes to
the value `gguf.quants.dequantize` gives, which is what the loader writes.

This is how a GGUF model loads on the CPU in fp32 by default (`quantized_source`); SPECDECODE_WEIGHTS=fp32 (or
`LLM(weights="fp32")`, `--weights fp32`) keeps the loader's dequantized fp32 model as the reference path. The
compiled step (models/compiled.py, models/aot_package.py) runs these modules as they are: the op is opaque to
the compiler and the blocks are the package's constants, handed over at load without a copy.

Three things the fp32 path does to whole tensors are done to rows of blocks (a row is a whole number of blocks):
llama.cpp's rope order of the Q and K rows (llama and mistral files only) is undone by reordering rows (and
their biases); q/k/v and gate/up are fused into `wqkv` and `w13` by concatenating rows where their types match,
by `ConcatLinear` where they differ (a Q4_K_M file mixes them); a tied LM head multiplies by the embedding's
blocks. The embedding table keeps its blocks too (`QuantEmbedding`: a lookup decodes only the rows it reads, to
the values `gguf.quants.dequantize` gives) unless its type has no kernel path, so readers take the model's device
and dtype from `LlamaModel.device` and `.dtype`, not from `embed.weight`.
"""

from __future__ import annotations

import warnings
from collections.abc import Collection, Sequence
from pathlib import Path

import gguf
import numpy as np
import torch
from torch import nn

from specdecode.config import DRAFT_WEIGHTS
from specdecode.models.gguf_weights_reader import WeightsReader
from specdecode.models.llama import LlamaConfig, LlamaModel, rope_inv_freq
from specdecode.models.loader import (
    _PERMUTED_ARCHITECTURES,
    BUILTIN_MODELS,
    ModelLoadError,
    _hf_config,
    _open_gguf,
    _unpermute_rope_rows,
)
from specdecode.models.quant_rows import TYPES, QuantEmbedding, QuantLinear
from specdecode.models.requantize import REQUANTIZED, requantized_blocks


def quantized_source(spec: str, device: str, dtype: str, weights: str) -> Path | None:
    """The GGUF file to load `spec` from with its blocks kept, or None where the model loads as fp32 tensors:
    a Hugging Face directory, weights="fp32" (EngineConfig.weights: the setting, resolved), a device other than
    the CPU or a dtype other than float32 (the kernel's activations are fp32 and it runs on the CPU only)."""
    if weights != "quantized" or torch.device(device).type != "cpu" or dtype != "float32":
        return None
    return gguf_file(spec)


def gguf_file(spec: str) -> Path | None:
    """The GGUF file behind a model spec (a built-in name or a .gguf path), or None for a Hugging Face dir."""
    if spec in BUILTIN_MODELS:
        return BUILTIN_MODELS[spec].gguf_path(spec)
    path = Path(spec).expanduser()
    return path if path.suffix == ".gguf" and path.is_file() else None


class ConcatLinear(nn.Module):
    """Several linears over the same input, outputs concatenated along the last dim: [..., sum of outs]."""

    def __init__(self, parts: Sequence[nn.Module]) -> None:
        super().__init__()
        self.parts = nn.ModuleList(parts)
        self.out_features = sum(p.out_features for p in parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([p(x) for p in self.parts], dim=-1)  # [..., out_features]

    def dequantized(self) -> torch.Tensor:
        """The fp32 weight [out, in], for readers that need it dense."""
        return torch.cat([dense_weight(p) for p in self.parts])


def dense_weight(linear: nn.Module) -> torch.Tensor:
    """[out, in] fp32 of a QuantLinear, ConcatLinear or nn.Linear."""
    return linear.dequantized() if hasattr(linear, "dequantized") else linear.weight.detach()


class _Part:
    """Rows of one GGUF tensor on their way into a fused linear: raw blocks (quantized) or fp32 values."""

    def __init__(
        self,
        t: gguf.ReaderTensor,
        rope_heads: int | None,
        path: Path,
        bias: gguf.ReaderTensor | None = None,
        blocks: torch.Tensor | None = None,  # [out, bytes_per_row] uint8: t requantized to `requantized`
        requantized: gguf.GGMLQuantizationType | None = None,
    ) -> None:
        self.qtype = requantized if blocks is not None else t.tensor_type if t.tensor_type in TYPES else None
        self.in_features = int(t.shape[0])  # GGUF lists the fastest-varying dim first
        if blocks is not None:
            rows = blocks
        elif self.qtype is not None:
            rows = torch.from_numpy(np.array(t.data))  # [out, bytes_per_row] uint8, copied out of the mmap
        else:
            rows = _dequantize(t, path)  # [out, in] fp32
        # llama.cpp's rope order, undone per row: a byte row is whole blocks, so reordering rows is exact.
        self.rows = rows if rope_heads is None else _unpermute_rope_rows(rows, rope_heads).contiguous()
        self.bias = None if bias is None else _dequantize(bias, path)  # [out] fp32
        if self.bias is not None and rope_heads is not None:
            self.bias = _unpermute_rope_rows(self.bias, rope_heads).contiguous()


def _dequantize(t: gguf.ReaderTensor, path: Path) -> torch.Tensor:
    shape = tuple(int(d) for d in reversed(t.shape))
    try:
        values = gguf.quants.dequantize(t.data, t.tensor_type)
    except NotImplementedError:
        raise ModelLoadError(f"unsupported GGUF tensor type {t.tensor_type.name} in {path}") from None
    return torch.from_numpy(np.array(values, dtype=np.float32).reshape(shape))


def _embedding(t: gguf.ReaderTensor, path: Path) -> nn.Module:
    """The token table: its blocks kept where the kernel has its type (0.13 GB for a Q4_K table of 151936 x 1536
    where fp32 takes 0.93 GB), else dequantized to an fp32 nn.Embedding."""
    if t.tensor_type in TYPES:
        rows = torch.from_numpy(np.array(t.data))  # [vocab, bytes_per_row] uint8, copied out of the mmap
        return QuantEmbedding(rows, t.tensor_type, int(t.shape[0]))
    table = _dequantize(t, path)  # [vocab, hidden]
    return nn.Embedding(table.shape[0], table.shape[1], _weight=table)


def _fused(parts: Sequence[_Part]) -> nn.Module:
    """One linear for the row-concatenation of `parts`: neighbours of one type share a module."""
    groups: list[list[_Part]] = []
    for p in parts:
        if groups and groups[-1][0].qtype == p.qtype:
            groups[-1].append(p)
        else:
            groups.append([p])
    modules = []
    for g in groups:
        rows = torch.cat([p.rows for p in g])  # [sum of outs, bytes_per_row or in]
        bias = None if g[0].bias is None else torch.cat([p.bias for p in g])  # [sum of outs]
        if g[0].qtype is not None:
            modules.append(QuantLinear(rows, g[0].qtype, g[0].in_features, bias))
        else:
            linear = nn.Linear(rows.shape[1], rows.shape[0], bias=bias is not None)
            linear.weight = nn.Parameter(rows, requires_grad=False)
            if bias is not None:
                linear.bias = nn.Parameter(bias, requires_grad=False)
            modules.append(linear)
    return modules[0] if len(modules) == 1 else ConcatLinear(modules)


def dequantized_linears(reader: gguf.GGUFReader, requantized: Collection[str] = ()) -> list[str]:
    """The file's matrices that load as fp32: F32/F16/BF16 or a type without a kernel path, unless `requantized`
    names them. The embedding table (read one row per token, not multiplied) is listed only as a tied LM head."""
    tied = "output.weight" not in {t.name for t in reader.tensors}
    return [
        f"{t.name} ({t.tensor_type.name})"
        for t in reader.tensors
        if len(t.shape) == 2
        and t.tensor_type not in TYPES
        and t.name not in requantized
        and (t.name != "token_embd.weight" or tied)
    ]


def load_gguf_quantized(
    path: str | Path, device: str | torch.device = "cpu", weights: str = "file", progress: bool = True
) -> LlamaModel:
    """The `LlamaModel` of a Llama GGUF file with quantized linears kept in blocks; eval mode, no grads.
    Linears of a type the kernel lacks are dequantized to fp32, with a warning that names them.
    weights: "file" keeps the file's blocks; "q4_1" or "q4_0" (a draft's: models/requantize.py) requantizes every
    linear that reads more bytes a weight than that type, which then no longer computes the file's model."""
    path = Path(path)
    if torch.device(device).type != "cpu":
        raise ValueError(f"quantized GGUF weights run on the CPU kernel only, not on {device}")
    reader = _open_gguf(path, WeightsReader)  # the tokenizer's arrays are not needed here, nor parsed
    hf_config = _hf_config(reader, path)
    cfg = LlamaConfig.from_hf(hf_config)
    tensors = {t.name: t for t in reader.tensors}
    permuted = hf_config["model_type"] in _PERMUTED_ARCHITECTURES  # llama.cpp reorders q/k rows for these only
    if weights not in DRAFT_WEIGHTS:
        raise ValueError(f"weights must be one of {', '.join(DRAFT_WEIGHTS)}, not {weights!r}")
    qtype = REQUANTIZED.get(weights)
    requantized = requantized_blocks(path, reader, qtype, progress) if qtype is not None else {}

    def part(name: str, rope_heads: int | None = None, bias: bool = False) -> _Part:
        if name not in tensors or (bias and name.replace(".weight", ".bias") not in tensors):
            raise ModelLoadError(f"GGUF file {path} lacks the tensor {name!r} or its bias")
        heads = rope_heads if permuted else None
        b = tensors[name.replace(".weight", ".bias")] if bias else None
        return _Part(tensors[name], heads, path, b, requantized.get(name), qtype)

    with torch.device("meta"):
        model = LlamaModel(cfg)
    if "token_embd.weight" not in tensors:
        raise ModelLoadError(f"GGUF file {path} lacks the tensor 'token_embd.weight'")
    model.embed = _embedding(tensors["token_embd.weight"], path)
    model.norm.weight = nn.Parameter(part("output_norm.weight").rows)
    if cfg.tie_embeddings and isinstance(model.embed, QuantEmbedding):  # one copy of the table's blocks
        model.lm_head = QuantLinear(model.embed.blocks, model.embed.qtype, cfg.hidden_size)
    else:
        model.lm_head = _fused([part("token_embd.weight" if cfg.tie_embeddings else "output.weight")])
    for i, block in enumerate(model.layers):
        p = f"blk.{i}."
        qb = cfg.qkv_bias
        qkv = [part(p + "attn_q.weight", cfg.num_heads, qb), part(p + "attn_k.weight", cfg.num_kv_heads, qb)]
        block.attn.wqkv = _fused([*qkv, part(p + "attn_v.weight", bias=qb)])
        block.attn.wo = _fused([part(p + "attn_output.weight", bias=cfg.o_bias)])
        if cfg.qk_norm:
            block.attn.q_norm.weight = nn.Parameter(part(p + "attn_q_norm.weight").rows)
            block.attn.k_norm.weight = nn.Parameter(part(p + "attn_k_norm.weight").rows)
        block.mlp.w13 = _fused([part(p + "ffn_gate.weight"), part(p + "ffn_up.weight")])
        block.mlp.w2 = _fused([part(p + "ffn_down.weight")])
        block.attn_norm.weight = nn.Parameter(part(p + "attn_norm.weight").rows)
        block.mlp_norm.weight = nn.Parameter(part(p + "ffn_norm.weight").rows)
    model.inv_freq = rope_inv_freq(cfg)  # [head_dim / 2] fp32 (the meta one cannot hold values)
    dense = dequantized_linears(reader, requantized)
    if dense:
        warnings.warn(f"{path.name}: no quantized kernel for {', '.join(dense)}; those are fp32", stacklevel=2)
    return model.requires_grad_(False).eval()
