"""The attention op (models/attention.py) against attention written out by hand, for each way it reads the
cache: contiguous slots in order, a block of slots in another order, scattered slots, one row; ragged rows
(padding writes to the scratch column). The new K/V must land where the metadata says."""

from __future__ import annotations

import math
from unittest import mock

import pytest
import torch

from specdecode.models import attention
from specdecode.models.llama import AttentionMetadata

LAYERS, SLOTS, KV_HEADS, HEADS, DIM, MAX_LEN = 2, 6, 2, 4, 8, 16


def reference(q, k, v, cache_k, cache_v, layer, slots, starts, num_new):
    """Each row alone: write its real new K/V, then softmax(q k^T / sqrt(d)) v over its own keys, causally."""
    cache_k, cache_v = cache_k.clone(), cache_v.clone()
    out = torch.zeros(q.shape[0], q.shape[1], HEADS, DIM, dtype=torch.float64)
    group = HEADS // KV_HEADS
    for i, (slot, start, n) in enumerate(zip(slots, starts, num_new, strict=True)):
        cache_k[layer, slot, :, start : start + n] = k[i, :n].transpose(0, 1)
        cache_v[layer, slot, :, start : start + n] = v[i, :n].transpose(0, 1)
        for t in range(n):  # padding queries' outputs are not compared
            for h in range(HEADS):
                keys = cache_k[layer, slot, h // group, : start + t + 1].double()  # [len, d]
                values = cache_v[layer, slot, h // group, : start + t + 1].double()
                weights = torch.softmax(keys @ q[i, t, h].double() / math.sqrt(DIM), dim=0)
                out[i, t, h] = weights @ values
    return out.reshape(q.shape[0], q.shape[1], -1), cache_k, cache_v


def run_case(slots: list[int], starts: list[int], num_new: list[int], seed: int = 0):
    """(op output, reference output, op caches, reference caches, real-token mask [num_seqs, T])."""
    gen = torch.Generator().manual_seed(seed)
    b, t = len(slots), max(num_new)
    cache_k = torch.randn(LAYERS, SLOTS, KV_HEADS, MAX_LEN + 1, DIM, generator=gen)
    cache_v = torch.randn(LAYERS, SLOTS, KV_HEADS, MAX_LEN + 1, DIM, generator=gen)
    q = torch.randn(b, t, HEADS, DIM, generator=gen)
    k, v = torch.randn(b, t, KV_HEADS, DIM, generator=gen), torch.randn(b, t, KV_HEADS, DIM, generator=gen)
    meta = AttentionMetadata.build(slots, starts, t, "cpu", num_new=num_new, max_len=MAX_LEN)
    mask = meta.additive_mask(t, torch.float32)
    ref = reference(q, k, v, cache_k, cache_v, 1, slots, starts, num_new)
    out = attention.attend(q, k, v, cache_k, cache_v, 1, meta.slots, meta.write_pos, mask)
    real = meta.write_pos >= 0  # [num_seqs, T]
    return out, ref[0].float(), (cache_k, cache_v), ref[1:], real


CASES = {
    "contiguous": ([1, 2, 3], [4, 9, 0], [3, 3, 3]),
    "block_out_of_order": ([3, 1, 2, 0], [4, 9, 0, 6], [2, 3, 1, 3]),
    "scattered": ([5, 0, 3], [2, 11, 7], [3, 1, 2]),
    "one_row": ([4], [12], [2]),
}


@pytest.mark.parametrize("case", CASES)
def test_op_equals_attention_written_out(case):
    out, ref, caches, ref_caches, real = run_case(*CASES[case])
    assert (out - ref)[real].abs().max() < 1e-5
    for cache, ref_cache in zip(caches, ref_caches, strict=True):
        assert torch.equal(cache[:, :, :, :MAX_LEN], ref_cache[:, :, :, :MAX_LEN])  # the scratch column aside


def test_control_block_out_of_order_without_reordering_is_caught():
    """Negative control: the block path attending each query row to the wrong row's keys."""
    unordered = lambda q, keys, values, mask, order: attention._sdpa(q, keys, values, mask)  # noqa: E731
    with mock.patch.object(attention, "_in_slot_order", unordered):
        out, ref, _, _, real = run_case(*CASES["block_out_of_order"])
    assert (out - ref)[real].abs().max() > 0.1
