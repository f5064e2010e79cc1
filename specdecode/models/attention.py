"""One layer's attention over the KV cache: write the new K/V, attend to each row's cached keys.

It is a torch custom op (`specdecode::attend`), so a compiled step (models/compiled.py) treats it as one opaque
call: the graph around it depends only on the batch's [num_seqs, T], never on how long the contexts are, and
steady decoding never recompiles as the contexts grow. The eager model calls the same op at inference.

The attended length comes from the additive mask's last dimension (built once per forward, not per layer).
When the rows' slots form one block, in any order (the usual case: a finished request's slot goes to the
next one), the keys are one view of the cache; otherwise each row attends to a view of its own slot, up to its
own length, so the batch's caches are never gathered into a copy. On an accelerator the rows are gathered
instead: reading the slots on the host would be a sync per layer.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F


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
    b, t = q.shape[:2]
    k_cache, v_cache = cache_k[layer], cache_v[layer]  # [slots, kv_heads, len + 1, head_dim] each
    # Advanced indices split by a slice put [num_seqs, T] first: the target is [num_seqs, T, kv_heads, dim].
    k_cache[slots[:, None], :, write_pos] = k.to(k_cache.dtype)
    v_cache[slots[:, None], :, write_pos] = v.to(v_cache.dtype)
    kv_len = mask.shape[-1]
    queries = q.transpose(1, 2)  # [num_seqs, heads, T, head_dim]
    rows = slots.tolist() if q.device.type == "cpu" else None
    if rows is None:  # an accelerator: gather the rows' caches rather than read slots on the host
        out = _sdpa(queries, k_cache[slots, :, :kv_len], v_cache[slots, :, :kv_len], mask)
    elif rows == list(range(rows[0], rows[0] + b)):  # contiguous: the batch's keys are one view
        first, end = rows[0], rows[0] + b
        out = _sdpa(queries, k_cache[first:end, :, :kv_len], v_cache[first:end, :, :kv_len], mask)
    elif sorted(rows) == list(range(min(rows), min(rows) + b)):
        # The slots of a block in another order (a finished row's slot went to a newcomer, who joined the batch
        # last): one view still serves, with the queries and masks put in slot order and the output put back.
        first = min(rows)
        keys, values = k_cache[first : first + b, :, :kv_len], v_cache[first : first + b, :, :kv_len]
        out = _in_slot_order(queries, keys, values, mask, slots.argsort())
    else:
        # Each row up to its own end: its last real write (padding writes -1), so no padded keys are read.
        ends = (write_pos.amax(1) + 1).tolist()
        per_row = [
            _sdpa(queries[i : i + 1], k_cache[s : s + 1, :, :n], v_cache[s : s + 1, :, :n], mask[i : i + 1, ..., :n])
            for i, (s, n) in enumerate(zip(rows, ends, strict=True))
        ]
        out = torch.cat(per_row)  # [num_seqs, heads, T, head_dim]
    return out.transpose(1, 2).reshape(b, t, -1)


# The op a compiled graph sees as one opaque call. It has no autograd formula: training (heads through the
# target's layer type) calls `attend_eager`, the same function, directly (see `attend_fn`).
attend = torch.library.custom_op("specdecode::attend", attend_eager, mutates_args=("cache_k", "cache_v"))


def attend_fn() -> Callable[..., torch.Tensor]:
    """The op under inference, the plain function when gradients may flow (autograd runs through it)."""
    return attend_eager if torch.is_grad_enabled() else attend


def _in_slot_order(
    q: torch.Tensor,  # [n, heads, T, d] in batch order
    keys: torch.Tensor,  # [n, kv_heads, L, d] in slot order
    values: torch.Tensor,  # [n, kv_heads, L, d] in slot order
    mask: torch.Tensor,  # [n, 1, T, L] in batch order
    order: torch.Tensor,  # [n] int64: the batch rows in slot order
) -> torch.Tensor:
    """Attention when the keys come in slot order and the queries in batch order: [n, heads, T, d], batch order."""
    out = torch.empty_like(q)
    out[order] = _sdpa(q[order], keys, values, mask[order])
    return out


def _sdpa(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """q [n, heads, T, d], keys/values [n, kv_heads, L, d], mask [n, 1, T, L] -> [n, heads, T, d]."""
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)


@attend.register_fake
def _(q, k, v, cache_k, cache_v, layer, slots, write_pos, mask):
    return q.new_empty(q.shape[0], q.shape[1], q.shape[2] * q.shape[3])
