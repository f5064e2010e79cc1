"""The attention op (models/attention.py) against attention written out by hand, for each way it reads the
cache: contiguous slots in order, a block of slots in another order, scattered slots, one row; ragged rows
(padding writes to the scratch column). The new K/V must land where the metadata says."""

from __future__ import annotations

import math
from unittest import mock

import pytest
import torch

from specdecode.models import attention, ordered_attention
from specdecode.models.llama import AttentionMetadata

LAYERS, SLOTS, KV_HEADS, HEADS, DIM, MAX_LEN = 2, 6, 2, 4, 8, 16


@pytest.fixture(autouse=True)
def sdpa_only(monkeypatch):
    """This file checks SDPA's ways of reading the cache (accelerators, and CPUs where neither the few-queries
    kernel nor the ordered op serves); tests/models/test_ordered_attention.py runs its cases on the ordered op."""
    monkeypatch.setattr(ordered_attention, "usable", lambda: False)


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


# (KEY_SLACK, CALL_KEYS): the defaults (every case is one group), rows split by attended length into views over
# slot ranges (with idle slots where a group's slots are not one block), and those groups row by row.
GROUPINGS = {"one_group": None, "grouped_views": (3, 10_000), "grouped_rows": (3, 0)}


def grouping(name: str):
    slack, call = GROUPINGS[name] or (attention.KEY_SLACK, attention.CALL_KEYS)
    return mock.patch.multiple(attention, KEY_SLACK=slack, CALL_KEYS=call)


@pytest.mark.parametrize("group", GROUPINGS)
@pytest.mark.parametrize("case", CASES)
def test_op_equals_attention_written_out(case, group):
    with grouping(group):
        out, ref, caches, ref_caches, real = run_case(*CASES[case])
    assert (out - ref)[real].abs().max() < 1e-5
    for cache, ref_cache in zip(caches, ref_caches, strict=True):
        assert torch.equal(cache[:, :, :, :MAX_LEN], ref_cache[:, :, :, :MAX_LEN])  # the scratch column aside


@pytest.mark.parametrize("group", ["grouped_views", "one_group"])
def test_control_queries_attending_another_slots_keys_are_caught(group):
    """Negative control: every multi-row call attending each query row to another row's keys."""
    real_sdpa = attention._sdpa
    misplaced = lambda q, keys, values, mask: real_sdpa(q.flip(0), keys, values, mask.flip(0)).flip(0).roll(1, 0)  # noqa: E731
    with grouping(group), mock.patch.object(attention, "_sdpa", misplaced):
        out, ref, _, _, real = run_case(*CASES["block_out_of_order"])
    assert (out - ref)[real].abs().max() > 0.1


def keys_read(starts: list[int]) -> int:
    """Cached key positions the op reads for one decode token per row (rows in slots 0..n-1): the sum over its
    attention calls of rows x attended length."""
    n, longest = len(starts), max(starts) + 1
    cache_k = torch.zeros(1, n, KV_HEADS, longest + 1, DIM)
    cache_v = torch.zeros_like(cache_k)
    meta = AttentionMetadata.build(list(range(n)), starts, 1, "cpu", max_len=longest)
    read = []
    real_sdpa = attention._sdpa

    def counting(q, keys, values, mask):
        read.append(keys.shape[0] * keys.shape[2])
        return real_sdpa(q, keys, values, mask)

    q, kv = torch.randn(n, 1, HEADS, DIM), torch.randn(n, 1, KV_HEADS, DIM)
    with mock.patch.object(attention, "_sdpa", counting):
        attention.attend(
            q, kv, kv, cache_k, cache_v, 0, meta.slots, meta.write_pos, meta.additive_mask(1, torch.float32)
        )
    return sum(read)


def test_one_long_row_does_not_make_every_row_read_its_length():
    starts = [3000] + [100] * 31  # a long prompt beside short ones (Spec-Bench RAG beside chat)
    assert keys_read(starts) <= sum(s + 1 for s in starts) + attention.KEY_SLACK * len(starts)


def test_the_key_count_sees_one_padded_call():
    """Negative control: the same count with every row in one group (the op before grouping) is ~12x."""
    with mock.patch.object(attention, "KEY_SLACK", 1 << 30):
        assert keys_read([3000] + [100] * 31) > 4 * sum(s + 1 for s in [3000] + [100] * 31)
