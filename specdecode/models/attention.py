"""One layer's attention over the KV cache: write the new K/V, attend to each row's cached keys.

It is a torch custom op (`specdecode::attend`), so a compiled step (models/compiled.py) treats it as one opaque
call: the graph around it depends only on the batch's [num_seqs, T], never on how long the contexts are, and
steady decoding never recompiles as the contexts grow. The eager model calls the same op at inference.

The additive mask (built once per forward, not per layer) covers the longest row; on the CPU the rows are
grouped by their own attended length first, since attention reads every key up to the mask's length for every
row: one long prompt among 31 short ones made the layer read 16x the keys it needed. Each group reads one view
of the cache, over the slots from its lowest to its highest (rows by slot; a finished request's slot goes to
the next one, so a batch's slots are usually one block in some order), or row by row when its slots are
scattered, so the caches are never gathered into a copy. On an accelerator the rows are gathered instead:
reading the slots on the host would be a sync per layer.

A decode or verify step on an AVX-512 CPU (fp32, up to KERNEL_MAX_QUERIES new tokens a row, outside autograd
and autocast) skips all of that: one C++ op (kernels/attention_op.cpp) writes the new K/V and attends each row
over its own slot up to its own last token with the few-queries kernel (kernels/few_queries_attention.cpp:
the query heads that share a key head read each key once, and a query's result does not depend on T or on
the rows beside it). Python's share of a layer was ~100 us of ~135 (cache writes by advanced indexing, the
rows' lengths read to the host, grouping) at one token. A prompt's chunk of more new tokens takes the same kernel
a piece of KERNEL_MAX_QUERIES tokens at a time (`_attend_in_pieces`), so a request's tokens never depend on how its
prompt was chunked or what was batched beside it; SDPA is left to accelerators, training and head sizes the
kernel lacks.

Where the kernel does not serve on the CPU (no AVX-512), fp32 inference attention is `specdecode::ordered_attend`
(models/ordered_attention.py): portable C++ computing each query over its visible keys in key order, so there too a
query's result never depends on T, padding or the rows beside it, and speculation stays exact; SDPA serves only where
that op cannot (no compiler, autograd, a bf16 cache, a head size not a multiple of 8).

Under the fast arithmetic the cache is bf16 (models/kv_dtype.py): the op writes each new key rounded to bf16 and
the kernel's bf16 twin (kernels/few_queries_attention_bf16.cpp) attends, with the same guarantees; SDPA, where it
runs, reads the bf16 keys widened to fp32.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from specdecode.models import few_rows, ordered_attention
from specdecode.models.ragged import pad_groups

# In cached key positions read (one SDPA call's fixed cost is ~40 us on a small CPU, a position of a 3-head
# 64-dim layer ~80 ns): a call of its own pays once its rows would read this many padded keys.
CALL_KEYS = 512
KEY_SLACK = CALL_KEYS  # rows whose attended lengths differ by more go to separate calls
KERNEL_MAX_QUERIES = 32  # new tokens per row the few-queries kernel takes in one call (a prefill chunk: in pieces)
KERNEL_HEAD_DIMS = (16, 32, 64, 128)
BF16_HEAD_DIMS = (32, 64, 128)  # over a bf16 cache (kernels/few_queries_attention_bf16.cpp)
# A prefill chunk goes through the kernel too, in pieces (`_attend_in_pieces`); False sends it to SDPA, as before
# (the batch-invariance tests' control turns it off).
PREFILL_IN_PIECES = True


def attend_eager(
    q: torch.Tensor,  # [num_seqs, T, heads, head_dim] rotated queries
    k: torch.Tensor,  # [num_seqs, T, kv_heads, head_dim] rotated new keys
    v: torch.Tensor,  # [num_seqs, T, kv_heads, head_dim] new values
    cache_k: torch.Tensor,  # [layers, slots, kv_heads, len + 1, head_dim] the whole cache (last column: scratch)
    cache_v: torch.Tensor,  # [layers, slots, kv_heads, len + 1, head_dim]
    layer: int,
    slots: torch.Tensor,  # [num_seqs] int64
    write_pos: torch.Tensor,  # [num_seqs, T] int64 cache index of each new token, -1 (scratch) for padding
    mask: torch.Tensor,  # [num_seqs, 1, T, kv_len] additive (0 or -inf): which cached keys each query sees
) -> torch.Tensor:
    """The attention output [num_seqs, T, heads * head_dim]; the new K/V are written into the layer's cache.

    The op mutates the whole cache, a graph input, rather than a view of it: a compiled graph then writes in
    place (a mutated view of an input came back as a copy, and the writes were lost).
    """
    serves = _kernel_serves(q[:, :KERNEL_MAX_QUERIES], k, v, cache_k, mask)  # all but the number of new tokens
    if serves and q.shape[1] <= KERNEL_MAX_QUERIES:  # the cache write and attention in one C++ op
        return torch.ops.specdecode.few_queries_attend.default(q, k, v, cache_k, cache_v, layer, slots, write_pos, mask)
    if serves and PREFILL_IN_PIECES:  # a prompt's chunk: through the same kernel
        return _attend_in_pieces(q, k, v, cache_k, cache_v, layer, slots, write_pos, mask)
    b, t = q.shape[:2]
    _write(k, v, cache_k, cache_v, layer, slots, write_pos)
    if not serves and _ordered_serves(q, k, v, cache_k, cache_v, mask):  # a CPU without the kernel
        return ordered_attention.ordered_attend(q, cache_k, cache_v, layer, slots, write_pos, mask)
    k_cache, v_cache = cache_k[layer], cache_v[layer]  # [slots, kv_heads, len + 1, head_dim] each
    kv_len = mask.shape[-1]
    queries = q.transpose(1, 2)  # [num_seqs, heads, T, head_dim]
    if q.device.type != "cpu":  # an accelerator: gather the rows' caches rather than read slots on the host
        out = _sdpa_grouped(queries, k_cache[slots, :, :kv_len], v_cache[slots, :, :kv_len], mask)
    else:
        row_slots = slots.tolist()
        ends = (write_pos.amax(1) + 1).tolist()  # each row's attended length: its last real write + 1
        groups = pad_groups(ends, KEY_SLACK)
        first = row_slots[0]
        if len(groups) == 1 and row_slots == list(range(first, first + b)):  # the common case: one view, as is
            out = _sdpa(queries, k_cache[first : first + b, :, :kv_len], v_cache[first : first + b, :, :kv_len], mask)
        else:
            out = torch.empty_like(queries)
            for group in groups:
                _attend_group(out, queries, k_cache, v_cache, mask, [row_slots[i] for i in group], group, ends)
    return out.transpose(1, 2).reshape(b, t, -1)


# The op a compiled graph sees as one opaque call. It is declared with the plain Library API, not the
# `torch.library.custom_op` decorator: the decorator's Python wrappers (argument defaults, version bumps,
# alias checks) added ~50 us to each call at one token, where the op's own work (cache writes and SDPA) took
# ~70 us, 30 calls a step. It has no autograd formula: training (heads through the target's layer type)
# calls `attend_eager`, the same function, directly (see `attend_fn`).
# On the CPU, once the few-rows library is loaded, `attend` is its C++ kernel (kernels/attention_op.cpp): the
# few-queries op where it serves, else `attend_general`, this function; a compiled step's decode and verify
# steps then never enter Python (the crossing cost ~7 us a layer, ~1.5% of the pair's fast steps, 2026-11-27).
_LIB = torch.library.Library("specdecode", "FRAGMENT")  # held for the process: registrations die with it
_SCHEMA = (
    "(Tensor q, Tensor k, Tensor v, Tensor(a!) cache_k, Tensor(b!) cache_v, int layer, Tensor slots, "
    "Tensor write_pos, Tensor mask) -> Tensor"
)
for _name in ("attend", "attend_general"):
    _LIB.define(_name + _SCHEMA)
    _LIB.impl(_name, attend_eager, "CompositeExplicitAutograd")
attend = torch.ops.specdecode.attend.default


def _attend_in_pieces(q, k, v, cache_k, cache_v, layer, slots, write_pos, mask) -> torch.Tensor:
    """`attend_eager` for a chunk of more than KERNEL_MAX_QUERIES new tokens a row (a prompt's prefill; a verify of a
    wide tree), through the few-queries kernel a piece of that many tokens at a time, in order: each piece attends up
    to its own tokens. A query's result then never depends on the chunk it came in, nor on the rows beside it, as in
    a decode or verify step: a request's tokens are the same alone, in any batch and under any token budget. Through
    SDPA a chunk's keys are padded to its longest row and its last token, and the reduction over them changed with
    that padding (the 1.5B under fast: a dev code prompt's greedy answer parted at its 33rd token when a prompt 6
    tokens longer was prefilled beside it). Every row's new K/V are written first, as one call writes them: rows
    of a prompt cut on one slot (the engine's chunk rows) attend to the rows before them whole (each piece writes
    its own again, the same values). Shapes as attend_eager's; returns [num_seqs, T, heads * head_dim]."""
    _write(k, v, cache_k, cache_v, layer, slots, write_pos)
    op = torch.ops.specdecode.few_queries_attend.default
    pieces = []
    for s in range(0, q.shape[1], KERNEL_MAX_QUERIES):
        e = s + KERNEL_MAX_QUERIES
        piece = (q[:, s:e], k[:, s:e], v[:, s:e])
        pieces.append(op(*piece, cache_k, cache_v, layer, slots, write_pos[:, s:e], mask[:, :, s:e]))
    return torch.cat(pieces, dim=1)


def _write(k, v, cache_k, cache_v, layer: int, slots: torch.Tensor, write_pos: torch.Tensor) -> None:
    """The new K/V [num_seqs, T, kv_heads, head_dim] into the layer's cache at each token's position (padding: the
    scratch column), converted to the cache's dtype (bf16: rounded to nearest even, as the kernel writes it)."""
    k_cache, v_cache = cache_k[layer], cache_v[layer]  # [slots, kv_heads, len + 1, head_dim] each
    # Advanced indices split by a slice put [num_seqs, T] first: the target is [num_seqs, T, kv_heads, dim].
    k_cache[slots[:, None], :, write_pos] = k.to(k_cache.dtype)
    v_cache[slots[:, None], :, write_pos] = v.to(v_cache.dtype)


def attend_fn() -> Callable[..., torch.Tensor]:
    """The op under inference, the plain function when gradients may flow (autograd runs through it)."""
    return attend_eager if torch.is_grad_enabled() else attend


def _attend_group(
    out: torch.Tensor,  # [num_seqs, heads, T, d] written at the group's rows
    queries: torch.Tensor,  # [num_seqs, heads, T, d]
    k_cache: torch.Tensor,  # [slots, kv_heads, len + 1, d] one layer's
    v_cache: torch.Tensor,
    mask: torch.Tensor,  # [num_seqs, 1, T, kv_len]
    slots: list[int],  # the group's slots
    rows: list[int],  # the group's batch rows
    ends: list[int],  # [num_seqs] attended length of every row
) -> None:
    """Attention for rows of similar length, without copying their caches: over one view of the slots from the
    lowest to the highest of theirs (queries placed by slot; the view's other slots get idle queries whose
    output is dropped), or row by row when that view would read far more keys than the rows' own. A view holds
    one query row per slot: rows on a slot another row of the group has (a prompt's chunk cut into rows on its
    own slot, EngineConfig.fused_prefill) go row by row, else each would overwrite the other's place in the view."""
    pairs = list(zip(slots, rows, strict=True))
    first_row: dict[int, int] = {}  # slot -> its first row in the group: the one the view holds
    for s, i in pairs:
        first_row.setdefault(s, i)
    length = max(ends[i] for i in rows)
    first, span = min(slots), max(slots) - min(slots) + 1
    scattered = span * length > sum(ends[i] for i in rows) + len(rows) * CALL_KEYS
    for s, i in pairs if scattered else [(s, i) for s, i in pairs if first_row[s] != i]:  # each on its own
        n = ends[i]
        out[i : i + 1] = _sdpa(
            queries[i : i + 1], k_cache[s : s + 1, :, :n], v_cache[s : s + 1, :, :n], mask[i : i + 1, ..., :n]
        )
    if scattered:
        return
    slots, rows = list(first_row), list(first_row.values())
    at = torch.tensor(slots, device=queries.device) - first  # [g] each row's place in the view
    index = torch.tensor(rows, device=queries.device)  # [g]
    q = queries.new_zeros(span, *queries.shape[1:])  # [span, heads, T, d]
    q[at] = queries[index]
    m = mask.new_zeros(span, 1, mask.shape[2], length)  # [span, 1, T, length] idle rows attend to anything
    m[at] = mask[index, ..., :length]
    view = slice(first, first + span)
    out[index] = _sdpa(q, k_cache[view, :, :length], v_cache[view, :, :length], m)[at]


def _sdpa(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """q [n, heads, T, d], keys/values [n, kv_heads, L, d] (a bf16 cache's widened to q's dtype), mask [n, 1, T, L]
    -> [n, heads, T, d]."""
    keys, values = keys.to(q.dtype), values.to(q.dtype)
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)


def _sdpa_grouped(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`_sdpa` with the query heads that share a key head folded into the query length, so the keys and values
    are never repeated per query head (SDPA's `enable_gqa` fell back to a path that repeats them: at batch 32 on
    an H200 that copy cost more than the weights' read). q [n, heads, T, d] -> [n, heads, T, d]."""
    n, heads, t, d = q.shape
    kv_heads = keys.shape[1]
    group = heads // kv_heads  # query head i reads key head i // group
    folded = q.reshape(n, kv_heads, group * t, d)  # [n, kv_heads, group * T, d]
    m = mask[:, :, None].expand(-1, -1, group, -1, -1).reshape(n, 1, group * t, mask.shape[-1])
    out = F.scaled_dot_product_attention(folded, keys, values, attn_mask=m)  # [n, kv_heads, group * T, d]
    return out.reshape(n, heads, t, d)


def kernel_piece(device: torch.device, dtype: torch.dtype) -> int | None:
    """The most new tokens a row may feed in one forward for every layer's attention to take the few-queries kernel
    (KERNEL_MAX_QUERIES), where it serves this device and activation dtype; None where it does not (SDPA takes any
    length). A reading of more tokens is cheaper in such pieces: the 0.5B draft of the Qwen2.5-Coder pair read 256
    tokens after 8,192 cached ones at 5.5 ms a token in one forward and 3.1 in pieces of 32, and 1,024 tokens of a
    new prompt at 1.7 and 1.0 (2-core AMD EPYC, bf16 cache, 2026-11-29; `python -m experiments.draft_catch_up`,
    results/draft_catch_up.json)."""
    usable = device.type == "cpu" and dtype == torch.float32 and few_rows.attention_usable()
    return KERNEL_MAX_QUERIES if usable else None


def _kernel_serves(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: torch.Tensor, mask: torch.Tensor) -> bool:
    """Whether the few-queries op takes this call: q [n, T, heads, d] of a decode or verify step on the CPU."""
    return (
        _cpu_fp32_inference(q, k, v, mask)
        and q.shape[1] <= KERNEL_MAX_QUERIES
        and q.shape[3] in (KERNEL_HEAD_DIMS if cache.dtype == torch.float32 else BF16_HEAD_DIMS)
        and cache.dtype in (torch.float32, torch.bfloat16)
        and q.stride(3) == k.stride(3) == v.stride(3) == mask.stride(3) == 1
        and few_rows.attention_usable()
    )


def _cpu_fp32_inference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> bool:
    """fp32 queries, keys, values and mask on the CPU, outside autograd and autocast (under autocast SDPA runs in
    bf16, and so should attention): what both C++ attention ops need."""
    return (
        q.device.type == "cpu"
        and q.dtype == k.dtype == v.dtype == mask.dtype == torch.float32
        and not (q.requires_grad or k.requires_grad or v.requires_grad)
        and not torch.is_autocast_enabled("cpu")
    )


def _ordered_serves(q, k, v, cache_k, cache_v, mask) -> bool:
    """Whether models/ordered_attention.py takes this call: fp32 inference on the CPU over an fp32 cache, a head
    size it takes, and the op builds here."""
    return (
        _cpu_fp32_inference(q, k, v, mask)
        and cache_k.dtype == torch.float32
        and q.shape[3] % ordered_attention.LANES == 0
        and cache_k.is_contiguous()
        and cache_v.is_contiguous()
        and ordered_attention.usable()
    )


def _fake_attend(q, k, v, cache_k, cache_v, layer, slots, write_pos, mask):
    return q.new_empty(q.shape[0], q.shape[1], q.shape[2] * q.shape[3])


for _name in ("attend", "attend_general"):
    torch.library.register_fake(f"specdecode::{_name}", _fake_attend, lib=_LIB)
