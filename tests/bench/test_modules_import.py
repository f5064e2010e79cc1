"""Every bench module and every experiment imports: two of them (suffix_index, structured) once imported a helper
that had been renamed away, and no test loaded them, so their commands died at start-up unnoticed."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import experiments
import specdecode.bench

MODULES = [f"specdecode.bench.{m.name}" for m in pkgutil.iter_modules(specdecode.bench.__path__)]
EXPERIMENTS = [f"experiments.{m.name}" for m in pkgutil.iter_modules(experiments.__path__)]


@pytest.mark.parametrize("name", MODULES + EXPERIMENTS)
def test_bench_module_imports(name):
    importlib.import_module(name)


def test_every_module_is_listed():
    assert {"specdecode.bench.sweep", "specdecode.bench.cost", "specdecode.bench.lib"} <= set(MODULES)
    assert {"experiments.suffix_index", "experiments.structured", "experiments.suffix_replay"} <= set(EXPERIMENTS)
