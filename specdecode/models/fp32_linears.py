"""The fp32 CPU linears an eager model infers with: the few-rows GEMM where it serves, else the packing timed fastest.

An eager step should be batch invariant like the compiled one: a row's logits must not depend on the rows
beside it, or a greedy request served in a batch can part from the same request served alone at a near tie.
MKL's and oneDNN's GEMMs block by the number of rows, so they are not: a row's output changed in its last bits at
96-98 of the row counts 2-99 with plain F.linear, MKL-packed and oneDNN-packed linears, for [576 -> 1536],
[64 -> 192] and [64 -> 49152] weights alike, and at none with the few-rows GEMM; on SmolLM2's dense checkpoint
12 of 12 answers (tokens and log-probabilities) changed batched against alone with oneDNN, none with it. It was
also the fastest at every row count: 30 of SmolLM2's [576 -> 1536] linears took 2.4 / 3.5 / 8.4 / 28 / 112 ms at
1 / 9 / 64 / 256 / 1,024 rows against oneDNN's 4.8 / 6.9 / 11.7 / 38 / 130 (`python -m
experiments.linear_row_invariance`, results/linear_row_invariance.json, 2-core AMD EPYC, 2026-12-01). So every
linear whose width the kernel takes gets it; the rest (and every linear on a CPU without it) keep
models/packed_linear.py's choice, which is what the model had before. The price is memory: a FewRowsLinear keeps
its dense weight beside the packed panels (as MKL's packing does; oneDNN's replaced it), so an eager dense model
holds its untied linears twice.
"""

from __future__ import annotations

import torch
from torch import nn

from specdecode.models import few_rows, packed_linear


def install(model: nn.Module, device: torch.device, dtype: torch.dtype) -> None:
    """Replace `model`'s frozen nn.Linears for inference on `device` in `dtype` (fp32 CPU only; else nothing)."""
    if few_rows.available(device, dtype):
        few_rows.install(model)  # widths that are a multiple of 16: batch invariant
    if packed_linear.available(device, dtype):
        packed_linear.pack_linears(model)  # what is left an nn.Linear
