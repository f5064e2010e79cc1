"""The few-queries attention kernel (kernels/few_queries_attention.cpp): it computes what SDPA computes on the
cache views and masks the engine hands it, a query's result does not depend on T or the rows beside it, and
the attention op sends it only the calls it serves."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specdecode.models import attention, few_rows

needs_kernel = pytest.mark.skipif(
    not few_rows.available(torch.device("cpu"), torch.float32), reason="no AVX-512 or no C++ compiler here"
)
CACHE_LEN = 400  # positions per slot of the test cache (+1 scratch)


def _kernel(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.ops.specdecode.few_queries_attention.default(q, keys, values, mask)


def _sdpa(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)


def _case(gen: torch.Generator, rows: int, heads: int, kv_heads: int, t: int, length: int, d: int):
    """q [rows, heads, T, d] (a transposed view, as attention.py passes it), keys/values [rows, kv_heads,
    length, d] (views of a [slots, kv_heads, CACHE_LEN + 1, d] cache), an additive mask [rows, 1, T, length]:
    causal over each row's own attended length, a random tree among the new tokens, one row shorter."""
    q = torch.randn(rows, t, heads, d, generator=gen).transpose(1, 2)
    cache_k = torch.randn(rows + 1, kv_heads, CACHE_LEN + 1, d, generator=gen)
    cache_v = torch.randn(rows + 1, kv_heads, CACHE_LEN + 1, d, generator=gen)
    ends = [length] + [max(t, length - 7 * i) for i in range(1, rows)]  # each row's attended length
    visible = torch.zeros(rows, t, length, dtype=torch.bool)
    for r, end in enumerate(ends):
        start = end - t
        visible[r, :, :start] = True
        tree = torch.rand(t, t, generator=gen) < 0.5
        visible[r, :, start:end] = torch.tril(tree, -1) | torch.eye(t, dtype=torch.bool)
    mask = torch.zeros(rows, 1, t, length).masked_fill_(~visible[:, None], float("-inf"))
    return q, cache_k[1:, :, :length], cache_v[1:, :, :length], mask


SHAPES = [  # rows, heads, kv_heads, T, attended length, head dim
    (1, 9, 3, 1, 1, 64),
    (1, 9, 3, 1, 257, 64),
    (1, 9, 3, 9, 300, 64),
    (2, 9, 3, 17, 129, 64),
    (3, 4, 2, 5, 64, 16),
    (2, 8, 8, 3, 65, 32),
    (2, 8, 2, 9, 200, 128),
    (1, 9, 3, 32, 63, 64),
]


def _max_error(transform=lambda keys: keys) -> float:
    """Worst |kernel - SDPA| over SHAPES, the kernel reading `transform(keys)`."""
    gen = torch.Generator().manual_seed(0)
    worst = 0.0
    for shape in SHAPES:
        q, keys, values, mask = _case(gen, *shape)
        want = _sdpa(q, keys, values, mask)
        worst = max(worst, (_kernel(q, transform(keys), values, mask) - want).abs().max().item())
    return worst


@needs_kernel
def test_kernel_equals_sdpa_on_cache_views_and_tree_masks():
    assert _max_error() < 1e-5  # fp32 rounding; outputs are O(1)


@needs_kernel
def test_control_keys_one_position_off_are_caught():
    """Negative control: the kernel reading each row's keys shifted by one position fails the same check."""
    assert _max_error(lambda keys: torch.roll(keys, 1, dims=2)) > 0.1


def _row_alone_and_in_a_verify(attend) -> tuple[torch.Tensor, torch.Tensor]:
    """Query 4 of a 9-token causal verify at context 300, and the same query as a one-token step."""
    gen = torch.Generator().manual_seed(1)
    q, keys, values, _ = _case(gen, 1, 9, 3, 9, 300, 64)
    mask = torch.zeros(1, 1, 9, 300)
    mask[..., 291:] = torch.triu(torch.full((9, 9), float("-inf")), 1)
    verify = attend(q, keys, values, mask)[:, :, 4:5]
    alone = attend(q[:, :, 4:5], keys[:, :, :296], values[:, :, :296], torch.zeros(1, 1, 1, 296))
    return verify, alone


@needs_kernel
def test_a_query_does_not_depend_on_the_tokens_beside_it():
    verify, alone = _row_alone_and_in_a_verify(_kernel)
    assert torch.equal(verify, alone)


@needs_kernel
def test_control_sdpa_is_caught_depending_on_them():
    """Negative control: SDPA, which the kernel replaces, fails the same bitwise check on the same query."""
    verify, alone = _row_alone_and_in_a_verify(_sdpa)
    assert not torch.equal(verify, alone)


@needs_kernel
def test_a_row_that_sees_no_key_gets_zeros():
    q, keys, values = torch.randn(1, 9, 2, 64), torch.randn(1, 3, 70, 64), torch.randn(1, 3, 70, 64)
    mask = torch.zeros(1, 1, 2, 70)
    mask[0, 0, 1] = float("-inf")
    out = _kernel(q, keys, values, mask)
    assert torch.equal(out[:, :, 1], torch.zeros(1, 9, 64))
    assert torch.allclose(out[:, :, 0], _sdpa(q[:, :, :1], keys, values, mask[:, :, :1])[:, :, 0], atol=1e-5)


@needs_kernel
def test_an_unsupported_head_size_is_refused():
    q, keys = torch.randn(1, 2, 1, 48), torch.randn(1, 2, 10, 48)
    with pytest.raises(RuntimeError, match="head size 48"):
        _kernel(q, keys, keys, torch.zeros(1, 1, 1, 10))


@needs_kernel
def test_the_op_sends_the_kernel_decode_and_verify_steps_only():
    q, keys, mask = torch.randn(1, 9, 9, 64), torch.randn(1, 3, 300, 64), torch.zeros(1, 1, 9, 300)
    assert attention._kernel_serves(q, keys, keys, mask)
    prefill = torch.randn(1, 9, attention.KERNEL_MAX_QUERIES + 1, 64)
    assert not attention._kernel_serves(prefill, keys, keys, torch.zeros(1, 1, prefill.shape[2], 300))
    assert not attention._kernel_serves(q.requires_grad_(), keys, keys, mask)  # training keeps SDPA's autograd
    assert not attention._kernel_serves(q.detach().bfloat16(), keys.bfloat16(), keys.bfloat16(), mask.bfloat16())
    with torch.autocast("cpu", dtype=torch.bfloat16):  # a teacher under the student's autocast (train/test_bf16.py)
        assert not attention._kernel_serves(q.detach(), keys, keys, mask)
