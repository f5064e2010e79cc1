"""Linears over GGUF weights kept quantized: each block is decoded once per call for all the rows multiplied.

Dequantizing a GGUF file to fp32 (models/loader.py) makes a decode step stream ~5.5x the bytes llama.cpp
reads. The op here (kernels/quant_rows.cpp, `specdecode::quant_rows_linear`) keeps each weight as the file's
raw blocks, a uint8 tensor [out, bytes_per_row] of type Q4_0, Q4_1, Q5_0, Q8_0, Q4_K or Q6_K, and computes
y = x @ dequant(W)^T (+ bias) with fp32 activations. It is exact in this sense: every weight decodes to the
fp32 value `gguf.quants.dequantize` gives, and each output is one fixed-order fp32 sum (16 lanes of FMAs over k,
then a fixed tree; the .cpp's header defines it), the same on every path (`paths()`: AVX-512, AVX2 where AVX-512
is missing, portable where both are) and the same whatever rows share the call.

The same library looks rows up in an embedding table kept as blocks (`specdecode::quant_rows_embedding`,
`QuantEmbedding`): only the rows asked for are decoded, to the values `gguf.quants.dequantize` gives.

Like models/few_rows.py, the library is compiled on first use with the system C++ compiler against this torch,
into the cache directory. The vector paths need x86-64 and GCC, and the CPU's AVX-512 (AVX-512F, F16C) or AVX2
(AVX2, FMA, F16C: AMD's CPUs before Zen 4, Intel's client ones without AVX-512, Alder Lake and later among them);
the op takes the first of them the CPU has. The portable path (one std::fma per weight and row, 24-59x AVX2's time
at one row) keeps the results, not the speed, where neither is there.

The AVX-512 path decodes each 16-weight chunk into a register (the 4-bit types by a 16-entry table per
sub-block and one permute, Q5_0 by a 32-entry one) and runs it against every activation row at once, over 2-4
weight rows per task so that enough independent FMA chains are in flight at one row. A block's header (fp16
scales, the K-quants' packed sub-block scales) is decoded with vector instructions once per block, and each
block asks for the next task's bytes ahead of use: without that the kernel streamed its weights from memory at
5-11 GB/s and waited on them; now 14-18 GB/s at one row (`python -m experiments.quant_rows_ab`;
experiments/quant_rows_speed.py's shapes mostly fit the cache and hide it). At one row the 4-bit types are held
first by their decoding instructions (`python -m experiments.quant_rows_bound`: a sequential stream of rows gains
nothing; without Q4_K's table lookup the loop streams 18 GB/s in this layout and 32 in one stream, against 15); at
several rows by the fp32 FMAs (rows x out x in / 16 of them). The exact fp32 product rules out llama.cpp's int8
dot products with quantized activations: those are the fast arithmetic's (models/quant_int8.py).

The AVX2 path is the same design in 8-wide halves with 16 registers: 1-2 weight rows per task and passes of at most
6 activation rows, each weight decoded by arithmetic (AVX2 has no 16-entry permute to look it up). On a Zen 4 EPYC,
which runs both, it takes 1.05-1.28x the AVX-512 path's time at one row and 1.02-1.43x at five, the portable path
19-58x its time (`python -m experiments.avx2_paths`, results/avx2_paths_zen4.json, 2026-12-07).
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType
from torch import nn

from specdecode.models.torch_op import build_op, load_op, load_unless_tracing

SOURCE = Path(__file__).parent / "kernels" / "quant_rows.cpp"
# No -mavx512f: the AVX-512 functions carry their own target attribute and are chosen at run time.
# -ffp-contract=off: the compiler fuses nothing; the only FMAs are the ones the defined order spells out.
FLAGS = ["-O3", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC", "-std=c++17", "-w"]
TYPES = (
    GGMLQuantizationType.Q4_0,
    GGMLQuantizationType.Q4_1,
    GGMLQuantizationType.Q5_0,
    GGMLQuantizationType.Q8_0,
    GGMLQuantizationType.Q4_K,
    GGMLQuantizationType.Q6_K,
)
AUTO, AVX512, PORTABLE, AVX2 = 0, 1, 2, 3  # the op's `path`


@functools.cache
def library() -> Path:
    """Build the op into the cache (keyed by source, flags, compiler and torch) the first time and load it into
    this process; returns the library's path."""
    path = build_op("quant_rows", SOURCE, FLAGS, "quantized few-rows kernel")
    load_op(path, "quant_rows_linear", _fake_quant_rows_linear)
    _register_embedding_fake()
    return path


@functools.cache
def _register_embedding_fake() -> None:
    """The embedding op's fake, once per process (load_op registers the linear's)."""
    torch.library.register_fake("specdecode::quant_rows_embedding", _fake_quant_rows_embedding)


def _fake_quant_rows_linear(
    x: torch.Tensor, blocks: torch.Tensor, qtype: int, in_features: int, bias: torch.Tensor | None = None, path: int = 0
) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], blocks.shape[0])


def _fake_quant_rows_embedding(ids: torch.Tensor, blocks: torch.Tensor, qtype: int, dim: int) -> torch.Tensor:
    return blocks.new_empty(*ids.shape, dim, dtype=torch.float32)


def has_avx512() -> bool:
    """Whether the kernel's AVX-512 path runs on this CPU (it asks the CPU, as the op's automatic choice does)."""
    library()
    return bool(torch.ops.specdecode.quant_rows_avx512())


def has_avx2() -> bool:
    """Whether the kernel's AVX2 path (AVX2, FMA and F16C) runs on this CPU, as `has_avx512`."""
    library()
    return bool(torch.ops.specdecode.quant_rows_avx2())


def paths() -> list[int]:
    """The paths this CPU runs, in the order AUTO prefers them: AVX512 and AVX2 where the CPU has them, PORTABLE
    always. Every path gives the same bits."""
    return [p for p, has in ((AVX512, has_avx512()), (AVX2, has_avx2())) if has] + [PORTABLE]


def set_fault(on: bool) -> None:
    """Tests only: make the kernel misread one sub-block scale (sub-block 5 of a K-quant super-block, or every
    32-weight block b with b % 8 == 5, takes its neighbour's scale), for negative controls."""
    ctypes.CDLL(str(library())).specdecode_quant_rows_fault(int(on))


def quant_rows_linear(
    x: torch.Tensor,
    blocks: torch.Tensor,
    qtype: GGMLQuantizationType,
    in_features: int,
    bias: torch.Tensor | None = None,
    path: int = AUTO,
) -> torch.Tensor:
    """x [..., in] @ dequant(blocks)^T (+ bias [out]) -> [..., out], blocks the raw GGUF rows [out, bytes_per_row]."""
    load_unless_tracing(library)
    return torch.ops.specdecode.quant_rows_linear.default(x, blocks, int(qtype), in_features, bias, path)


def quant_rows_embedding(
    ids: torch.Tensor, blocks: torch.Tensor, qtype: GGMLQuantizationType, dim: int
) -> torch.Tensor:
    """Rows ids [...] of dequant(blocks) -> [..., dim] fp32, blocks the raw GGUF rows [vocab, bytes_per_row]."""
    load_unless_tracing(library)
    return torch.ops.specdecode.quant_rows_embedding.default(ids, blocks, int(qtype), dim)


def _check_blocks(blocks: torch.Tensor, qtype: GGMLQuantizationType, width: int, what: str) -> GGMLQuantizationType:
    """`qtype` as the enum, once `blocks` is checked to be uint8 [rows, bytes_per_row] of `width` weights a row."""
    qtype = GGMLQuantizationType(qtype)
    if qtype not in TYPES:
        raise ValueError(f"{what} supports {', '.join(t.name for t in TYPES)}, not {qtype.name}")
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    if width % block_size or blocks.dtype != torch.uint8 or blocks.dim() != 2:
        raise ValueError(f"{qtype.name} needs uint8 [rows, bytes] blocks and a row width a multiple of {block_size}")
    if blocks.shape[1] != width // block_size * type_size:
        raise ValueError(f"{blocks.shape[1]} bytes per row do not hold {width} {qtype.name} weights")
    return qtype


def _dequantized(blocks: torch.Tensor, qtype: GGMLQuantizationType) -> torch.Tensor:
    """[rows, width] fp32 by gguf.quants.dequantize: the values the kernel computes with."""
    weight = gguf.quants.dequantize(blocks.numpy(), qtype)
    return torch.from_numpy(np.ascontiguousarray(weight, dtype=np.float32))


class QuantLinear(nn.Module):
    """An inference-only linear whose weight stays in GGUF blocks: `blocks` [out, bytes_per_row] uint8."""

    def __init__(
        self, blocks: torch.Tensor, qtype: GGMLQuantizationType, in_features: int, bias: torch.Tensor | None = None
    ) -> None:
        super().__init__()
        qtype = _check_blocks(blocks, qtype, in_features, "QuantLinear")
        library()  # its op, registered before any graph traces `forward`
        self.qtype, self.in_features, self.out_features = qtype, in_features, blocks.shape[0]
        self.register_buffer("blocks", blocks.contiguous())  # [out, bytes_per_row]
        self.register_buffer("bias", None if bias is None else bias.detach().float().contiguous())  # [out] or None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return quant_rows_linear(x, self.blocks, self.qtype, self.in_features, self.bias)  # [..., out]

    def dequantized(self) -> torch.Tensor:
        """The fp32 weight [out, in] by gguf.quants.dequantize: the values the kernel multiplies by."""
        return _dequantized(self.blocks, self.qtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, qtype={self.qtype.name}"


class QuantEmbedding(nn.Module):
    """An inference-only embedding whose table stays in GGUF blocks: `blocks` [vocab, bytes_per_row] uint8.
    A call decodes only the rows it looks up, to the fp32 values `gguf.quants.dequantize` gives (a 151936-token
    table is 0.9 GB as fp32, 0.13 GB as Q4_K). It has no `weight`: a reader that wants the whole table asks
    for `dequantized()` and pays for it; the model's device and dtype are `LlamaModel.device` and `.dtype`."""

    def __init__(self, blocks: torch.Tensor, qtype: GGMLQuantizationType, embedding_dim: int) -> None:
        super().__init__()
        self.qtype = _check_blocks(blocks, qtype, embedding_dim, "QuantEmbedding")
        library()  # its op, registered before any graph traces `forward`
        self.num_embeddings, self.embedding_dim = blocks.shape[0], embedding_dim
        self.register_buffer("blocks", blocks.contiguous())  # [vocab, bytes_per_row]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return quant_rows_embedding(ids, self.blocks, self.qtype, self.embedding_dim)  # [..., dim]

    def dequantized(self) -> torch.Tensor:
        """The whole fp32 table [vocab, dim], by gguf.quants.dequantize (the values `forward` returns)."""
        return _dequantized(self.blocks, self.qtype)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, qtype={self.qtype.name}"
