"""The ordered attention op (models/ordered_attention.py), the CPU's attention where the AVX-512 few-queries kernel
does not serve: it equals attention written out on every way of batching rows, and a query's result is bitwise
the same in a verify of several tokens as decoded alone, where SDPA's is not (the negative control); a tree
node's equals the same query over its visible keys laid out contiguously.
"""

from __future__ import annotations

from unittest import mock

import pytest
import torch

from specdecode.models import attention, few_rows, ordered_attention
from specdecode.models.llama import AttentionMetadata
from tests.models.test_attention import CASES, DIM, HEADS, KV_HEADS, LAYERS, MAX_LEN, SLOTS, run_case
from tests.models.test_few_queries_attention import kernel_off


@pytest.fixture(autouse=True)
def ordered(monkeypatch):
    """The ordered op in place of the few-queries kernel, on any CPU; a build error fails the test."""
    ordered_attention.library()
    kernel_off(monkeypatch)
    yield
    if hasattr(torch.ops.specdecode, "set_attend_kernel"):
        few_rows.set_attention_kernel(few_rows.supported())


def no_sdpa(*args, **kwargs):
    raise AssertionError("SDPA ran where the ordered op should")


@pytest.mark.parametrize("case", CASES)
def test_op_equals_attention_written_out(case):
    with mock.patch.object(attention, "_sdpa", no_sdpa), mock.patch.object(attention, "_sdpa_grouped", no_sdpa):
        out, ref, caches, ref_caches, real = run_case(*CASES[case])
    assert (out - ref)[real].abs().max() < 1e-5
    for cache, ref_cache in zip(caches, ref_caches, strict=True):
        assert torch.equal(cache[:, :, :, :MAX_LEN], ref_cache[:, :, :, :MAX_LEN])


def test_control_rows_reading_their_neighbours_slots_are_caught():
    """Negative control: the op handed each row its neighbour's slot fails the same check by far."""
    real_op = ordered_attention.ordered_attend

    def shifted(q, cache_k, cache_v, layer, slots, write_pos, mask):
        return real_op(q, cache_k, cache_v, layer, slots.roll(1), write_pos, mask)

    with mock.patch.object(ordered_attention, "ordered_attend", shifted):
        out, ref, _, _, real = run_case(*CASES["contiguous"])
    assert (out - ref)[real].abs().max() > 0.1


def _inputs(gen: torch.Generator, start: int, new: int):
    """One row on slot 2 with `start` cached keys and `new` new tokens: q, k, v, caches, metadata, mask."""
    cache_k = torch.randn(LAYERS, SLOTS, KV_HEADS, MAX_LEN + 1, DIM, generator=gen)
    cache_v = torch.randn(LAYERS, SLOTS, KV_HEADS, MAX_LEN + 1, DIM, generator=gen)
    q = torch.randn(1, new, HEADS, DIM, generator=gen)
    k, v = torch.randn(1, new, KV_HEADS, DIM, generator=gen), torch.randn(1, new, KV_HEADS, DIM, generator=gen)
    meta = AttentionMetadata.build([2], [start], new, "cpu", max_len=MAX_LEN)
    return q, k, v, cache_k, cache_v, meta, meta.additive_mask(new, torch.float32)


def verify_and_alone() -> tuple[torch.Tensor, torch.Tensor]:
    """The last of 5 new tokens' output in one call, and the same query alone after the 4 before it were cached."""
    q, k, v, cache_k, cache_v, meta, mask = _inputs(torch.Generator().manual_seed(3), 7, 5)
    verify = attention.attend(q, k, v, cache_k.clone(), cache_v.clone(), 1, meta.slots, meta.write_pos, mask)
    attention.attend(
        q[:, :4], k[:, :4], v[:, :4], cache_k, cache_v, 1, meta.slots, meta.write_pos[:, :4], mask[:, :, :4]
    )
    last = AttentionMetadata.build([2], [11], 1, "cpu", max_len=MAX_LEN)
    alone = attention.attend(
        q[:, 4:],
        k[:, 4:],
        v[:, 4:],
        cache_k,
        cache_v,
        1,
        last.slots,
        last.write_pos,
        last.additive_mask(1, torch.float32),
    )
    return verify[:, 4], alone[:, 0]


def test_a_query_in_a_verify_equals_it_alone_bit_for_bit():
    verify, alone = verify_and_alone()
    assert torch.equal(verify, alone)


def test_control_sdpa_is_caught_depending_on_the_tokens_beside_it(monkeypatch):
    """Negative control: SDPA, the path the op replaces, fails the same bitwise check."""
    monkeypatch.setattr(ordered_attention, "usable", lambda: False)
    verify, alone = verify_and_alone()
    assert not torch.equal(verify, alone)


def test_a_masked_key_is_skipped_not_summed():
    """A query whose mask hides keys 2 and 5 equals the same query over the other keys laid out contiguously (a
    tree node against the plain step that decodes its branch), bit for bit."""
    gen = torch.Generator().manual_seed(4)
    cache = torch.randn(1, 1, KV_HEADS, 9, DIM, generator=gen), torch.randn(1, 1, KV_HEADS, 9, DIM, generator=gen)
    q = torch.randn(1, 1, HEADS, DIM, generator=gen)
    slots, pos = torch.tensor([0]), torch.tensor([[7]])
    mask = torch.zeros(1, 1, 1, 8)
    mask[..., [2, 5]] = float("-inf")
    gapped = ordered_attention.ordered_attend(q, *cache, 0, slots, pos, mask)
    keep = [0, 1, 3, 4, 6, 7]
    packed = tuple(torch.zeros_like(c) for c in cache)
    for c, p in zip(cache, packed, strict=True):
        p[..., : len(keep), :] = c[..., keep, :]
    contiguous = ordered_attention.ordered_attend(
        q, *packed, 0, slots, torch.tensor([[len(keep) - 1]]), torch.zeros(1, 1, 1, len(keep))
    )
    assert torch.equal(gapped, contiguous)
