"""Attention in a fixed order per query, for CPUs where the AVX-512 few-queries kernel does not serve.

models/attention.py runs a decode or verify step's attention through the few-queries kernel on an AVX-512 CPU: a
query's result there does not depend on the tokens or rows beside it, so a verify's logits equal a one-token
step's bit for bit and speculation is exact with respect to plain decoding. Elsewhere attention was ATen's SDPA,
whose reduction over keys is cut in blocks that move with the number of queries and the padding: a query in a
5-token verify differed in its last bits from the same query decoded alone, and under the fast arithmetic (int8
activations) that flipped greedy tokens (tests/models/test_fast_arithmetic.py on a CPU without AVX-512,
2026-12-07). `specdecode::ordered_attend` (kernels/ordered_attention.cpp, portable C++ whose header defines the
order) computes each query over its visible keys in key order, a function of that query, its mask row and those
keys alone, for any number of new tokens (prompt chunks too), rows, padding or threads.

It is compiled on first use with the system C++ compiler into the cache directory, like the other kernels;
without a compiler, or with $SPECDECODE_ORDERED_ATTENTION=0, attention stays on SDPA (and speculation on such a
CPU is exact only to fp32 rounding of the attention).
"""

from __future__ import annotations

import functools
import os
import warnings
from pathlib import Path

import torch

from specdecode.models.torch_op import KernelBuildError, build_op, load_op

ENV = "SPECDECODE_ORDERED_ATTENTION"  # "0": SDPA, as before
SOURCE = Path(__file__).parent / "kernels" / "ordered_attention.cpp"
# -ffp-contract=off: no fused multiply-adds; each product and sum is rounded as the source's header says.
FLAGS = ["-O3", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC", "-std=c++17", "-w"]
LANES = 8  # the head size must be a multiple of it


@functools.cache
def library() -> Path:
    """Build the op into the cache (keyed by source, flags, compiler and torch) the first time and load it into
    this process; returns the library's path."""
    path = build_op("ordered_attention", SOURCE, FLAGS, "ordered attention kernel")
    load_op(path, "ordered_attend", _fake_ordered_attend)
    return path


def _fake_ordered_attend(q, cache_k, cache_v, layer, slots, write_pos, mask) -> torch.Tensor:
    return q.new_empty(q.shape[0], q.shape[1], q.shape[2] * q.shape[3])


@functools.cache
def usable() -> bool:
    """Whether the op serves here: not turned off by $SPECDECODE_ORDERED_ATTENTION, and it builds (a build error
    warns once and leaves attention on SDPA)."""
    if os.environ.get(ENV) == "0":
        return False
    try:
        library()
    except (KernelBuildError, OSError, RuntimeError) as e:  # RuntimeError: torch refused to load it
        warnings.warn(f"ordered attention unavailable, attention stays on SDPA: {e}", stacklevel=3)
        return False
    return True


def ordered_attend(
    q: torch.Tensor,  # [num_seqs, T, heads, head_dim]
    cache_k: torch.Tensor,  # [layers, slots, kv_heads, len + 1, head_dim] fp32, the new keys already written
    cache_v: torch.Tensor,  # [layers, slots, kv_heads, len + 1, head_dim]
    layer: int,
    slots: torch.Tensor,  # [num_seqs] int64
    write_pos: torch.Tensor,  # [num_seqs, T] int64, -1 for padding
    mask: torch.Tensor,  # [num_seqs, 1, T, kv_len] additive fp32 (0 or -inf)
) -> torch.Tensor:
    """The attention output [num_seqs, T, heads * head_dim]: each query over its visible keys in key order."""
    return torch.ops.specdecode.ordered_attend.default(q, cache_k, cache_v, layer, slots, write_pos, mask)
