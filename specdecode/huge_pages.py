"""Large tensors (a model's weights, the KV cache) in memory backed by 2 MiB pages, where the kernel gives them.

A decode step streams every weight once, and on 4 KiB pages the stream misses the TLB every 4 KiB and the hardware
prefetchers stop at every page boundary. Linux gives anonymous memory transparent huge pages only where asked
(`/sys/kernel/mm/transparent_hugepage/enabled` is often `madvise`). numpy asks for its large arrays, but from
unaligned starts, and torch never asks: 7-52% of the bytes of the pair's tensors of 1 MiB or more lay in mappings
with any huge page, depending on the load (experiments/huge_pages.py).

So a model's large tensors are copied into one anonymous mapping whose start is aligned to 2 MiB, asked for huge
pages (`madvise(MADV_HUGEPAGE)`); at most its last huge page holds bytes no tensor uses. The KV cache is allocated
the same way. Where the kernel has no transparent huge pages (or the OS is not Linux), the mapping is ordinary memory
and only the copy is spent. Only the bytes' placement changes: shapes, dtypes, values and sharing (a weight tied to
another stays one tensor) are kept, so every output is bitwise the same. What it gains is small: a few percent of the
1.5B's step on a Zen 4 EPYC (docs/models.md).
"""

from __future__ import annotations

import mmap

import torch
from torch import nn

from specdecode.free_memory import release_free_memory

HUGE_PAGE = 2 << 20  # bytes of an x86-64 (and arm64 4 KiB-granule) transparent huge page
ALIGN = 64  # each tensor starts on a cache line of the arena
TRIM_BYTES = 64 << 20  # old bytes freed between handing the heap's free pages back
MIN_BYTES = 1 << 20  # tensors smaller than this stay where they are: a page boundary or two is nothing to them


def huge_empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised CPU tensor whose bytes start on a 2 MiB boundary of their own anonymous mapping, asked to be
    backed by huge pages (a no-op where the kernel cannot)."""
    nbytes = torch.Size(shape).numel() * dtype.itemsize
    if nbytes == 0 or not hasattr(mmap, "MAP_ANONYMOUS"):  # nothing to place, or no anonymous mappings (Windows)
        return torch.empty(shape, dtype=dtype)
    region = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        region.madvise(mmap.MADV_HUGEPAGE)
    raw = torch.frombuffer(region, dtype=torch.uint8)  # [nbytes + HUGE_PAGE]; holds the mapping alive
    start = -raw.data_ptr() % HUGE_PAGE
    return raw[start : start + nbytes].view(dtype).view(shape)


def _large_tensors(model: nn.Module) -> dict[int, list[tuple[nn.Module, str, bool]]]:
    """{storage address: [(module, attribute name, is a parameter)]} of the model's CPU parameters and buffers of
    MIN_BYTES or more that fill their storage whole (a view into a larger tensor stays where it is)."""
    found: dict[int, list[tuple[nn.Module, str, bool]]] = {}
    for module in model.modules():
        for table, is_param in ((module._parameters, True), (module._buffers, False)):
            for name, t in table.items():
                if t is None or t.device.type != "cpu" or t.layout != torch.strided or t.is_mkldnn:
                    continue  # not a plain CPU tensor (a oneDNN-packed weight has no storage to move)
                nbytes = t.untyped_storage().nbytes()
                whole = t.storage_offset() == 0 and t.is_contiguous() and t.numel() * t.element_size() == nbytes
                if nbytes >= MIN_BYTES and whole:
                    found.setdefault(t.untyped_storage().data_ptr(), []).append((module, name, is_param))
    return found


def _tensor(users: list[tuple[nn.Module, str, bool]]) -> torch.Tensor:
    module, name, is_param = users[0]
    return (module._parameters if is_param else module._buffers)[name]


def move_to_huge_pages(model: nn.Module) -> int:
    """Move the model's large CPU parameters and buffers into one huge-page-backed arena; returns the bytes moved.
    Tensors that shared a storage share the new one. One arena, not one mapping per tensor: a mapping's last huge
    page is resident whole, and one mapping per tensor held the pair 335 MiB more. The old bytes go back to the
    system every TRIM_BYTES moved, so the load's peak grows by about that, not by the model."""
    found = list(_large_tensors(model).values())
    sizes = [-(-_tensor(users).untyped_storage().nbytes() // ALIGN) * ALIGN for users in found]
    arena = huge_empty((sum(sizes),), torch.uint8)  # [bytes]
    offset = freed = 0
    for users, size in zip(found, sizes, strict=True):
        old = _tensor(users)
        new = arena[offset : offset + old.numel() * old.element_size()].view(old.dtype).view(old.shape)
        new.copy_(old.detach())
        for module, name, is_param in users:  # each user keeps its own shape of the shared bytes
            if is_param:
                module._parameters[name].data = new.view(module._parameters[name].shape)
            else:
                module._buffers[name] = new.view(module._buffers[name].shape)
        del old
        offset, freed = offset + size, freed + size
        if freed >= TRIM_BYTES:
            release_free_memory()
            freed = 0
    return offset
