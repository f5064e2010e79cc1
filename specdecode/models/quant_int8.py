"""The "fast" arithmetic: GGUF-block linears with int8-quantized activations (llama.cpp's CPU arithmetic, defined).

`QuantLinear` (models/quant_rows.py) multiplies the file's blocks by fp32 activations: exact, and at one row bound
by decoding each weight to fp32 (3-10 vector operations per 16 weights). The op here,
`specdecode::quant_int8_grouped_linear` (kernels/quant_int8.cpp, whose header defines the arithmetic to the last
rounding), quantizes each activation row on its own, per block of 32 values (per 256-value super-block against Q4_K
and Q6_K), to int8 with scale max|x| / 127; takes one exact integer dot product per weight block and output (a
K-quant's sub-block scales applied in integers); and applies the fp32 scales once per block, in a fixed order. The
weight rows are grouped 16 at a time (models/row_groups.py): a vector lane is an output row, so one integer
instruction serves 16 outputs and a block's fp32 steps are one vector operation for all 16. AVX512-VNNI where the
CPU has it, else AVX-512BW, else AVX2 (two 8-lane halves per group: CPUs without AVX-512), else portable scalar
code, all bitwise equal; where the CPU and OS give AMX-INT8,
calls of 16 rows and more (prompt chunks) take the 32-weight types' (Q4_0, Q4_1, Q5_0, Q8_0) integer sums from AMX
tiles, the same bits again (`python -m experiments.amx_prefill`: a SmolLM2 prefill 0.89-0.94x VNNI's time).

It is not the dequantized model's product, but it is a function of each row alone: a row's output is bitwise the
same alone or in any batch, so speculation under it stays exact with respect to it.

`use_int8(model)` swaps a model's QuantLinears for `Int8QuantLinear`s over the same blocks, grouped once there (the
file's bytes, in another order); the file's rows are let go, and rebuilt from the groups
(`ungroup_rows`) where a row subset or `dequantized` asks for them;
`apply_arithmetic` does so for arithmetic "fast" (EngineConfig.arithmetic; `exact`, the default, leaves the model
as it is).
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from pathlib import Path

import torch
from gguf import GGMLQuantizationType
from torch import nn

from specdecode.models.quant_rows import TYPES, QuantLinear
from specdecode.models.row_groups import group_rows, ungroup_rows
from specdecode.models.torch_op import build_op, load_op, load_unless_tracing

SOURCE = Path(__file__).parent / "kernels" / "quant_int8.cpp"
# No -mavx512*: the vector functions carry their own target attribute and are chosen at run time.
# -ffp-contract=off: no fused multiply-adds; the fp32 steps are the ones the .cpp's header defines.
FLAGS = ["-O3", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC", "-std=c++17", "-w"]
AUTO, VNNI, BW, PORTABLE, AMX, AVX2 = 0, 1, 2, 3, 4, 5  # the op's `path`
FAULT_NONE, FAULT_SCALE, FAULT_SHARED = 0, 1, 2  # set_fault's modes


@functools.cache
def library() -> Path:
    """Build the op into the cache (keyed by source, flags, compiler and torch) the first time and load it into
    this process; returns the library's path."""
    path = build_op("quant_int8", SOURCE, FLAGS, "int8 quantized kernel")
    load_op(path, "quant_int8_grouped_linear", _fake_quant_int8_grouped_linear)
    return path


def _fake_quant_int8_grouped_linear(
    x: torch.Tensor,
    groups: torch.Tensor,
    qtype: int,
    in_features: int,
    out_features: int,
    bias: torch.Tensor | None = None,
    path: int = 0,
) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], out_features)


def paths() -> list[int]:
    """The paths this CPU runs: AMX where the CPU and OS give it, VNNI, BW and AVX2 where the CPU reports them,
    PORTABLE always. The op's AUTO takes AMX from 16 activation rows on (`amx_from_rows`) and the first of the others
    below: every path gives the same bits."""
    library()
    features = int(torch.ops.specdecode.quant_int8_features())
    return [p for p, bit in ((AMX, 4), (VNNI, 1), (BW, 2), (AVX2, 8)) if features & bit] + [PORTABLE]


def set_fault(mode: int) -> None:
    """Tests only: FAULT_SCALE misreads one sub-block scale (sub-block 5 of a K-quant super-block, or every
    32-weight block b with b % 8 == 5, takes its neighbour's); FAULT_SHARED quantizes each activation block
    with one scale shared by all rows of the call; FAULT_NONE is the defined arithmetic."""
    ctypes.CDLL(str(library())).specdecode_quant_int8_fault(int(mode))


def prefetch_distance(nbytes: int = -1) -> int:
    """The vector paths' prefetch distance in bytes, by the CPU's vendor (8 KiB; 2 KiB on Intel: the kernel's
    header); `nbytes` >= 0 sets it (rounded down to a line) for this process, for experiments."""
    fn = ctypes.CDLL(str(library())).specdecode_quant_int8_prefetch
    fn.argtypes, fn.restype = [ctypes.c_int64], ctypes.c_int64
    return int(fn(nbytes))


def amx_from_rows(rows: int = -1) -> int:
    """The activation rows from which the op's AUTO takes AMX where the CPU has it (16; 0: never); `rows` >= 0
    sets it for this process, for experiments."""
    fn = ctypes.CDLL(str(library())).specdecode_quant_int8_amx_from
    fn.argtypes, fn.restype = [ctypes.c_int64], ctypes.c_int64
    return int(fn(rows))


def quant_int8_linear(
    x: torch.Tensor,
    blocks: torch.Tensor,
    qtype: GGMLQuantizationType,
    in_features: int,
    bias: torch.Tensor | None = None,
    path: int = AUTO,
) -> torch.Tensor:
    """x [..., in] against the GGUF rows blocks [out, bytes_per_row] in the int8 arithmetic (+ bias [out])
    -> [..., out] fp32. The rows are grouped on every call here (`Int8QuantLinear` groups them once)."""
    return quant_int8_grouped_linear(x, group_rows(blocks, qtype), qtype, in_features, blocks.shape[0], bias, path)


def quant_int8_grouped_linear(
    x: torch.Tensor,
    groups: torch.Tensor,
    qtype: GGMLQuantizationType,
    in_features: int,
    out_features: int,
    bias: torch.Tensor | None = None,
    path: int = AUTO,
) -> torch.Tensor:
    """x [..., in] against a weight's rows grouped by models/row_groups.py, groups [ceil(out / 16), bytes]
    (+ bias [out]) -> [..., out] fp32, in the int8 arithmetic."""
    load_unless_tracing(library)
    return torch.ops.specdecode.quant_int8_grouped_linear.default(
        x, groups, int(qtype), in_features, out_features, bias, path
    )


class Int8QuantLinear(nn.Module):
    """A `QuantLinear`'s blocks and bias (shared, not copied) multiplied in the int8 arithmetic."""

    def __init__(self, linear: QuantLinear, groups: torch.Tensor | None = None) -> None:
        """groups: the linear's blocks already grouped (models/grouped_cache.py), else grouped here."""
        super().__init__()
        if linear.qtype not in TYPES:
            raise ValueError(f"Int8QuantLinear supports {', '.join(t.name for t in TYPES)}, not {linear.qtype.name}")
        self.qtype, self.in_features, self.out_features = linear.qtype, linear.in_features, linear.out_features
        library()  # its op, registered before any graph traces `forward`
        self.register_buffer("bias", linear.bias)  # [out] fp32 or None
        if groups is None:
            groups = group_rows(linear.blocks, self.qtype)
        self.register_buffer("groups", groups)  # [ceil(out / 16), bytes]

    @property
    def blocks(self) -> torch.Tensor:
        """The file's rows [out, bytes_per_row] uint8, rebuilt from the groups (for row subsets and
        `dequantized`; only the groups are held, so a fast model holds its weights once)."""
        return ungroup_rows(self.groups, self.qtype, self.out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return quant_int8_grouped_linear(
            x, self.groups, self.qtype, self.in_features, self.out_features, self.bias
        )  # [..., out]

    def dequantized(self) -> torch.Tensor:
        """The fp32 weight [out, in] the blocks define (for readers that need it dense)."""
        return QuantLinear(self.blocks, self.qtype, self.in_features).dequantized()

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, qtype={self.qtype.name}, int8"


def use_int8(model: nn.Module, groups: dict[str, torch.Tensor] | None = None) -> int:
    """Swap every QuantLinear in `model` (ConcatLinear parts included: they are children too) for an
    Int8QuantLinear over the same buffers; returns how many were swapped. groups: each one's grouped blocks by
    module name, as grouped before (models/grouped_cache.py), else they are grouped here."""
    swapped = 0
    for prefix, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, QuantLinear):
                full = f"{prefix}.{name}" if prefix else name
                setattr(parent, name, Int8QuantLinear(child, None if groups is None else groups[full]))
                swapped += 1
    return swapped


def apply_arithmetic(
    model: nn.Module, value: str, groups: Callable[[nn.Module], dict[str, torch.Tensor]] | None = None
) -> nn.Module:
    """The model in the arithmetic `value` names (EngineConfig.arithmetic): under "fast" its QuantLinears become
    Int8QuantLinears (in place); under "exact" it is returned untouched. groups: where their grouped rows come
    from, by module name (a file's cache: models/grouped_cache.py), asked only under "fast"; else grouped here."""
    if value == "fast":
        use_int8(model, None if groups is None else groups(model))
    return model
