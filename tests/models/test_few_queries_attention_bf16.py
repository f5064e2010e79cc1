"""The few-queries attention over a bf16 cache (kernels/few_queries_attention_bf16.cpp), on both of its paths
(`vdpbf16ps` where the CPU has AVX512_BF16, else bf16 values widened to fp32): it writes each new key rounded as
torch rounds it, computes fp32 attention over the rounded keys and values within bf16's rounding of the query
and the probabilities, and a query's result is bitwise the same in a verify of any width and beside any rows
(batches of 1-17), which the SDPA path reading the same bf16 cache is not."""

from __future__ import annotations

import pytest
import torch

from specdecode.models.llama import AttentionMetadata
from tests.models import test_attention as written_out
from tests.models.test_few_queries_attention import (
    CASES,
    DIM,
    HEADS,
    KV_HEADS,
    MAX_LEN,
    _attend,
    _inputs,
    kernel,  # noqa: F401 (a fixture)
    needs_kernel,
    sdpa_path,  # noqa: F401 (a fixture)
)

PATHS = ("dot", "widen")  # set_bf16_dot(True) (AVX512_BF16 where the CPU has it) and set_bf16_dot(False)


@pytest.fixture(params=PATHS)
def path(request):
    """The bf16 kernel's path under test; `vdpbf16ps` stays off where the CPU lacks it (then both are "widen")."""
    torch.ops.specdecode.set_bf16_dot(request.param == "dot")
    yield request.param
    torch.ops.specdecode.set_bf16_dot(True)


def _rounded(t: torch.Tensor) -> torch.Tensor:
    return t.bfloat16().float()


def _error_against_fp32(case: str, slot_shift: int = 0) -> float:
    """|bf16 op - attention written out in fp64 over the bf16-rounded query, keys and values| over real tokens (what
    is left is the probabilities' rounding); the new keys must land as torch rounds them. slot_shift: each row
    handed its neighbour's slot (the negative control's fault)."""
    slots, starts, num_new = CASES[case]
    q, k, v, cache_k, cache_v, meta, mask = _inputs(torch.Generator().manual_seed(0), slots, starts, num_new, False)
    with pytest.MonkeyPatch.context() as patch:
        for name, value in (("HEADS", HEADS), ("KV_HEADS", KV_HEADS), ("DIM", DIM)):
            patch.setattr(written_out, name, value)
        rounded = [_rounded(t) for t in (q, k, v, cache_k, cache_v)]
        want, want_k, want_v = written_out.reference(*rounded, 1, slots, starts, num_new)
    ck, cv = cache_k.bfloat16(), cache_v.bfloat16()
    meta.slots = meta.slots.roll(slot_shift)
    out = _attend(q, k, v, ck, cv, meta, mask)
    if slot_shift == 0:
        assert torch.equal(ck[..., :MAX_LEN, :], want_k[..., :MAX_LEN, :].bfloat16())  # the scratch column aside
        assert torch.equal(cv[..., :MAX_LEN, :], want_v[..., :MAX_LEN, :].bfloat16())
    real = meta.write_pos >= 0  # [num_seqs, T]
    return (out - want.float())[real].abs().max().item()


@needs_kernel
@pytest.mark.parametrize("case", CASES)
def test_bf16_op_is_attention_over_the_rounded_values(case, path):
    assert _error_against_fp32(case) < 1e-2  # bf16 probabilities: 2^-9 of |v| ~ 3


@needs_kernel
def test_control_rows_reading_their_neighbours_slots_are_caught(path):
    """Negative control: the same check with each row handed its neighbour's slot."""
    assert _error_against_fp32("ragged_batch", slot_shift=1) > 0.1


def _row_alone_and_in_batches(rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Row 0 (a 5-token verify after 333 tokens) alone, and in a batch of `rows` rows of 1-9 new tokens over
    0-390 cached ones (its own slot and inputs the same): its outputs [5, heads * dim] both times."""
    gen = torch.Generator().manual_seed(rows)
    num_new = [5] + torch.randint(1, 10, (rows - 1,), generator=gen).tolist()
    starts = [333] + torch.randint(0, MAX_LEN - 10, (rows - 1,), generator=gen).tolist()
    slots = list(range(rows))
    q, k, v, cache_k, cache_v, meta, mask = _inputs(gen, slots, starts, num_new, False)
    ck, cv = cache_k.bfloat16(), cache_v.bfloat16()
    one = AttentionMetadata.build([0], [333], 5, "cpu", max_len=MAX_LEN)
    alone = _attend(q[:1, :5], k[:1, :5], v[:1, :5], ck.clone(), cv.clone(), one, one.additive_mask(5, torch.float32))
    batch = _attend(q, k, v, ck, cv, meta, mask)  # [rows, T, heads * dim]
    return alone[0], batch[0, :5]


@pytest.fixture
def bf16_cache_slots(monkeypatch):
    """The cases' caches hold 6 slots; a batch of up to 17 rows needs 17."""
    import tests.models.test_few_queries_attention as base

    monkeypatch.setattr(base, "SLOTS", 17)


@needs_kernel
@pytest.mark.usefixtures("bf16_cache_slots")
@pytest.mark.parametrize("rows", [1, 2, 8, 17])
def test_a_row_is_bitwise_the_same_alone_and_in_a_batch(rows, path):
    alone, in_batch = _row_alone_and_in_batches(rows)
    assert torch.equal(alone, in_batch)


def _query_in_a_verify_and_alone() -> tuple[torch.Tensor, torch.Tensor]:
    """New token 4 of a 9-token verify after 290 cached tokens, and the same token as a one-token step after 4."""
    q, k, v, cache_k, cache_v, meta, mask = _inputs(torch.Generator().manual_seed(2), [2], [290], [9], False)
    ck, cv = cache_k.bfloat16(), cache_v.bfloat16()
    verify = _attend(q, k, v, ck, cv, meta, mask)[:, 4]
    one = AttentionMetadata.build([2], [294], 1, "cpu", max_len=MAX_LEN)
    alone = _attend(q[:, 4:5], k[:, 4:5], v[:, 4:5], ck, cv, one, one.additive_mask(1, torch.float32))
    return verify, alone[:, 0]


@needs_kernel
def test_a_query_does_not_depend_on_the_tokens_beside_it(path):
    verify, alone = _query_in_a_verify_and_alone()
    assert torch.equal(verify, alone)


@needs_kernel
@pytest.mark.usefixtures("sdpa_path")
def test_control_the_sdpa_path_over_a_bf16_cache_is_caught_depending_on_them():
    """Negative control: SDPA over the same bf16 cache (widened) fails the same bitwise check."""
    verify, alone = _query_in_a_verify_and_alone()
    assert not torch.equal(verify, alone)


@needs_kernel
def test_the_dot_path_is_taken_exactly_where_the_cpu_has_avx512_bf16():
    flags = open("/proc/cpuinfo").read().split() if torch.backends.cpu.get_cpu_capability() else []
    try:
        assert torch.ops.specdecode.set_bf16_dot(True) == ("avx512_bf16" in flags)
        assert torch.ops.specdecode.set_bf16_dot(False) is False
    finally:
        torch.ops.specdecode.set_bf16_dot(True)


@needs_kernel
def test_the_paths_agree_closely():
    """The two paths round differently (one FMA per product, or `vdpbf16ps`'s pairs) but compute the same thing."""
    outs = []
    for on in (True, False):
        torch.ops.specdecode.set_bf16_dot(on)
        q, k, v, cache_k, cache_v, meta, mask = _inputs(torch.Generator().manual_seed(5), [1], [300], [3], False)
        outs.append(_attend(q, k, v, cache_k.bfloat16(), cache_v.bfloat16(), meta, mask))
    torch.ops.specdecode.set_bf16_dot(True)
    assert (outs[0] - outs[1]).abs().max() < 1e-3
