"""The compute floor of a target forward: its floating-point work over the fastest fp32 GEMM this machine runs.

A forward over b rows of t new tokens at context c multiplies every token by every linear (the LM head too:
a verify needs logits at every position) and attends each query to its c + t keys. No fp32 step can run
faster than that work at the machine's best matrix rate, which `peak_gflops` measures on a large,
compute-bound GEMM with every thread. `bench cost` prints the floor beside the measured step, so a target
ratio below the floor's is shown to need lower-precision arithmetic, not a better kernel.
"""

from __future__ import annotations

import time

import torch

from specdecode.models import few_rows
from specdecode.models.llama import LlamaConfig


def linear_params(cfg: LlamaConfig) -> int:
    """Multiply-adds per token in every linear layer of a forward, the LM head included."""
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    attention = cfg.hidden_size * (q + 2 * kv) + q * cfg.hidden_size  # wqkv, wo
    mlp = 3 * cfg.hidden_size * cfg.intermediate_size  # gate, up, down
    return cfg.num_layers * (attention + mlp) + cfg.vocab_size * cfg.hidden_size


def forward_gflop(cfg: LlamaConfig, batch: int, tokens: int, context: int) -> float:
    """GFLOP of one forward: 2 per multiply-add in the linears, plus scores and weighted values (2 x 2 x heads x
    head_dim per query and key) for each query over its context and the new tokens (causally: on average half)."""
    rows = batch * tokens
    keys = context + (tokens + 1) / 2  # mean keys a new token attends to
    attention = 4 * cfg.num_heads * cfg.head_dim * keys * cfg.num_layers
    return rows * (2 * linear_params(cfg) + attention) / 1e9


PEAK_SHAPES = ((2048, 576, 1536), (1536, 1536, 1536))  # [m, k] x [k, n]: a prefill chunk through SmolLM2's MLP
FEW_ROWS_SHAPES = ((48, 576, 1536), (96, 576, 1536), (96, 1536, 576))  # the step's own kernel, where it serves


def peak_gflops(repeats: int = 15, shapes=PEAK_SHAPES, few_rows_shapes=FEW_ROWS_SHAPES) -> float:
    """The fastest fp32 GEMM rate seen on this machine, GFLOP/s: the best of `repeats` products of each shape
    after two warm-ups, through torch.mm and through the step's own few-rows kernel where it serves. The best,
    not the median: a floor for "cannot be reached" must be optimistic."""
    kernels = [(torch.mm, shapes, lambda w: w)]
    if few_rows.available(torch.device("cpu"), torch.float32):
        kernels.append((few_rows.few_rows_linear, few_rows_shapes, lambda w: few_rows.pack(w.T.contiguous())))
    best = 0.0
    for run, sizes, prepare in kernels:
        for m, k, n in sizes:
            a, b = torch.randn(m, k), prepare(torch.randn(k, n))
            for i in range(repeats + 2):
                t0 = time.perf_counter()
                run(a, b)
                if i >= 2:
                    best = max(best, 2 * m * k * n / (time.perf_counter() - t0) / 1e9)
    return best
