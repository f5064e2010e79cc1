"""The quantized few-rows linear (models/quant_rows.py): every weight decodes to gguf.quants.dequantize's fp32
value, the product is the dequantized weight's within fp32 summation error, the portable path gives the bits of
each vector path (AVX-512, AVX2), and a row's result does not depend on the rows beside it. Random blocks and
SmolLM2's own tensors.

A build error fails these tests; they skip only without a C++ compiler, or (a vector path's cases) on a CPU
without that path.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from specdecode.models import quant_rows, torch_op
from specdecode.models.quant_rows import AUTO, AVX2, AVX512, PORTABLE, QuantLinear

# 1, 3: one block of rows on either vector path; 9: one on AVX-512 (<= 12), two on AVX2 (5 + 4, blocks of <= 6);
# 17: AVX-512 12 + 5, AVX2 6 + 6 + 5
ROWS = (1, 3, 9, 17)
VECTOR_PATHS = {"AVX512": AVX512, "AVX2": AVX2}
# Byte offsets of each type's fp16 scales in a block (gguf/quants.py): random bytes there could be inf or NaN.
FP16_FIELDS = {Q.Q4_0: (0,), Q.Q4_1: (0, 2), Q.Q5_0: (0,), Q.Q8_0: (0,), Q.Q4_K: (0, 2), Q.Q6_K: (208,)}
# (out, in): odd out leaves a lone last weight row; 32-weight types get an `in` that is no multiple of 256.
SHAPES = {256: ((37, 256), (8, 768)), 32: ((37, 352), (8, 1024))}
TOLERANCE = 1e-5  # fp32 rounding of sums over <= 1024 terms, relative to the largest output


pytestmark = pytest.mark.usefixtures("quant_rows_kernel")  # conftest: skips only without a C++ compiler


def need(path: int) -> int:
    """`path`, or a skip where this CPU does not run it."""
    if path != AUTO and path not in quant_rows.paths():
        pytest.skip(f"this CPU has no {next(name for name, p in VECTOR_PATHS.items() if p == path)}")
    return path


def assert_same_bits(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal as bit patterns: signed zeros too, which torch.equal takes as equal."""
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


def random_blocks(qtype: Q, out: int, k: int, gen: np.random.Generator) -> torch.Tensor:
    """[out, bytes_per_row] valid blocks: random quants and scale bytes, finite fp16 scales in [-0.05, 0.05]
    (one subnormal among them)."""
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = gen.integers(0, 256, size=(out, k // block_size, type_size), dtype=np.uint8)
    for offset in FP16_FIELDS[qtype]:
        d = gen.uniform(-0.05, 0.05, size=(out, k // block_size)).astype(np.float16)
        d[0, 0] = np.float16(2.0**-20)
        blocks[..., offset : offset + 2] = d.view(np.uint8).reshape(out, k // block_size, 2)
    return torch.from_numpy(blocks.reshape(out, -1))


def dequantized(blocks: torch.Tensor, qtype: Q) -> torch.Tensor:
    return torch.from_numpy(gguf.quants.dequantize(blocks.numpy(), qtype).astype(np.float32))  # [out, in]


def relative_error(got: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> float:
    """|got - x @ weight^T in float64| at worst, over the largest |output|."""
    want = x.double() @ weight.double().T
    return ((got.double() - want).abs().max() / want.abs().max()).item()


def max_relative_error(qtype: Q, path: int) -> float:
    """Worst relative error of the kernel against dequantize-then-float64 over shapes and row counts."""
    gen, worst = np.random.default_rng(int(qtype)), 0.0
    for out, k in SHAPES[gguf.GGML_QUANT_SIZES[qtype][0]]:
        blocks = random_blocks(qtype, out, k, gen)
        weight = dequantized(blocks, qtype)
        for rows in ROWS:
            x = torch.from_numpy(gen.standard_normal((rows, k), dtype=np.float32))
            got = quant_rows.quant_rows_linear(x, blocks, qtype, k, path=path)
            worst = max(worst, relative_error(got, x, weight))
    return worst


@pytest.mark.parametrize("qtype", quant_rows.TYPES, ids=lambda t: t.name)
def test_product_is_the_dequantized_weights(qtype):
    assert max_relative_error(qtype, AUTO) < TOLERANCE


@pytest.mark.parametrize("qtype", quant_rows.TYPES, ids=lambda t: t.name)
def test_control_a_misread_sub_block_scale_is_caught(qtype):
    """Negative control: the kernel reading one sub-block's scale from its neighbour fails the same check by
    three orders of magnitude, on every path this CPU has."""
    quant_rows.set_fault(True)
    try:
        errors = [max_relative_error(qtype, path) for path in quant_rows.paths()]
    finally:
        quant_rows.set_fault(False)
    assert min(errors) > 1000 * TOLERANCE


@pytest.mark.parametrize("qtype", quant_rows.TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("path", [AUTO, AVX512, AVX2, PORTABLE], ids=["AUTO", "AVX512", "AVX2", "PORTABLE"])
def test_each_weight_decodes_to_dequantize_bit_for_bit(qtype, path):
    """One-hot rows pick single weights out (x * w + 0s, no rounding): column k of the output is column k of
    gguf.quants.dequantize's fp32 weight, exactly."""
    k = SHAPES[gguf.GGML_QUANT_SIZES[qtype][0]][0][1]
    blocks = random_blocks(qtype, 37, k, np.random.default_rng(1))
    got = quant_rows.quant_rows_linear(torch.eye(k), blocks, qtype, k, path=need(path))  # [k, out]
    assert torch.equal(got, dequantized(blocks, qtype).T)


@pytest.mark.parametrize("qtype", quant_rows.TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("path", VECTOR_PATHS.values(), ids=VECTOR_PATHS.keys())
def test_portable_path_gives_the_vector_paths_bits(qtype, path):
    gen = np.random.default_rng(2)
    for out, k in SHAPES[gguf.GGML_QUANT_SIZES[qtype][0]]:
        blocks = random_blocks(qtype, out, k, gen)
        bias = torch.from_numpy(gen.standard_normal(out, dtype=np.float32))
        for rows in ROWS:
            x = torch.from_numpy(gen.standard_normal((rows, k), dtype=np.float32))
            for b in (None, bias):
                fast = quant_rows.quant_rows_linear(x, blocks, qtype, k, b, path=need(path))
                assert_same_bits(fast, quant_rows.quant_rows_linear(x, blocks, qtype, k, b, path=PORTABLE))


@pytest.mark.parametrize("qtype", quant_rows.TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("path", [AVX512, AVX2, PORTABLE], ids=["AVX512", "AVX2", "PORTABLE"])
def test_a_row_does_not_depend_on_its_batch(qtype, path):
    gen = np.random.default_rng(3)
    out, k = SHAPES[gguf.GGML_QUANT_SIZES[qtype][0]][0]
    blocks = random_blocks(qtype, out, k, gen)
    x = torch.from_numpy(gen.standard_normal((17, k), dtype=np.float32))

    def linear(rows: torch.Tensor) -> torch.Tensor:
        return quant_rows.quant_rows_linear(rows, blocks, qtype, k, path=need(path))

    together = linear(x)  # [17, out]
    assert torch.equal(torch.cat([linear(x[i : i + 1]) for i in range(17)]), together)
    for rows in range(1, 18):
        assert torch.equal(linear(x[:rows]), together[:rows])
    order = torch.from_numpy(gen.permutation(17))
    assert torch.equal(linear(x[order]), together[order])
    assert torch.equal(linear(x[:12].reshape(3, 4, k)), together[:12].reshape(3, 4, out))  # any leading shape


@pytest.fixture(scope="module")
def smollm2() -> gguf.GGUFReader:
    from specdecode.models.loader import BUILTIN_MODELS

    return gguf.GGUFReader(BUILTIN_MODELS["smollm2-135m-instruct"].gguf_path("smollm2-135m-instruct"))


@pytest.mark.parametrize("name", ["blk.0.ffn_down.weight", "blk.7.attn_q.weight", "token_embd.weight"])
def test_smollm2_tensors(smollm2, name):
    """Tensors of the real Q4_1 file (its embedding, the tied LM head, is Q8_0; 1024 of its rows here)."""
    tensor = next(t for t in smollm2.tensors if t.name == name)
    blocks = torch.from_numpy(np.array(tensor.data[:1024]))  # [out, bytes_per_row]
    layer = QuantLinear(blocks, tensor.tensor_type, int(tensor.shape[0]))
    weight = layer.dequantized()  # [out, in]
    k = layer.in_features
    x = torch.from_numpy(np.random.default_rng(4).standard_normal((17, k), dtype=np.float32))
    got = layer(x)
    assert relative_error(got, x, weight) < TOLERANCE
    assert torch.equal(layer(torch.eye(k)), weight.T)
    for rows in ROWS:
        assert torch.equal(layer(x[:rows]), got[:rows])
        want = quant_rows.quant_rows_linear(x[:rows], blocks, layer.qtype, k, path=PORTABLE)
        for path in quant_rows.paths():
            assert_same_bits(quant_rows.quant_rows_linear(x[:rows], blocks, layer.qtype, k, path=path), want)


def test_quant_linear_adds_its_bias_and_refuses_what_it_cannot_hold():
    blocks = random_blocks(Q.Q4_K, 16, 256, np.random.default_rng(5))
    bias = torch.randn(16)
    layer = QuantLinear(blocks, Q.Q4_K, 256, bias)
    x = torch.randn(3, 256)
    assert torch.equal(layer(x), quant_rows.quant_rows_linear(x, blocks, Q.Q4_K, 256) + bias)
    assert "Q4_K" in repr(layer)
    with pytest.raises(ValueError, match="supports"):
        QuantLinear(blocks, Q.Q5_1, 256)
    with pytest.raises(ValueError, match="bytes per row"):
        QuantLinear(blocks, Q.Q4_K, 512)
    with pytest.raises(RuntimeError, match="features"):
        layer(torch.randn(3, 128))
    with pytest.raises(RuntimeError, match="unsupported GGML type"):
        quant_rows.quant_rows_linear(x, blocks, Q.Q5_1, 256)


@pytest.mark.parametrize("path", VECTOR_PATHS.values(), ids=VECTOR_PATHS.keys())
def test_a_path_the_cpu_lacks_is_refused(path):
    """Forcing a vector path on a CPU without it is an error, not a crash or a silent fallback."""
    if path in quant_rows.paths():
        pytest.skip("this CPU has the path")
    blocks = random_blocks(Q.Q8_0, 8, 64, np.random.default_rng(7))
    with pytest.raises(RuntimeError, match="this CPU has no"):
        quant_rows.quant_rows_linear(torch.randn(2, 64), blocks, Q.Q8_0, 64, path=path)


def test_an_unknown_path_is_refused():
    blocks = random_blocks(Q.Q8_0, 8, 64, np.random.default_rng(7))
    with pytest.raises(RuntimeError, match="path is 0"):
        quant_rows.quant_rows_linear(torch.randn(2, 64), blocks, Q.Q8_0, 64, path=4)


def test_op_traces_with_its_fake():
    """torch's op checks: schema, fake tensor shapes (for export and compile) and the real kernel agree."""
    blocks = random_blocks(Q.Q8_0, 8, 64, np.random.default_rng(6))
    torch.library.opcheck(
        torch.ops.specdecode.quant_rows_linear.default, (torch.randn(2, 3, 64), blocks, int(Q.Q8_0), 64, None, 0)
    )


def test_a_second_copy_of_the_library_is_not_loaded(tmp_path):
    """Once its op is registered the library is not loaded again, from any path: a copy built into another cache
    directory (the kernel tests' fresh cache) would register the same ops a second time, which aborts the process.
    Nothing is at the path here, so a load would raise."""
    torch_op.load_op(tmp_path / "quant_rows.so", "quant_rows_linear", lambda *args: None)
    assert hasattr(torch.ops.specdecode, "quant_rows_linear")
