"""Fixtures shared with the engine's suffix tests: the tiny target's greedy references and a corpus of them."""

from tests.engine.test_suffix import corpus, reference  # noqa: F401 (fixtures, registered by import)
