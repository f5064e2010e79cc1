"""The int8 ("fast") arithmetic of models/quant_int8.py: the kernel gives, bit for bit, an independent numpy
computation of the arithmetic its .cpp header defines (random blocks and tensors of the real files); its VNNI, BW
and portable paths agree bitwise; a row's output does not depend on the rows beside it; and it stays close to the
exact product. Negative controls: a misread sub-block scale fails the reference check, activation scales shared
across the rows of a call fail the batch-invariance check.

A build error fails these tests; they skip only without a C++ compiler, a path this CPU lacks, or a missing file.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from specdecode.config import ARITHMETIC_ENV, EngineConfig
from specdecode.models import quant_int8
from specdecode.models.quant_int8 import (
    AUTO,
    FAULT_NONE,
    FAULT_SCALE,
    FAULT_SHARED,
    PORTABLE,
    Int8QuantLinear,
    prefetch_distance,
    quant_int8_linear,
)
from specdecode.models.quant_rows import QuantLinear
from specdecode.models.row_groups import group_rows, ungroup_rows

ROWS = (1, 3, 9, 17)  # 17 = a chunk of 16 rows + 1
TYPES = (Q.Q4_K, Q.Q6_K, Q.Q8_0, Q.Q5_0, Q.Q4_1, Q.Q4_0)
FP16_FIELDS = {Q.Q4_0: (0,), Q.Q4_1: (0, 2), Q.Q5_0: (0,), Q.Q8_0: (0,), Q.Q4_K: (0, 2), Q.Q6_K: (208,)}
SHAPES = {256: ((37, 768), (8, 1536)), 32: ((37, 352), (8, 1024))}  # odd out: a lone last weight row


pytestmark = pytest.mark.usefixtures("quant_int8_kernel")  # conftest: skips only without a C++ compiler


@pytest.fixture
def fault():
    """Sets a fault for one test and always clears it."""
    yield quant_int8.set_fault
    quant_int8.set_fault(FAULT_NONE)


def random_blocks(qtype: Q, out: int, k: int, gen: np.random.Generator) -> torch.Tensor:
    """[out, bytes_per_row]: gguf's own quantizer where it has one, else random quants and scale bytes with finite
    fp16 scales in [-0.05, 0.05] (one subnormal)."""
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    if qtype in (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q8_0):
        return torch.from_numpy(gguf.quants.quantize(gen.standard_normal((out, k), dtype=np.float32), qtype))
    blocks = gen.integers(0, 256, size=(out, k // block_size, type_size), dtype=np.uint8)
    for offset in FP16_FIELDS[qtype]:
        d = gen.uniform(-0.05, 0.05, size=(out, k // block_size)).astype(np.float16)
        d[0, 0] = np.float16(2.0**-20)
        blocks[..., offset : offset + 2] = d.view(np.uint8).reshape(out, k // block_size, 2)
    return torch.from_numpy(blocks.reshape(out, -1))


# ---- the reference: the header's arithmetic written again in numpy, from the bytes ----


def quantize_rows(x: np.ndarray, qb: int) -> tuple[np.ndarray, np.ndarray]:
    """x [M, K] fp32 -> (q [M, K / qb, qb] int64, dx [M, K / qb] fp32): per row and block, dx = max|x| / 127."""
    blocks = x.reshape(x.shape[0], -1, qb)
    dx = np.abs(blocks).max(axis=-1) / np.float32(127)  # fp32 / fp32
    safe = np.where(dx == 0, np.float32(1), dx)[..., None]
    q = np.clip(np.rint(blocks / safe), -127, 127)  # rint: half to even
    return np.where(dx[..., None] == 0, 0, q).astype(np.int64), dx.astype(np.float32)


def half(raw: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(raw).view(np.float16)[..., 0].astype(np.float32)


def decode(blocks: np.ndarray, qtype: Q) -> dict[str, np.ndarray]:
    """Integer quants in natural order [N, nb, W] and the block fields, straight from the GGUF layout."""
    n = blocks.shape[0]
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    b = blocks.reshape(n, -1, type_size)
    f: dict[str, np.ndarray] = {}
    if qtype == Q.Q8_0:
        f["d"], f["q"] = half(b[..., 0:2]), b[..., 2:].view(np.int8).astype(np.int64)
    elif qtype == Q.Q5_0:
        qh = b[..., 2:6].copy().view("<u4")[..., 0].astype(np.int64)  # [N, nb]
        qs = b[..., 6:].astype(np.int64)
        bits = (qh[..., None] >> np.arange(32)) & 1
        f["d"], f["q"] = half(b[..., 0:2]), np.concatenate([qs & 15, qs >> 4], axis=-1) + 16 * bits - 16
    elif qtype == Q.Q4_0:
        qs = b[..., 2:].astype(np.int64)
        f["d"], f["q"] = half(b[..., 0:2]), np.concatenate([qs & 15, qs >> 4], axis=-1) - 8
    elif qtype == Q.Q4_1:
        qs = b[..., 4:].astype(np.int64)
        f["d"], f["m"], f["q"] = half(b[..., 0:2]), half(b[..., 2:4]), np.concatenate([qs & 15, qs >> 4], axis=-1)
    elif qtype == Q.Q4_K:
        s = b[..., 4:16].astype(np.int64)
        sc = np.concatenate([s[..., 0:4] & 63, (s[..., 8:12] & 15) | ((s[..., 0:4] >> 6) << 4)], axis=-1)
        mn = np.concatenate([s[..., 4:8] & 63, (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)], axis=-1)
        qs = b[..., 16:].astype(np.int64).reshape(n, -1, 4, 32)
        q = np.stack([qs & 15, qs >> 4], axis=3).reshape(n, -1, 256)  # sub-block 2i low nibbles, 2i+1 high
        f.update(d=half(b[..., 0:2]), dmin=half(b[..., 2:4]), sc=sc, mn=mn, q=q)
    else:  # Q6_K: weight 128h + r is ql[64h + r % 64] >> 4(r // 64) and qh[32h + r % 32] >> 2(r // 32)
        r = np.arange(128)
        ql, qh = b[..., 0:128].astype(np.int64), b[..., 128:192].astype(np.int64)
        halves = [
            ((ql[..., 64 * h + r % 64] >> (4 * (r // 64))) & 15)
            | (((qh[..., 32 * h + r % 32] >> (2 * (r // 32))) & 3) << 4)
            for h in range(2)
        ]
        f.update(d=half(b[..., 208:210]), sc=b[..., 192:208].view(np.int8).astype(np.int64))
        f["q"] = np.concatenate(halves, axis=-1) - 32
    return f


def fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """fp32 fma(a, b, c) with one rounding: the product is exact in fp64, the fp64 sum's error is kept (TwoSum),
    and where the fp64 sum falls exactly halfway between two fp32 values the error says which side is nearer."""
    p, c64 = a.astype(np.float64) * b.astype(np.float64), c.astype(np.float64)
    s = p + c64
    bp = s - p
    e = (p - (s - bp)) + (c64 - bp)  # s + e == p + c exactly
    r = s.astype(np.float32)
    r64 = r.astype(np.float64)
    toward = np.where(s > r64, np.nextafter(r, np.float32(np.inf)), np.nextafter(r, np.float32(-np.inf)))
    tie = (s != r64) & (2 * s == r64 + toward.astype(np.float64))
    up, down = tie & (e > 0), tie & (e < 0)
    r = np.where(up & (r64 < s), toward, r)
    return np.where(down & (r64 > s), toward, r).astype(np.float32)


def reference(x: np.ndarray, blocks: np.ndarray, qtype: Q, bias: np.ndarray | None = None) -> np.ndarray:
    """The header's steps 1-3: [M, K] x [N, bytes] -> [M, N] fp32. One exact integer per block and output
    (K-quants: the sub-block scales applied in integers), then the block's fp32 steps in order."""
    f = decode(blocks, qtype)
    qb = gguf.GGML_QUANT_SIZES[qtype][0]
    xq, dx = quantize_rows(x, qb)  # [M, nb, qb], [M, nb]
    m, n, nb = x.shape[0], blocks.shape[0], dx.shape[1]
    sub = {Q.Q4_K: 32, Q.Q6_K: 16}.get(qtype, qb)  # positions per scale
    per_sub = np.einsum("mbjt,nbjt->mnbj", xq.reshape(m, nb, -1, sub), f["q"].reshape(n, nb, -1, sub))
    scales = f["sc"][None] if qtype in (Q.Q4_K, Q.Q6_K) else 1
    ints = (per_sub * scales).sum(-1)  # [M, N, nb]: exact
    s32 = xq.reshape(m, nb, -1, 32).sum(-1)  # [M, nb, qb / 32]
    acc = np.zeros((m, n), dtype=np.float32)
    for b in range(nb):
        dxb = dx[:, None, b]  # [M, 1]
        acc = fma32(ints[:, :, b].astype(np.float32), f["d"][None, :, b] * dxb, acc)
        if qtype == Q.Q4_K:
            mins = (f["mn"][None, :, b] * s32[:, None, b]).sum(-1)  # [M, N]
            acc = fma32(mins.astype(np.float32), -(f["dmin"][None, :, b] * dxb), acc)
        elif qtype == Q.Q4_1:
            acc = fma32(np.broadcast_to(s32[:, b], (m, n)).astype(np.float32), f["m"][None, :, b] * dxb, acc)
    return acc if bias is None else acc + bias[None, :]


def weight_values(blocks: np.ndarray, qtype: Q) -> np.ndarray:
    """The fp32 weight [N, K] from the decoded fields, in gguf.quants.dequantize's order of operations."""
    f = decode(blocks, qtype)
    d = f["d"][..., None]
    if qtype == Q.Q4_1:
        w = d * f["q"].astype(np.float32) + f["m"][..., None]
    elif qtype == Q.Q4_K:
        ds = (d * f["sc"].astype(np.float32))[..., None]
        dm = (f["dmin"][..., None] * f["mn"].astype(np.float32))[..., None]
        w = ds * f["q"].reshape(*f["q"].shape[:2], 8, 32).astype(np.float32) - dm
    elif qtype == Q.Q6_K:
        ds = (d * f["sc"].astype(np.float32))[..., None]
        w = ds * f["q"].reshape(*f["q"].shape[:2], 16, 16).astype(np.float32)
    else:
        w = d * f["q"].astype(np.float32)
    return w.reshape(blocks.shape[0], -1).astype(np.float32)


# ---- (a) the kernel is the defined arithmetic ----


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_reference_decoder_reads_the_weights_gguf_reads(qtype):
    """The reference's own decoding is checked against gguf's, so it cannot share a misreading with the kernel."""
    blocks = random_blocks(qtype, 37, SHAPES[gguf.GGML_QUANT_SIZES[qtype][0]][0][1], np.random.default_rng(0))
    want = gguf.quants.dequantize(blocks.numpy(), qtype).astype(np.float32)
    np.testing.assert_array_equal(weight_values(blocks.numpy(), qtype), want)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_ungroup_rows_gives_back_the_files_rows_bit_for_bit(qtype):
    """Random bytes (every bit of every field) through group_rows and back, for 1, 16 and 37 rows; the control:
    one byte of the groups changed, and the rows come back changed."""
    gen = np.random.default_rng(int(qtype))
    type_bytes = gguf.GGML_QUANT_SIZES[qtype][1]
    for out in (1, 16, 37):
        rows = torch.from_numpy(gen.integers(0, 256, size=(out, 3 * type_bytes), dtype=np.uint8))
        groups = group_rows(rows, qtype)
        assert torch.equal(ungroup_rows(groups, qtype, out), rows)
        groups[0, 0] ^= 1  # the low bit of row 0's d, every type's first field
        assert not torch.equal(ungroup_rows(groups, qtype, out), rows)


def mismatches(qtype: Q, path: int) -> int:
    """Outputs that differ from the reference in any bit, over shapes, row counts and a bias."""
    gen, bad = np.random.default_rng(int(qtype)), 0
    for out, k in SHAPES[gguf.GGML_QUANT_SIZES[qtype][0]]:
        blocks = random_blocks(qtype, out, k, gen)
        bias = gen.standard_normal(out, dtype=np.float32)
        for rows in ROWS:
            x = gen.standard_normal((rows, k), dtype=np.float32)
            x[0, :40] = 0.0  # an all-zero activation block (dx = 0) in every shape
            got = quant_int8_linear(torch.from_numpy(x), blocks, qtype, k, torch.from_numpy(bias), path=path)
            bad += int((got.numpy().view(np.int32) != reference(x, blocks.numpy(), qtype, bias).view(np.int32)).sum())
    return bad


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_kernel_is_the_defined_arithmetic_bit_for_bit(qtype):
    for path in quant_int8.paths():
        assert mismatches(qtype, path) == 0, f"path {path}"


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_control_a_misread_sub_block_scale_is_caught(qtype, fault):
    fault(FAULT_SCALE)
    for path in quant_int8.paths():
        assert mismatches(qtype, path) > 0, f"path {path}"


@pytest.fixture
def prefetch():
    """Sets the prefetch distance for one test and always puts back the CPU's own."""
    chosen = prefetch_distance()
    yield prefetch_distance
    prefetch_distance(chosen)


def test_prefetch_distance_is_the_cpus_and_changes_no_bit(prefetch):
    # Chosen from the CPU's vendor (cpuid), as /proc/cpuinfo names it: 2 KiB on Intel, 8 KiB elsewhere on x86.
    vendor = next((ln.split(":")[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("vendor_id")), None)
    if vendor is not None and quant_int8.paths() != [PORTABLE]:
        assert prefetch() == (2048 if vendor == "GenuineIntel" else 8192)
    assert prefetch(100) == 64 and prefetch() == 64  # set, to whole lines
    for distance in (0, 64, 8192, 1 << 20):  # a prefetch only asks for bytes: the arithmetic cannot move
        prefetch(distance)
        for qtype in (Q.Q4_K, Q.Q6_K, Q.Q4_1):
            for path in quant_int8.paths():
                assert mismatches(qtype, path) == 0, f"{distance} bytes, path {path}"  # control: the scale fault


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_close_to_the_exact_product(qtype):
    """The arithmetic approximates x @ dequant(W)^T (int8 activations: ~1% of the output's scale)."""
    out, k = SHAPES[gguf.GGML_QUANT_SIZES[qtype][0]][1]
    gen = np.random.default_rng(7)
    blocks = random_blocks(qtype, out, k, gen)
    x = torch.from_numpy(gen.standard_normal((9, k), dtype=np.float32))
    want = x.double() @ torch.from_numpy(weight_values(blocks.numpy(), qtype)).double().T
    got = quant_int8_linear(x, blocks, qtype, k)
    assert ((got.double() - want).abs().max() / want.abs().max()).item() < 0.03


# ---- (b) the paths agree; (c) batch invariance ----


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_every_path_gives_the_portable_bits(qtype):
    available = quant_int8.paths()
    if len(available) == 1:
        pytest.skip("this CPU has neither AVX512-VNNI nor AVX-512BW")
    gen = np.random.default_rng(2)
    for out, k in SHAPES[gguf.GGML_QUANT_SIZES[qtype][0]]:
        blocks = random_blocks(qtype, out, k, gen)
        for rows in ROWS:
            x = torch.from_numpy(gen.standard_normal((rows, k), dtype=np.float32))
            want = quant_int8_linear(x, blocks, qtype, k, path=PORTABLE)
            for path in available:
                assert torch.equal(quant_int8_linear(x, blocks, qtype, k, path=path), want), f"path {path}"


def batch_dependence(qtype: Q, path: int) -> list[str]:
    """Where a row's output differs between alone and in batches of 1-17 rows (empty if nowhere). Rows of very
    different magnitudes, so that a scale shared across rows would change the small rows' quants."""
    gen = np.random.default_rng(3)
    out, k = SHAPES[gguf.GGML_QUANT_SIZES[qtype][0]][0]
    blocks = random_blocks(qtype, out, k, gen)
    x = torch.from_numpy(
        gen.standard_normal((17, k), dtype=np.float32) * np.logspace(-2, 2, 17, dtype=np.float32)[:, None]
    )

    def linear(rows: torch.Tensor) -> torch.Tensor:
        return quant_int8_linear(rows, blocks, qtype, k, path=path)

    alone = torch.cat([linear(x[i : i + 1]) for i in range(17)])  # [17, out]
    found = [f"first {r} rows" for r in range(1, 18) if not torch.equal(linear(x[:r]), alone[:r])]
    order = torch.from_numpy(gen.permutation(17))
    if not torch.equal(linear(x[order]), alone[order]):
        found.append("permuted")
    if not torch.equal(linear(x[:12].reshape(3, 4, k)), alone[:12].reshape(3, 4, out)):
        found.append("[3, 4, k]")
    return found


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_a_row_does_not_depend_on_its_batch(qtype):
    for path in quant_int8.paths():
        assert batch_dependence(qtype, path) == [], f"path {path}"


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q8_0], ids=lambda t: t.name)
def test_control_a_scale_shared_across_rows_breaks_batch_invariance(qtype, fault):
    fault(FAULT_SHARED)
    for path in quant_int8.paths():
        assert batch_dependence(qtype, path) != [], f"path {path}"


# ---- the real files ----


def real_tensors(model: str, names: tuple[str, ...]) -> list[gguf.ReaderTensor]:
    from specdecode.models.loader import BUILTIN_MODELS, ModelLoadError

    try:
        reader = gguf.GGUFReader(BUILTIN_MODELS[model].gguf_path(model, progress=False))
    except TypeError:  # a built-in shipped in a package takes no progress argument
        reader = gguf.GGUFReader(BUILTIN_MODELS[model].gguf_path(model))
    except ModelLoadError as e:
        pytest.skip(f"{model} is not installed here: {e}")
    tensors = {t.name: t for t in reader.tensors}
    return [tensors[n] for n in names]


REAL = {
    "qwen2.5-coder-1.5b-instruct": ("blk.0.attn_q.weight", "blk.0.ffn_down.weight", "output.weight"),
    "qwen2.5-coder-0.5b-instruct": ("blk.0.attn_q.weight", "blk.0.ffn_down.weight", "blk.0.ffn_up.weight"),
    "smollm2-135m-instruct": ("blk.0.ffn_down.weight", "token_embd.weight"),
}


@pytest.mark.parametrize("model", REAL)
def test_real_tensors(model):
    """256 rows of each named tensor (Q4_K, Q6_K; Q5_0, Q8_0; Q4_1, Q8_0): the reference's bits on every path,
    and the same bits alone and together."""
    seen = set()
    for tensor in real_tensors(model, REAL[model]):
        blocks = torch.from_numpy(np.array(tensor.data[:256]))  # [256, bytes_per_row]
        qtype, k = tensor.tensor_type, int(tensor.shape[0])
        seen.add(qtype.name)
        x = np.random.default_rng(4).standard_normal((9, k), dtype=np.float32)
        want = reference(x, blocks.numpy(), qtype)
        for path in quant_int8.paths():
            got = quant_int8_linear(torch.from_numpy(x), blocks, qtype, k, path=path)
            assert np.array_equal(got.numpy().view(np.int32), want.view(np.int32)), f"{tensor.name} path {path}"
            assert torch.equal(quant_int8_linear(torch.from_numpy(x[4:5]), blocks, qtype, k, path=path), got[4:5])
    assert seen, "no tensor checked"


# ---- the module ----


def test_int8_linear_shares_the_bias_holds_only_groups_and_use_int8_swaps_concat_parts():
    from specdecode.models.gguf_quantized import ConcatLinear

    gen = np.random.default_rng(5)
    a = QuantLinear(random_blocks(Q.Q4_K, 16, 256, gen), Q.Q4_K, 256, torch.randn(16))
    b = QuantLinear(random_blocks(Q.Q6_K, 8, 256, gen), Q.Q6_K, 256)
    model = torch.nn.Sequential(ConcatLinear([a, b]), QuantLinear(random_blocks(Q.Q8_0, 4, 24 * 32, gen), Q.Q8_0, 768))
    x = torch.randn(3, 256)
    assert quant_int8.use_int8(model) == 3
    fast = model[0].parts[0]
    assert isinstance(fast, Int8QuantLinear) and isinstance(model[1], Int8QuantLinear)
    assert torch.equal(fast.blocks, a.blocks) and fast.bias.data_ptr() == a.bias.data_ptr()
    assert [name for name, _ in fast.named_buffers()] == ["bias", "groups"]  # the file's rows are not held
    assert torch.equal(
        model[0](x),
        torch.cat(
            [quant_int8_linear(x, a.blocks, Q.Q4_K, 256, a.bias), quant_int8_linear(x, b.blocks, Q.Q6_K, 256)], dim=-1
        ),
    )
    assert torch.equal(fast.dequantized(), a.dequantized())
    assert quant_int8.use_int8(model) == 0  # nothing left to swap
    assert "int8" in repr(fast)


def test_arithmetic_switch(monkeypatch):
    gen = np.random.default_rng(6)

    def model() -> torch.nn.Module:
        return torch.nn.Sequential(QuantLinear(random_blocks(Q.Q4_K, 4, 256, gen), Q.Q4_K, 256))

    monkeypatch.delenv(ARITHMETIC_ENV, raising=False)  # the setting resolves at EngineConfig, the model gets it
    assert isinstance(quant_int8.apply_arithmetic(model(), EngineConfig().arithmetic)[0], QuantLinear)
    monkeypatch.setenv(ARITHMETIC_ENV, "fast")
    assert isinstance(quant_int8.apply_arithmetic(model(), EngineConfig().arithmetic)[0], Int8QuantLinear)
    monkeypatch.setenv(ARITHMETIC_ENV, "exact")
    assert isinstance(quant_int8.apply_arithmetic(model(), EngineConfig().arithmetic)[0], QuantLinear)
    monkeypatch.setenv(ARITHMETIC_ENV, "int8")
    with pytest.raises(ValueError, match="expected 'exact' or 'fast'"):
        EngineConfig()


def test_errors_and_fake():
    blocks = random_blocks(Q.Q8_0, 8, 64, np.random.default_rng(8))
    groups = group_rows(blocks, Q.Q8_0)  # [1, 2 * 544]
    with pytest.raises(RuntimeError, match="unsupported GGML type"):
        quant_int8.quant_int8_grouped_linear(torch.randn(2, 64), groups, Q.Q5_1, 64, 8)
    with pytest.raises(RuntimeError, match="features"):
        quant_int8.quant_int8_grouped_linear(torch.randn(2, 32), groups, Q.Q8_0, 64, 8)
    with pytest.raises(RuntimeError, match="path is"):
        quant_int8.quant_int8_grouped_linear(torch.randn(2, 64), groups, Q.Q8_0, 64, 8, path=7)
    with pytest.raises(ValueError, match="group_rows takes"):
        group_rows(blocks, Q.Q5_1)
    kquant = random_blocks(Q.Q4_K, 20, 256, np.random.default_rng(9))
    groups = group_rows(kquant, Q.Q4_K)  # [2, 2368]: 20 rows, the second group padded
    with pytest.raises(RuntimeError, match="groups must be"):
        quant_int8.quant_int8_grouped_linear(torch.randn(2, 256), groups[:1], Q.Q4_K, 256, 20)
    torch.library.opcheck(
        torch.ops.specdecode.quant_int8_grouped_linear.default,
        (torch.randn(2, 3, 256), groups, int(Q.Q4_K), 256, 20, torch.randn(20), AUTO),
    )


def test_amx_from_rows_is_a_setting_that_changes_no_bit():
    # AUTO takes AMX from 16 rows where the CPU has it; whatever the threshold, the outputs are the same bits (the
    # paths' own equality is the tests above, each path forced).
    chosen = quant_int8.amx_from_rows()
    assert chosen == 16
    gen = np.random.default_rng(6)
    try:
        for qtype in (Q.Q4_1, Q.Q8_0, Q.Q4_K):
            out, k = SHAPES[gguf.GGML_QUANT_SIZES[qtype][0]][1]
            blocks = random_blocks(qtype, out, k, gen)
            x = torch.from_numpy(gen.standard_normal((17, k), dtype=np.float32))
            got = []
            for rows in (0, 1, 16):
                assert quant_int8.amx_from_rows(rows) == rows
                got.append(quant_int8_linear(x, blocks, qtype, k))
            assert torch.equal(got[0], got[1]) and torch.equal(got[0], got[2]), qtype.name
    finally:
        quant_int8.amx_from_rows(chosen)
