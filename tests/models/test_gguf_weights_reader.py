"""WeightsReader: GGUFReader's fields and tensors, with the tokenizer's long arrays stepped over, not parsed."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from specdecode.models.gguf_weights_reader import LONG_ARRAY, WeightsReader


def _same_as_stock(path) -> list[str]:
    """Assert the reader's fields and tensors are the stock reader's, less the skipped keys; return those."""
    stock, quick = gguf.GGUFReader(path), WeightsReader(path)
    assert set(stock.fields) == set(quick.fields) | set(quick.skipped)
    assert all(stock.fields[k].contents() == quick.fields[k].contents() for k in quick.fields)
    tensors = [[(t.name, t.tensor_type, list(t.shape), t.data_offset) for t in r.tensors] for r in (stock, quick)]
    assert tensors[0] == tensors[1]
    assert all(np.array_equal(a.data, b.data) for a, b in zip(stock.tensors, quick.tensors, strict=True))
    return quick.skipped


def _file_with_long_arrays(path):
    """Long string and int arrays between short fields, then two tensors: every offset after them depends on the
    skipped arrays' sizes being walked exactly (strings of 0-9 bytes, multi-byte UTF-8 among them)."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_string("before", "a")
    writer.add_array("long.strings", [("é" * (i % 5)) + str(i % 7) * (i % 3) for i in range(LONG_ARRAY + 5)])
    writer.add_uint32("middle", 7)
    writer.add_array("long.ints", list(range(LONG_ARRAY + 1)))
    writer.add_array("short.strings", ["x", "yz"])
    writer.add_string("after", "the end")
    writer.add_tensor("w", np.arange(12, dtype=np.float32).reshape(3, 4))
    writer.add_tensor("v", np.full(5, 2.5, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_fields_and_tensors_are_the_stock_readers_on_a_file_with_long_arrays(tmp_path):
    skipped = _same_as_stock(_file_with_long_arrays(tmp_path / "f.gguf"))
    assert skipped == ["long.strings", "long.ints"]


def test_on_the_smollm2_file_only_the_tokenizers_arrays_are_skipped(smollm2_gguf):
    assert _same_as_stock(smollm2_gguf) == [
        "tokenizer.ggml.tokens",
        "tokenizer.ggml.token_type",
        "tokenizer.ggml.merges",
    ]


def test_control_a_string_array_walked_one_byte_short_breaks_what_follows(tmp_path, monkeypatch):
    """The fault: each skipped array's size reported one byte short. The next field is then read from the wrong
    place, and the file no longer parses as the stock reader's."""
    path = _file_with_long_arrays(tmp_path / "f.gguf")
    walked = WeightsReader._array_bytes
    monkeypatch.setattr(WeightsReader, "_array_bytes", lambda self, *a: walked(self, *a) - 1)
    with pytest.raises((AssertionError, ValueError, KeyError, UnicodeDecodeError, IndexError)):
        _same_as_stock(path)
