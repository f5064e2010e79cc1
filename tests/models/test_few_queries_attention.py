"""The few-queries attention op (kernels/attention_op.cpp, kernels/few_queries_attention.cpp): it writes the new
K/V where the metadata says and computes what attention written out by hand computes (and what the SDPA path
computes on tree masks over many key chunks), a query's result does not depend on T or the rows beside it,
and the attention op sends it only the calls it serves."""

from __future__ import annotations

import itertools

import pytest
import torch

from specdecode.models import attention, few_rows, ordered_attention
from specdecode.models.llama import AttentionMetadata
from tests.models import test_attention as written_out


@pytest.fixture
def kernel() -> None:
    """Skip only without AVX-512 or a C++ compiler; where the kernel should build, a build error (a C++ error
    in kernels/*.cpp) fails the test rather than skipping it, as `available` would fall back."""
    if not few_rows.supported():
        pytest.skip("no AVX-512 or no C++ compiler here")
    few_rows.require()


needs_kernel = pytest.mark.usefixtures("kernel")

LAYERS, SLOTS, KV_HEADS, HEADS, DIM, MAX_LEN = 2, 6, 3, 9, 64, 400  # SmolLM2's heads


@pytest.fixture
def sdpa_path(kernel, monkeypatch):
    """Attention as it is without the kernel: the Python cache writes and SDPA. It turns the kernel off, so it needs
    the kernel fixture first (a CPU without AVX-512 skips rather than errors)."""
    use_sdpa(monkeypatch)
    yield
    few_rows.set_attention_kernel(True)


def kernel_off(monkeypatch) -> None:
    """Send the attention op's calls past the few-queries kernel, in its C++ op (where the library is loaded) and in
    Python alike (the caller turns the kernel back on)."""
    monkeypatch.setattr(few_rows, "attention_usable", lambda: False)
    if hasattr(torch.ops.specdecode, "set_attend_kernel"):
        few_rows.set_attention_kernel(False)


def use_sdpa(monkeypatch) -> None:
    """Send the attention op's calls to the Python cache writes and SDPA: past the kernel, and past the ordered op
    that serves without it (the caller turns the kernel back on)."""
    kernel_off(monkeypatch)
    monkeypatch.setattr(ordered_attention, "usable", lambda: False)


def _inputs(gen, slots, starts, num_new, tree: bool):
    b, t = len(slots), max(num_new)
    cache_k = torch.randn(LAYERS, SLOTS, KV_HEADS, MAX_LEN + 1, DIM, generator=gen)
    cache_v = torch.randn(LAYERS, SLOTS, KV_HEADS, MAX_LEN + 1, DIM, generator=gen)
    q = torch.randn(b, t, HEADS, DIM, generator=gen)
    k, v = torch.randn(b, t, KV_HEADS, DIM, generator=gen), torch.randn(b, t, KV_HEADS, DIM, generator=gen)
    tree_mask = None
    if tree:  # each new token sees itself and a random set of the earlier new ones
        tree_mask = (torch.rand(b, t, t, generator=gen) < 0.5).tril(-1) | torch.eye(t, dtype=torch.bool)
    meta = AttentionMetadata.build(slots, starts, t, "cpu", tree_mask=tree_mask, num_new=num_new, max_len=MAX_LEN)
    return q, k, v, cache_k, cache_v, meta, meta.additive_mask(t, torch.float32)


def _attend(q, k, v, cache_k, cache_v, meta, mask) -> torch.Tensor:
    return attention.attend(q, k, v, cache_k, cache_v, 1, meta.slots, meta.write_pos, mask)


# Rows in scattered slots, ragged (padding writes to the scratch column), attended lengths across 64-key chunks.
CASES = {
    "one_token": ([4], [299], [1]),
    "verify": ([2], [290], [9]),
    "ragged_batch": ([5, 0, 3], [63, 0, 200], [9, 3, 17]),
    "chunk_edges": ([1, 2, 3, 4], [55, 56, 127, 128], [9, 9, 1, 1]),
}


def _max_error_against_written_out(case: str, slot_shift: int = 0) -> float:
    """|op - attention written out by hand| over real tokens, and the caches must match; `slot_shift` hands the
    op each row's neighbour's slot (the fault a negative control injects)."""
    slots, starts, num_new = CASES[case]
    gen = torch.Generator().manual_seed(0)
    q, k, v, cache_k, cache_v, meta, mask = _inputs(gen, slots, starts, num_new, tree=False)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(written_out, "HEADS", HEADS)
        patch.setattr(written_out, "KV_HEADS", KV_HEADS)
        patch.setattr(written_out, "DIM", DIM)
        out_ref, ref_k, ref_v = written_out.reference(q, k, v, cache_k, cache_v, 1, slots, starts, num_new)
    meta.slots = meta.slots.roll(slot_shift)
    out = _attend(q, k, v, cache_k, cache_v, meta, mask)
    if slot_shift == 0:
        assert torch.equal(cache_k[..., :MAX_LEN, :], ref_k[..., :MAX_LEN, :])  # the scratch column aside
        assert torch.equal(cache_v[..., :MAX_LEN, :], ref_v[..., :MAX_LEN, :])
    real = meta.write_pos >= 0  # [num_seqs, T]
    return (out - out_ref.float())[real].abs().max().item()


@needs_kernel
@pytest.mark.parametrize("case", CASES)
def test_op_equals_attention_written_out(case):
    assert _max_error_against_written_out(case) < 1e-5


@needs_kernel
def test_control_rows_reading_their_neighbours_slots_are_caught():
    """Negative control: the same check with each row handed its neighbour's slot."""
    assert _max_error_against_written_out("ragged_batch", slot_shift=1) > 0.1


def _tree_outputs(gen) -> tuple[torch.Tensor, tuple]:
    q, k, v, cache_k, cache_v, meta, mask = _inputs(gen, [5, 0, 3], [63, 0, 300], [9, 5, 17], tree=True)
    return _attend(q, k, v, cache_k, cache_v, meta, mask), (meta.write_pos >= 0, cache_k, cache_v)


@needs_kernel
def test_tree_masks_give_what_the_sdpa_path_gives(monkeypatch):
    out, (real, cache_k, cache_v) = _tree_outputs(torch.Generator().manual_seed(1))
    try:
        use_sdpa(monkeypatch)
        want, (_, want_k, want_v) = _tree_outputs(torch.Generator().manual_seed(1))
    finally:
        few_rows.set_attention_kernel(True)
    assert (out - want)[real].abs().max() < 1e-5
    assert torch.equal(cache_k[..., :MAX_LEN, :], want_k[..., :MAX_LEN, :])
    assert torch.equal(cache_v[..., :MAX_LEN, :], want_v[..., :MAX_LEN, :])


def _query_in_a_verify_and_alone() -> tuple[torch.Tensor, torch.Tensor]:
    """New token 4 of a 9-token verify at context 290, and the same token as a one-token step after 4."""
    gen = torch.Generator().manual_seed(2)
    q, k, v, cache_k, cache_v, meta, mask = _inputs(gen, [2], [290], [9], tree=False)
    verify = _attend(q, k, v, cache_k, cache_v, meta, mask)[:, 4]
    one = AttentionMetadata.build([2], [294], 1, "cpu", max_len=MAX_LEN)
    alone = _attend(q[:, 4:5], k[:, 4:5], v[:, 4:5], cache_k, cache_v, one, one.additive_mask(1, torch.float32))
    return verify, alone[:, 0]


@needs_kernel
def test_a_query_does_not_depend_on_the_tokens_beside_it():
    verify, alone = _query_in_a_verify_and_alone()
    assert torch.equal(verify, alone)


@needs_kernel
def test_control_the_sdpa_path_is_caught_depending_on_them(sdpa_path):
    """Negative control: the path the op replaces fails the same bitwise check on the same query."""
    verify, alone = _query_in_a_verify_and_alone()
    assert not torch.equal(verify, alone)


@needs_kernel
def test_an_unsupported_head_size_is_refused():
    q, kv = torch.randn(1, 1, 2, 48), torch.randn(1, 1, 2, 48)
    cache = torch.zeros(1, 1, 2, 11, 48)
    with pytest.raises(RuntimeError, match="head size 48"):
        torch.ops.specdecode.few_queries_attend.default(
            q,
            kv,
            kv,
            cache,
            cache.clone(),
            0,
            torch.zeros(1, dtype=torch.long),
            torch.zeros(1, 1, dtype=torch.long),
            torch.zeros(1, 1, 1, 1),
        )


@needs_kernel
@pytest.mark.parametrize("bad", ["slot", "layer", "write_pos"])
def test_an_index_outside_the_cache_is_refused_before_anything_is_written(bad):
    """A slot, layer or write position outside the cache raises, and the cache is untouched (a bad slot used to be
    checked only after the new K/V were written through it, out of bounds)."""
    q, kv = torch.randn(2, 1, 2, 64), torch.randn(2, 1, 2, 64)
    whole_k, whole_v = torch.zeros(2, 3, 2, 11, 64), torch.zeros(2, 3, 2, 11, 64)  # a write past the views lands here
    cache_k, cache_v = whole_k[:1, :2], whole_v[:1, :2]  # [1 layer, 2 slots, 2, 11, 64]
    slots, layer, write_pos = torch.tensor([0, 1]), 0, torch.tensor([[3], [4]])
    if bad == "slot":
        slots = torch.tensor([0, 2])
    elif bad == "layer":
        layer = 1
    else:
        write_pos = torch.tensor([[3], [11]])
    with pytest.raises(RuntimeError, match="outside the cache"):
        torch.ops.specdecode.few_queries_attend.default(
            q, kv, kv, cache_k, cache_v, layer, slots, write_pos, torch.zeros(2, 1, 1, 11)
        )
    if bad != "write_pos":  # a bad write position is caught as it is met: earlier rows' writes stand
        assert not whole_k.any() and not whole_v.any()


@needs_kernel
def test_the_op_sends_the_kernel_decode_and_verify_steps_only():
    cache, mask = torch.zeros(1, 1, 3, 301, 64), torch.zeros(1, 1, 9, 300)
    q, kv = torch.randn(1, 9, 9, 64), torch.randn(1, 9, 3, 64)
    assert attention._kernel_serves(q, kv, kv, cache, mask)
    prefill, kv_prefill = torch.randn(1, 33, 9, 64), torch.randn(1, 33, 3, 64)
    assert not attention._kernel_serves(prefill, kv_prefill, kv_prefill, cache, torch.zeros(1, 1, 33, 300))
    assert not attention._kernel_serves(q.requires_grad_(), kv, kv, cache, mask)  # training keeps SDPA's autograd
    half = [t.detach().bfloat16() for t in (q, kv, kv, cache, mask)]
    assert not attention._kernel_serves(*half)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # a teacher under the student's autocast (train/test_bf16.py)
        assert not attention._kernel_serves(q.detach(), kv, kv, cache, mask)


def _python_calls(monkeypatch, tokens: int, dtype: torch.dtype = torch.float32) -> int:
    """How many times one attention call of `tokens` new tokens (its tensors in `dtype`) entered the op's Python
    path."""
    calls = []
    real = attention._kernel_serves
    monkeypatch.setattr(attention, "_kernel_serves", lambda *a: calls.append(1) or real(*a))
    q, k, v, cache_k, cache_v, meta, mask = _inputs(torch.Generator().manual_seed(3), [1], [100], [tokens], tree=False)
    q, k, v, cache_k, cache_v, mask = (t.to(dtype) for t in (q, k, v, cache_k, cache_v, mask))
    _attend(q, k, v, cache_k, cache_v, meta, mask)
    return len(calls)


@needs_kernel
def test_a_decode_step_never_enters_python(monkeypatch):
    """The CPU's attention op takes a decode or verify step in C++ (a compiled step's layers then never cross into
    Python) and sends a prefill chunk past the kernel's queries to the Python path."""
    assert _python_calls(monkeypatch, 1) == 0
    assert _python_calls(monkeypatch, 9) == 0
    assert _python_calls(monkeypatch, attention.KERNEL_MAX_QUERIES + 1) == 1


@needs_kernel
@pytest.mark.parametrize("case", ["bf16", "autocast"])
def test_the_c_plus_plus_kernel_refuses_what_kernel_serves_refuses(monkeypatch, case):
    """The op's C++ kernel asks again what `_kernel_serves` asks (test above): a decode step in bf16, or under
    the CPU's autocast, goes to the Python path as it did there (a decode step in fp32 does not: the test above)."""
    if case == "bf16":
        assert _python_calls(monkeypatch, 1, torch.bfloat16) == 1
    else:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert _python_calls(monkeypatch, 1) == 1


@needs_kernel
def test_control_the_kernel_turned_off_is_caught_entering_python(monkeypatch):
    """Negative control: the same count with the C++ kernel's switch off."""
    try:
        few_rows.set_attention_kernel(False)
        assert _python_calls(monkeypatch, 1) == 1
    finally:
        few_rows.set_attention_kernel(True)


def _padded_batch() -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """Rows of 9, 2 and 5 new tokens padded to 9 (a verify whose rows drafted unlike numbers): the batch's output,
    which of its queries are real, and each row's output from a call of its own at its own width."""
    gen = torch.Generator().manual_seed(3)
    q, k, v, cache_k, cache_v, meta, mask = _inputs(gen, [1, 4, 2], [40, 290, 7], [9, 2, 5], tree=False)
    out = _attend(q, k, v, cache_k, cache_v, meta, mask)  # [3, 9, heads * dim]
    alone = []
    for b, (slot, start, n) in enumerate(zip([1, 4, 2], [40, 290, 7], [9, 2, 5], strict=True)):
        one = AttentionMetadata.build([slot], [start], n, "cpu", max_len=MAX_LEN)
        rows = (q[b : b + 1, :n], k[b : b + 1, :n], v[b : b + 1, :n])
        alone.append(_attend(*rows, cache_k, cache_v, one, one.additive_mask(n, torch.float32))[0])  # [n, heads * dim]
    return out, meta.write_pos >= 0, alone


@needs_kernel
def test_padded_queries_are_not_computed_and_real_ones_are_as_alone():
    """A batch padded to its widest row: each row's real queries give bit for bit what the row gives alone, and
    the padding's queries are skipped (their output zeros), so a probe of one row at batch 8 does not make every
    row attend twice. Control: the SDPA path computes the padding's queries."""
    out, real, alone = _padded_batch()
    for b, row in enumerate(alone):
        assert torch.equal(out[b, : len(row)], row)
    assert not out[~real].any()


def test_control_the_sdpa_path_computes_the_padding(sdpa_path):
    out, real, _ = _padded_batch()
    assert out[~real].abs().min() > 0


def _prefill_alone_and_beside() -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
    """A prompt chunk of 75 new tokens (past the kernel's 32 a call) after 20 cached ones, beside a row of 40 after
    120, prefilled in one call; the same two rows each in calls of their own, cut at other places (30 + 45, 17 +
    23); and the first row's token 60 as a one-token step. Returns (the batch's rows, their own calls' rows, the
    step's query) over real tokens."""
    gen = torch.Generator().manual_seed(4)
    slots, starts, num_new = [1, 4], [20, 120], [75, 40]
    q, k, v, cache_k, cache_v, meta, mask = _inputs(gen, slots, starts, num_new, tree=False)
    batch = _attend(q, k, v, cache_k, cache_v, meta, mask)  # [2, 75, heads * dim]
    alone = []
    for b, cuts in enumerate([(0, 30, 75), (0, 17, 40)]):
        pieces = []
        for s, e in itertools.pairwise(cuts):
            one = AttentionMetadata.build([slots[b]], [starts[b] + s], e - s, "cpu", max_len=MAX_LEN)
            rows = (q[b : b + 1, s:e], k[b : b + 1, s:e], v[b : b + 1, s:e])
            pieces.append(_attend(*rows, cache_k, cache_v, one, one.additive_mask(e - s, torch.float32))[0])
        alone.append(torch.cat(pieces))  # [num_new[b], heads * dim]
    step = AttentionMetadata.build([1], [80], 1, "cpu", max_len=MAX_LEN)
    one_token = _attend(
        q[:1, 60:61], k[:1, 60:61], v[:1, 60:61], cache_k, cache_v, step, step.additive_mask(1, torch.float32)
    )
    return [batch[b, :n] for b, n in enumerate(num_new)], alone, one_token[0, 0]


@needs_kernel
def test_a_prefill_chunk_gives_each_query_what_it_gives_in_any_chunk_beside_any_row():
    """A prompt's prefill goes through the kernel in pieces (attention._attend_in_pieces), so a query's result is
    bit for bit the same whether its prompt came in one chunk or two, alone or beside a longer row, and as a decode
    step would compute it: a request's tokens do not depend on the server's load (tests/engine/
    test_batch_invariance.py). Control: the SDPA path the pieces replace."""
    batch, alone, one_token = _prefill_alone_and_beside()
    for got, want in zip(batch, alone, strict=True):
        assert torch.equal(got, want)
    assert torch.equal(batch[0][60], one_token)


@needs_kernel
def test_control_a_prefill_chunk_through_sdpa_depends_on_its_chunk_and_neighbours(monkeypatch):
    monkeypatch.setattr(attention, "PREFILL_IN_PIECES", False)
    batch, alone, one_token = _prefill_alone_and_beside()
    assert not all(torch.equal(got, want) for got, want in zip(batch, alone, strict=True))
    assert not torch.equal(batch[0][60], one_token)


def _op_and_written_out(seed: int, slots: list[int], starts: list[int], num_new: list[int]):
    """(the op's output, attention written out by hand's, its cache of keys, the op's cache of keys, which queries
    are real [num_seqs, T]) for rows of `num_new` new tokens after `starts` cached ones on `slots`."""
    q, k, v, cache_k, cache_v, meta, mask = _inputs(torch.Generator().manual_seed(seed), slots, starts, num_new, False)
    with pytest.MonkeyPatch.context() as patch:
        for name in ("HEADS", "KV_HEADS", "DIM"):
            patch.setattr(written_out, name, globals()[name])
        want, want_k, _ = written_out.reference(q, k, v, cache_k, cache_v, 1, slots, starts, num_new)
    out = _attend(q, k, v, cache_k, cache_v, meta, mask)
    return out, want.float(), want_k, cache_k, meta.write_pos >= 0


@needs_kernel
def test_a_prefill_chunk_in_pieces_equals_attention_written_out():
    out, want, want_k, cache_k, real = _op_and_written_out(5, [1, 4, 0], [20, 120, 0], [75, 40, 66])
    assert (out - want)[real].abs().max() < 1e-5
    assert torch.equal(cache_k[..., :MAX_LEN, :], want_k[..., :MAX_LEN, :])
    assert not out[~real].any()  # the padding's queries: not computed


def _rows_on_one_slot_error() -> float:
    """|op - attention written out| over real tokens for a prompt of 80 new tokens after 10 cached ones, cut into two
    rows of 40 on the same slot (the engine's chunk rows, as a verify of a wide tree rides them), beside another row:
    the second row attends to all of the first's K/V, which the pieces of 32 would not have written yet."""
    out, want, _, _, real = _op_and_written_out(6, [2, 2, 5], [10, 50, 0], [40, 40, 36])
    return (out - want)[real].abs().max().item()


@needs_kernel
def test_rows_of_one_prompt_on_one_slot_see_each_others_keys():
    assert _rows_on_one_slot_error() < 1e-5


@needs_kernel
def test_control_pieces_without_every_rows_keys_written_first_are_caught(monkeypatch):
    monkeypatch.setattr(attention, "_write", lambda *a: None)
    assert _rows_on_one_slot_error() > 0.1
