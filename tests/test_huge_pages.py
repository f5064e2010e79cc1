"""Large tensors on huge pages (specdecode/huge_pages.py): the arena starts on a 2 MiB boundary of a mapping asked for
huge pages, a moved model keeps every value, shape and shared weight, and the loaders and the KV cache use it.

Whether the kernel then backs the mapping with huge pages depends on its settings and on how fragmented memory is,
so the tests check the request (the mapping's `hg` flag in /proc/self/smaps), not the kernel's answer."""

from __future__ import annotations

import mmap
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from specdecode import huge_pages
from specdecode.huge_pages import HUGE_PAGE, MIN_BYTES, huge_empty, move_to_huge_pages
from specdecode.kv import KVCache

SMAPS = Path("/proc/self/smaps")
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise and smaps are Linux's")


def advised(t: torch.Tensor) -> bool:
    """Whether the mapping that holds t's first byte was asked for huge pages (VmFlags `hg`)."""
    address, inside = t.data_ptr(), False
    for line in SMAPS.read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:  # a mapping's first line: "start-end perms ..."
            start, end = (int(x, 16) for x in head.split("-"))
            inside = start <= address < end
        elif inside and line.startswith("VmFlags:"):
            return "hg" in line.split()
    raise AssertionError(f"no mapping holds {address:#x}")


def test_huge_empty_starts_on_a_huge_page_of_an_advised_mapping():
    t = huge_empty((3, HUGE_PAGE // 4), torch.float32)  # [3, 524288]
    assert t.shape == (3, HUGE_PAGE // 4) and t.dtype == torch.float32 and t.is_contiguous()
    assert t.data_ptr() % HUGE_PAGE == 0 and advised(t)
    t.fill_(1.5)  # writable, every byte of it
    assert t.sum().item() == 1.5 * t.numel()
    # the check itself: the same mapping not asked for huge pages reads so (torch's own allocations may reuse heap
    # memory numpy advised earlier in the process)
    region = mmap.mmap(-1, 3 * HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    assert not advised(torch.frombuffer(region, dtype=torch.uint8))


def shared(model: Tied) -> bool:
    """Whether the tied head and the aliased buffer still share their bytes."""
    tied = model.head.weight is model.embed.weight and isinstance(model.embed.weight, nn.Parameter)
    return tied and model.sub.alias.data_ptr() == model.table.data_ptr()


class Tied(nn.Module):
    """A large embedding tied to the head, a large buffer another module holds too, a small weight and a view into a
    larger tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(4096, 128)  # 2 MiB fp32
        self.head = nn.Linear(128, 4096, bias=False)
        self.head.weight = self.embed.weight  # tied: one Parameter
        self.register_buffer("table", torch.arange(MIN_BYTES // 2, dtype=torch.int16).view(256, -1))  # [256, 2048]
        self.sub = nn.Module()
        self.sub.register_buffer("alias", self.table)  # the same tensor, held by another module
        self.small = nn.Linear(8, 8)
        whole = torch.randn(4, MIN_BYTES // 4)  # [4, 262144]
        self.register_buffer("part", whole[:2])  # a view: stays where it is


def test_a_moved_model_keeps_values_shapes_and_sharing():
    torch.manual_seed(0)
    model = Tied()
    before = {
        n: t.clone()
        for n, t in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]
    }
    small_at, half_at = model.small.weight.data_ptr(), model.part.data_ptr()
    moved = move_to_huge_pages(model)
    assert moved >= 2 * MIN_BYTES + MIN_BYTES  # the tied weight once, and the table
    for name, t in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
        assert torch.equal(t, before[name]) and t.shape == before[name].shape, name
    assert shared(model)
    assert advised(model.embed.weight) and advised(model.table)
    assert model.small.weight.data_ptr() == small_at and model.part.data_ptr() == half_at
    x = torch.tensor([[1, 2, 3]])  # [1, 3]
    want = nn.functional.linear(before["embed.weight"][x], before["embed.weight"])  # [1, 3, 4096]
    assert torch.equal(model.head(model.embed(x)), want)


def test_a_tied_weight_copied_twice_is_caught(monkeypatch):
    """Control: a mover that treats each holder of a storage as its own tensor gives the alias bytes of its own, and
    the check above sees it."""
    found = huge_pages._large_tensors

    def untied(model):
        return {i: [user] for i, users in enumerate(found(model).values(), start=1) for user in users}

    monkeypatch.setattr(huge_pages, "_large_tensors", untied)
    model = Tied()
    move_to_huge_pages(model)
    assert torch.equal(model.sub.alias, model.table) and not shared(model)


def test_the_kv_cache_is_zeroed_on_advised_pages_when_large():
    cache = KVCache(2, 2, 1024, 2, 64, dtype=torch.float32)  # 2 x 2 MiB
    assert advised(cache.k) and advised(cache.v)
    assert cache.k.shape == (2, 2, 2, 1025, 64) and not cache.k.any() and not cache.v.any()
    tiny = KVCache(1, 1, 8, 1, 4)
    assert not tiny.k.any() and tiny.k.numel() * 4 < MIN_BYTES
