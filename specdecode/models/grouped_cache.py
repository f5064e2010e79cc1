"""A GGUF model's rows grouped for the fast arithmetic (models/row_groups.py), built once per file into the cache.

Grouping is a reordering of the file's bytes in numpy, and it was much of a fast load: a second start of the pair
(`specdecode bench startup`, 2-core AMD EPYC, 2026-11-28) took 24.9 s to ready with 2,825 MiB resident. So the
groups of every linear are written once per (file, weights, the code that lays them out) into the cache, a .npy
per module, and later loads read them back; and the numpy temporaries of a load, freed but kept in the process's
heap, are handed back to the system (specdecode/free_memory.py): 14.8 s and 2,346 MiB (results/startup_pair.json).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import torch
from torch import nn

from specdecode.models.disk_cache import build_once, cache_root
from specdecode.models.loader import derived_key, prune_versions
from specdecode.models.quant_rows import QuantLinear
from specdecode.models.row_groups import group_rows

# What the groups' bytes depend on besides the file: how the loader fuses, orders and requantizes the file's rows,
# and how they are grouped.
SOURCES = tuple(Path(__file__).with_name(n) for n in ("gguf_quantized.py", "requantize.py", "row_groups.py"))


def quant_linears(model: nn.Module) -> dict[str, QuantLinear]:
    """The model's QuantLinears by module name, in `named_modules` order (ConcatLinear parts included)."""
    return {name: m for name, m in model.named_modules() if isinstance(m, QuantLinear)}


def _build(model: nn.Module, out: Path) -> None:
    for name, linear in quant_linears(model).items():
        np.save(out / f"{name}.npy", group_rows(linear.blocks, linear.qtype).numpy())


def groups_dir(model: nn.Module, gguf: Path, weights: str) -> Path:
    """The cache directory of `model`'s groups (loaded from the GGUF file `gguf` with `weights`), built now from
    the model if absent; the last two versions per file are kept."""
    layout = hashlib.sha256(b"".join(p.read_bytes() for p in SOURCES)).hexdigest()[:12]
    key = derived_key(gguf, f"groups:{weights}:{layout}")
    final = cache_root() / "int8_groups" / f"{gguf.stem}-{weights}-{key}"
    return prune_versions(build_once(final, lambda tmp: _build(model, tmp)))


def cached_groups(model: nn.Module, gguf: Path, weights: str) -> dict[str, torch.Tensor]:
    """{module name: grouped rows} of each QuantLinear of `model` (loaded from the GGUF file `gguf` with
    `weights`), read from the cache (built on first use): what `quant_int8.apply_arithmetic` takes."""
    folder = groups_dir(model, gguf, weights)
    return {name: torch.from_numpy(np.load(folder / f"{name}.npy")) for name in quant_linears(model)}
