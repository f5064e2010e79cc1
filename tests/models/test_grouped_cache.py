"""A fast model's grouped rows from the cache (models/grouped_cache.py): what a load reads back is what grouping
the loaded blocks gives, the cache is built once per file, and a model of another file or weights never reads
another's groups."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
import torch

from specdecode.models import grouped_cache
from specdecode.models.compiled import load_target
from specdecode.models.gguf_quantized import load_gguf_quantized
from specdecode.models.quant_int8 import Int8QuantLinear
from specdecode.models.row_groups import group_rows
from tests.models.test_gguf_quantized import write_tiny_gguf

pytestmark = pytest.mark.usefixtures("quant_rows_kernel")  # conftest: skips only without a C++ compiler


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path / "cache"))


def fast(path, weights: str = "file"):
    """The tiny GGUF as the engine loads it in the fast arithmetic (eager: the groups are the point here)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tiny file's dense linears
        return load_target(
            path.parent, "cpu", torch.float32, True, False, gguf=path, arithmetic="fast", weights=weights
        )


def check_groups(model, path, weights: str = "file") -> None:
    """Each Int8QuantLinear's groups are bitwise the grouping of the same linear's blocks, loaded anew."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = load_gguf_quantized(path, weights=weights, progress=False)
    want = grouped_cache.quant_linears(plain)
    got = {n: m for n, m in model.named_modules() if isinstance(m, Int8QuantLinear)}
    assert got.keys() == want.keys() and got
    for name, linear in want.items():
        assert torch.equal(got[name].groups, group_rows(linear.blocks, linear.qtype)), name


@pytest.mark.parametrize("weights", ["file", "q4_1"])
def test_cached_groups_are_the_loaded_blocks_grouped(tmp_path, weights):
    path = write_tiny_gguf(tmp_path / "tiny.gguf", tie=False, arch="qwen2")
    fast(path, weights)  # builds the cache
    check_groups(fast(path, weights), path, weights)  # reads it


def test_control_a_corrupted_cache_entry_fails(tmp_path):
    """Negative control: one cached module's groups overwritten with another's bytes fail the same check, so the
    check reads what the cache holds."""
    path = write_tiny_gguf(tmp_path / "tiny.gguf", tie=False, arch="qwen2")
    model = fast(path)
    folder = grouped_cache.groups_dir(model, path, "file")
    a, b = folder / "layers.0.mlp.w13.npy", folder / "layers.1.mlp.w13.npy"
    np.save(a, np.load(b))
    with pytest.raises(AssertionError):
        check_groups(fast(path), path)


def test_groups_are_built_once_per_file_and_weights(tmp_path, monkeypatch):
    """A second load groups nothing; a changed file, or other weights, build their own entry."""
    path = write_tiny_gguf(tmp_path / "tiny.gguf", tie=False, arch="qwen2")
    fast(path)
    calls = []
    real = grouped_cache.group_rows
    monkeypatch.setattr(grouped_cache, "group_rows", lambda *a: calls.append(1) or real(*a))
    fast(path)
    assert not calls
    fast(path, "q4_1")
    assert calls  # control: other weights are grouped anew
    calls.clear()
    write_tiny_gguf(path, tie=False, arch="qwen2", seed=9)
    os.utime(path)
    check_groups(fast(path), path)
    assert calls  # control: the changed file's groups were built, not read from the old entry
