"""Hand the C heap's free pages back to the operating system: when the server goes idle, and after a model loads.

glibc sends an allocation over its mmap threshold to its own mapping, returned at `free`, but it raises that
threshold (up to 32 MiB) each time such a mapping is freed, so after the first few steps a step's multi-MiB
temporaries (logits [rows, vocab], sampling's sorted probabilities) live in the heap instead. The heap then
holds its high-water mark: how many of those were alive at once, which depends on the mix of requests in one
batch (greedy or top-p, how many rows, which prompt lengths). A server that met a new worst mix after an hour
kept ~24 MiB more resident for the rest of its life, without a byte of it in use. `malloc_trim(0)` returns every
free page of every arena (~3 ms on SmolLM2's server), so resident memory measured at idle is the memory
actually held. A quantized model's load leaves its numpy temporaries there the same way (the fast arithmetic's
regrouping and requantizing: the pair held 2,810 MiB ready, 2,230 after a trim; models/compiled.py trims after a
load). Elsewhere than glibc this is a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.cache
def _malloc_trim():  # -> the C function, or None without glibc
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def release_free_memory() -> bool:
    """Return the C heap's free pages to the OS; True when the allocator could do it and some were returned."""
    trim = _malloc_trim()
    return bool(trim is not None and trim(0))
