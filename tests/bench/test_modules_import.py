"""Every bench module imports: two of them (suffix_index, structured) once imported a helper that had been renamed
away, and no test loaded them, so their commands died at start-up unnoticed."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import specdecode.bench

MODULES = [m.name for m in pkgutil.iter_modules(specdecode.bench.__path__)]


@pytest.mark.parametrize("name", MODULES)
def test_bench_module_imports(name):
    importlib.import_module(f"specdecode.bench.{name}")


def test_every_module_is_listed():
    assert {"suffix_index", "structured", "suffix_replay", "sweep", "cost"} <= set(MODULES)
