"""Every drafter class inherits DrafterBase: the engine calls each optional hook (bind_target_cache,
needs_features, retryable_propose, ...) without asking whether it exists, so a drafter outside the base would fail
at its first step rather than here."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import specdecode.drafters
from specdecode.drafters.base import DrafterBase


def drafter_classes() -> list[type]:
    """Every class in specdecode/drafters/ that proposes drafts, the Protocol and the base aside."""
    found = []
    for info in pkgutil.iter_modules(specdecode.drafters.__path__):
        module = importlib.import_module(f"specdecode.drafters.{info.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__ and "propose" in vars(cls) and cls.__name__ != "Drafter":
                found.append(cls)
    return found


def test_every_drafter_inherits_the_base():
    classes = drafter_classes()
    assert len(classes) >= 8  # none, ngram, ngram_tree, suffix, draft model, eagle, last-feature heads, layer skip
    assert [c.__name__ for c in classes if not issubclass(c, DrafterBase)] == []


def test_a_drafter_outside_the_base_is_caught(monkeypatch):
    """Negative control: a drafter class written without the base, as every drafter was before it."""

    class Bare:
        def propose(self, seqs, num_tokens, st): ...

    monkeypatch.setattr(specdecode.drafters.none, "Bare", Bare, raising=False)
    Bare.__module__ = "specdecode.drafters.none"
    assert "Bare" in [c.__name__ for c in drafter_classes() if not issubclass(c, DrafterBase)]
