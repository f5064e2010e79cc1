"""A draft's linears requantized to Q4_1 or Q4_0 (models/requantize.py): each is llama.cpp's Q4_1 (Q4_0) of the
file's values, the types that already read no more bytes stay as the file has them, and the blocks are built once
per file.

That a requantized draft leaves the output unchanged is the lossless suite's to show: the 1.5B's drafters test
(tests/models/test_qwen2.py) runs the 0.5B requantized, its default, and with the file's blocks."""

from __future__ import annotations

import os
import warnings

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from specdecode.config import ConfigError, SpeculativeConfig
from specdecode.models import requantize
from specdecode.models.gguf_quantized import ConcatLinear, load_gguf_quantized
from specdecode.models.quant_rows import QuantLinear
from tests.models.test_gguf_quantized import write_tiny_gguf

pytestmark = pytest.mark.usefixtures("quant_rows_kernel")  # conftest: skips only without a C++ compiler

# weights -> (the type requantized linears take, the tiny file's kernel types that read no more bytes than it)
TARGETS = {"q4_1": (Q.Q4_1, (Q.Q4_K, Q.Q4_1, Q.Q4_0)), "q4_0": (Q.Q4_0, (Q.Q4_K, Q.Q4_0))}


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path / "cache"))


def modules(model) -> dict[tuple[str, ...], torch.nn.Module]:
    """{the GGUF tensors a linear fuses, in row order: the linear} for the tiny model."""
    out = {("output.weight",): model.lm_head}
    for i, block in enumerate(model.layers):
        p = f"blk.{i}."
        out[tuple(p + f"attn_{r}.weight" for r in "qkv")] = block.attn.wqkv
        out[(p + "attn_output.weight",)] = block.attn.wo
        out[(p + "ffn_gate.weight", p + "ffn_up.weight")] = block.mlp.w13
        out[(p + "ffn_down.weight",)] = block.mlp.w2
    return out


def parts(linear: torch.nn.Module) -> list[torch.nn.Module]:
    return list(linear.parts) if isinstance(linear, ConcatLinear) else [linear]


def expected(reader: gguf.GGUFReader, name: str, weights: str) -> tuple[Q, torch.Tensor]:
    """The type and blocks the tensor `name` should load as, computed here without the loader under test: the
    file's blocks where its type reads no more bytes than the target type, else blocks of that type from its
    values (gguf's own)."""
    target, kept = TARGETS[weights]
    t = next(t for t in reader.tensors if t.name == name)
    if t.tensor_type in kept:
        return t.tensor_type, torch.from_numpy(np.array(t.data))
    values = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
    return target, torch.from_numpy(gguf.quants.quantize(values, target))


def check_requantized(model, reader: gguf.GGUFReader, weights: str) -> None:
    """Every linear's parts hold, in row order, the expected type and blocks of the tensors it fuses (neighbours of
    one type share a part), and none is left dense."""
    for names, linear in modules(model).items():
        want: list[tuple[Q, list[torch.Tensor]]] = []
        for qtype, blocks in (expected(reader, n, weights) for n in names):
            if want and want[-1][0] == qtype:
                want[-1][1].append(blocks)
            else:
                want.append((qtype, [blocks]))
        got = parts(linear)
        assert all(isinstance(p, QuantLinear) for p in got), names
        assert [p.qtype for p in got] == [q for q, _ in want], names
        for p, (_, blocks) in zip(got, want, strict=True):
            assert torch.equal(p.blocks, torch.cat(blocks)), names


@pytest.mark.parametrize("weights", TARGETS)
def test_requantized_linears_are_the_target_type_of_the_files_values(tmp_path, weights):
    """Q6_K, Q8_0, Q5_0, F16 and Q5_1 (no kernel: it would load as fp32) linears, and Q4_1 ones under q4_0, become
    gguf's blocks of the target type from their values; Q4_K and Q4_0 ones (and Q4_1 under q4_1) keep the file's
    blocks; no linear is left dense, so nothing warns."""
    path = write_tiny_gguf(tmp_path / "tiny.gguf", tie=False, arch="qwen2")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = load_gguf_quantized(path, weights=weights, progress=False)
    check_requantized(model, gguf.GGUFReader(path), weights)


def test_control_requantizing_the_wrong_layers_values_fails(tmp_path, monkeypatch):
    """Negative control: blocks requantized from the neighbouring layer's tensor fail the same check."""
    path = write_tiny_gguf(tmp_path / "tiny.gguf", tie=False, arch="qwen2")
    reader = gguf.GGUFReader(path)
    real = requantize.requantize
    tensors = {t.name: t for t in reader.tensors}

    def other_layer(t: gguf.ReaderTensor, qtype: Q) -> np.ndarray:
        swapped = (
            t.name.replace("blk.0.", "blk.1.") if t.name.startswith("blk.0.") else t.name.replace("blk.1.", "blk.0.")
        )
        return real(tensors.get(swapped, t), qtype)

    monkeypatch.setattr(requantize, "requantize", other_layer)
    model = load_gguf_quantized(path, weights="q4_1", progress=False)
    with pytest.raises(AssertionError):
        check_requantized(model, reader, "q4_1")


def test_blocks_are_built_once_per_file(tmp_path, monkeypatch):
    """A second load reads the cached blocks (gguf's quantizer is not called); a file whose content changed is
    requantized anew."""
    path = write_tiny_gguf(tmp_path / "tiny.gguf", tie=False, arch="qwen2")
    first = load_gguf_quantized(path, weights="q4_1", progress=False)
    calls = []
    real = gguf.quants.quantize
    monkeypatch.setattr(gguf.quants, "quantize", lambda *a: calls.append(1) or real(*a))
    again = load_gguf_quantized(path, weights="q4_1", progress=False)
    assert not calls
    pairs = zip(modules(first).values(), modules(again).values(), strict=True)
    assert all(torch.equal(a.blocks, b.blocks) for x, y in pairs for a, b in zip(parts(x), parts(y), strict=True))
    write_tiny_gguf(path, tie=False, arch="qwen2", seed=9)
    os.utime(path)
    load_gguf_quantized(path, weights="q4_1", progress=False)
    assert calls  # control: the changed file's blocks were built, not read from the old entry


def test_draft_weights_setting():
    assert SpeculativeConfig().draft_weights == "q4_0"
    assert SpeculativeConfig(draft_weights="file").draft_weights == "file"
    assert SpeculativeConfig(draft_weights="q4_1").draft_weights == "q4_1"
    with pytest.raises(ConfigError, match="draft_weights"):
        SpeculativeConfig(draft_weights="q2_k")
