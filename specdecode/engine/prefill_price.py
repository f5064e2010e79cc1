"""What a prompt token costs to prefill as the context before it grows, counted in tokens at a prompt's start.

A chunk's linears cost the same at any position; its attention grows with the context cached before it. On two
cores a prefill is compute-bound: a token of the Qwen2.5-Coder 1.5B, fast arithmetic, in 32-token chunks, cost
2.9 ms at the start of a prompt and 3.9 / 5.3 / 7.3 / 12.0 ms after 2k / 4k / 8k / 16k tokens (2-core AMD EPYC,
2026-11-30, `python -m experiments.chunk_cost`, results/chunk_cost_pair_fast.json). A step budget counted in
tokens made a 16k prompt's last chunks ~4x dearer than its first, and the streams decoding beside them waited that
much longer each step; counted at these prices, a step's prefill work stays about level from a prompt's first chunk
to its last.
"""

from __future__ import annotations

import torch

from specdecode.models.llama import LlamaConfig
from specdecode.models.quant_int8 import Int8QuantLinear

# An attention multiply-add (fp32 or bf16 dot products over the cache) against a linear's, per arithmetic. Int8
# linears (the fast arithmetic: four multiply-adds an instruction) make attention's relatively dear: at 3.2 the
# pair's prices are 1.43 / 1.86 / 2.72 / 4.44 at 2k / 4k / 8k / 16k where it measured 1.37 / 1.85 / 2.56 / 4.22.
# fp32 linears (exact) cost about what attention does: SmolLM2 exact priced 1.67 / 2.95 at 2k / 6k, measured 1.60 /
# 2.40 (results/chunk_cost_smollm2_exact.json); a price on the high side only shortens chunks.
ATTENTION_PRICE = {"int8": 3.2, "fp32": 1.0}


def context_unit(cfg: LlamaConfig, int8_linears: bool) -> float:
    """The cached context at which a token's attention costs what its linears cost: the linears' multiply-adds a
    token over attention's a cached token (QK and PV over every query head), at ATTENTION_PRICE."""
    q_dim, kv_dim = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    linear = cfg.hidden_size * (2 * q_dim + 2 * kv_dim + 3 * cfg.intermediate_size)  # a layer's, a token
    attention = 2 * q_dim  # a layer's, a token, per cached token
    return linear / (attention * ATTENTION_PRICE["int8" if int8_linears else "fp32"])


def has_int8_linears(model: torch.nn.Module) -> bool:
    return any(isinstance(m, Int8QuantLinear) for m in model.modules())


def token_price(context: int, unit: float) -> float:
    """A prompt token's prefill cost after `context` cached tokens, in tokens at a prompt's start."""
    return 1.0 + context / unit
