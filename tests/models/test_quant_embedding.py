"""The quantized embedding (models/quant_rows.QuantEmbedding, op specdecode::quant_rows_embedding): the rows it
looks up are, bit for bit, the rows of `gguf.quants.dequantize` of its blocks, for every type the kernel has, on
random blocks and on the real files' token tables. Negative controls (the kernel's misread sub-block scale, a
lookup one row off) fail the same assertion.

A build error fails these tests; they skip only without a C++ compiler (and the Qwen tables without the pair).
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from specdecode.models import quant_rows
from specdecode.models.loader import BUILTIN_MODELS
from specdecode.models.quant_rows import QuantEmbedding
from tests.models.conftest import pair_missing as _pair_missing
from tests.models.test_quant_rows import dequantized, random_blocks

# (vocab, dim): 32-weight types get a dim that is no multiple of 256 and >= 6 blocks (the fault's block 5)
SHAPES = {256: ((37, 256), (11, 768)), 32: ((37, 352), (11, 1024))}
SMOLLM2, TARGET, DRAFT = "smollm2-135m-instruct", "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"


@pytest.fixture(scope="module", autouse=True)
def kernel(quant_rows_kernel) -> None:
    """conftest's: skip without a compiler, error on a build error."""


def assert_rows_exact(table: QuantEmbedding, ids: torch.Tensor) -> None:
    """table(ids) [..., dim] is gguf.quants.dequantize of the rows' blocks, every bit (signs of zeros too)."""
    rows = table.blocks[ids.reshape(-1)]  # [n, bytes_per_row] (gguf cannot dequantize zero rows)
    want = dequantized(rows, table.qtype) if len(rows) else torch.empty(0, table.embedding_dim)
    want = want.reshape(*ids.shape, table.embedding_dim)
    got = table(ids)
    assert got.dtype == torch.float32 and got.shape == want.shape
    assert torch.equal(got.view(torch.int32), want.view(torch.int32)), "rows differ from gguf.quants.dequantize"


def tables(qtype: gguf.GGMLQuantizationType) -> list[QuantEmbedding]:
    gen = np.random.default_rng(int(qtype))
    shapes = SHAPES[gguf.GGML_QUANT_SIZES[qtype][0]]
    return [QuantEmbedding(random_blocks(qtype, vocab, dim, gen), qtype, dim) for vocab, dim in shapes]


def lookups(vocab: int) -> list[torch.Tensor]:
    """Every row in order; a [3, 7] batch with repeats; one id; none."""
    gen = torch.Generator().manual_seed(vocab)
    return [
        torch.arange(vocab),
        torch.randint(0, vocab, (3, 7), generator=gen),
        torch.tensor([vocab - 1]),
        torch.zeros(0, dtype=torch.long),
    ]


@pytest.mark.parametrize("qtype", quant_rows.TYPES, ids=lambda t: t.name)
def test_rows_are_dequantize_bit_for_bit(qtype):
    for table in tables(qtype):
        for ids in lookups(table.num_embeddings):
            assert_rows_exact(table, ids)
        assert torch.equal(table.dequantized(), dequantized(table.blocks, qtype))


@pytest.mark.parametrize("qtype", quant_rows.TYPES, ids=lambda t: t.name)
def test_control_a_misread_sub_block_scale_fails(qtype):
    """Negative control: the kernel's fault (one sub-block's scale read from its neighbour) fails the same check."""
    table = tables(qtype)[0]
    quant_rows.set_fault(True)
    try:
        with pytest.raises(AssertionError, match="rows differ"):
            assert_rows_exact(table, torch.arange(table.num_embeddings))
    finally:
        quant_rows.set_fault(False)
    assert_rows_exact(table, torch.arange(table.num_embeddings))


def test_control_a_lookup_one_row_off_fails(monkeypatch):
    """Negative control: the op handed ids + 1 (the last row wrapping to 0) fails the same check."""
    table = tables(gguf.GGMLQuantizationType.Q4_K)[0]
    real = quant_rows.quant_rows_embedding
    monkeypatch.setattr(quant_rows, "quant_rows_embedding", lambda ids, *a: real((ids + 1) % table.num_embeddings, *a))
    with pytest.raises(AssertionError, match="rows differ"):
        assert_rows_exact(table, torch.tensor([[3, 4], [5, 36]]))


def real_table(name: str) -> QuantEmbedding:
    reader = gguf.GGUFReader(BUILTIN_MODELS[name].gguf_path(name))
    t = next(t for t in reader.tensors if t.name == "token_embd.weight")
    return QuantEmbedding(torch.from_numpy(np.array(t.data)), t.tensor_type, int(t.shape[0]))


def test_smollm2_table_every_row():
    """SmolLM2's Q8_0 table (49152 x 576), every row, in one lookup and in a batch of a few."""
    table = real_table(SMOLLM2)
    assert table.qtype == gguf.GGMLQuantizationType.Q8_0 and table.num_embeddings == 49152
    for ids in lookups(table.num_embeddings):
        assert_rows_exact(table, ids)


@pytest.mark.skipif(bool(_pair_missing()), reason=f"run `make models`: {_pair_missing()}")
@pytest.mark.parametrize(("name", "qtype"), [(TARGET, "Q4_K"), (DRAFT, "Q5_0")])
def test_qwen_tables(name, qtype):
    """The pair's 151936-token tables: the first and last 2048 rows and 4096 random ones (the whole table in
    fp32 would be 0.9 GB here)."""
    table = real_table(name)
    assert table.qtype.name == qtype and table.num_embeddings == 151936
    v = table.num_embeddings
    ids = torch.cat([torch.arange(2048), torch.arange(v - 2048, v), torch.randint(0, v, (4096,))])
    assert_rows_exact(table, ids.reshape(4, -1))


def test_refuses_what_it_cannot_hold():
    blocks = random_blocks(gguf.GGMLQuantizationType.Q4_K, 8, 256, np.random.default_rng(5))
    table = QuantEmbedding(blocks, gguf.GGMLQuantizationType.Q4_K, 256)
    assert "Q4_K" in repr(table) and not hasattr(table, "weight")  # no dense table to read by mistake
    with pytest.raises(ValueError, match="supports"):
        QuantEmbedding(blocks, gguf.GGMLQuantizationType.Q5_1, 256)
    with pytest.raises(ValueError, match="bytes per row"):
        QuantEmbedding(blocks, gguf.GGMLQuantizationType.Q4_K, 512)
    for bad in (8, -1):
        with pytest.raises(RuntimeError, match="out of range"):
            table(torch.tensor([0, bad]))
    with pytest.raises(RuntimeError, match="int64"):
        table(torch.tensor([0], dtype=torch.int32))


def test_op_traces_with_its_fake():
    """torch's op checks: schema, fake tensor shapes (for export and compile) and the real kernel agree."""
    qtype = gguf.GGMLQuantizationType.Q8_0
    blocks = random_blocks(qtype, 8, 64, np.random.default_rng(6))
    ids = torch.tensor([[1, 7, 7], [0, 2, 3]])
    torch.library.opcheck(torch.ops.specdecode.quant_rows_embedding.default, (ids, blocks, int(qtype), 64))
