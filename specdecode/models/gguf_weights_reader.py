"""A GGUF reader for loading weights: the tokenizer's long arrays are stepped over, not parsed.

`gguf.GGUFReader` turns every element of every metadata array into a numpy view of its own: Qwen2.5's vocabulary,
merges and token types (151,936 entries each, 150k of merges) took ~5 s a file on a 2-core AMD EPYC, half of a
second start of the 1.5B with its 0.5B draft. Loading weights needs none of them (the tokenizer comes from the
tokenizer files beside the model, models/loader.py), so `WeightsReader` skips every array longer than
`LONG_ARRAY`, walking a string array's length prefixes with `struct` instead of building views. Those keys are
listed in `skipped` and absent from `fields`; every other field and every tensor is what GGUFReader gives.
"""

from __future__ import annotations

import struct
import sys
from typing import Any

import gguf
import numpy as np
import numpy.typing as npt
from gguf import GGUFValueType

LONG_ARRAY = 4096  # metadata arrays longer than this are skipped (a vocabulary, its merges and token types)
SKIPPED = "skipped"  # the type list of a skipped field, which _push_field leaves out


class WeightsReader(gguf.GGUFReader):
    def __init__(self, path) -> None:
        self.skipped: list[str] = []
        super().__init__(path)

    def _get_field_parts(self, orig_offs: int, raw_type: int) -> tuple[int, list[npt.NDArray[Any]], list[int], list]:
        if GGUFValueType(raw_type) != GGUFValueType.ARRAY:
            return super()._get_field_parts(orig_offs, raw_type)
        item_type = GGUFValueType(int(self._get(orig_offs, np.uint32)[0]))
        count = int(self._get(orig_offs + 4, np.uint64)[0])
        if count <= LONG_ARRAY or item_type == GGUFValueType.ARRAY:
            return super()._get_field_parts(orig_offs, raw_type)
        start = orig_offs + 12  # after the item type (uint32) and the count (uint64)
        return start + self._array_bytes(start, item_type, count) - orig_offs, [], [], [SKIPPED]

    def _array_bytes(self, offs: int, item_type: GGUFValueType, count: int) -> int:
        """Bytes of `count` items of `item_type` from offs: strings walked by their uint64 length prefixes."""
        if item_type != GGUFValueType.STRING:
            return count * np.dtype(self.gguf_scalar_to_np[item_type]).itemsize
        length = struct.Struct("=Q" if self.byte_order == "I" else (">Q" if sys.byteorder == "little" else "<Q"))
        buffer, end = memoryview(self.data), offs
        for _ in range(count):
            end += 8 + length.unpack_from(buffer, end)[0]
        return end - offs

    def _push_field(self, field: gguf.ReaderField, skip_sum: bool = False) -> int:
        if field.types[-1:] == [SKIPPED]:
            self.skipped.append(field.name)
            return 0
        return super()._push_field(field, skip_sum)
