"""Speculation config: K_max and the controller name are checked on creation."""

from __future__ import annotations

import re

import pytest

from specdecode.config import ConfigError, SamplingParams, SpeculativeConfig
from specdecode.control import CONTROLLERS


@pytest.mark.parametrize("k", [-1, 65])
def test_k_max_out_of_range_is_a_config_error(k):
    with pytest.raises(ConfigError, match="num_speculative_tokens"):
        SpeculativeConfig(num_speculative_tokens=k)


def test_controllers_default_and_names():
    assert SpeculativeConfig().controller == "goodput"
    assert all(SpeculativeConfig(controller=name) for name in CONTROLLERS)
    with pytest.raises(ConfigError, match="unknown controller"):
        SpeculativeConfig(controller="oracle")


@pytest.mark.parametrize(
    ("option", "value", "words"),
    [
        ("suffix_cache_max_tokens", -1, "suffix_cache_max_tokens must be >= 0"),
        ("suffix_max_depth", 0, "suffix_max_depth must be >= 1"),
        ("suffix_spec_factor", 0.0, "suffix_spec_factor must be > 0"),
        ("suffix_min_prob", 1.0, "suffix_min_prob must be in [0, 1)"),
        ("suffix_corpus", ["missing.npz"], "suffix corpus missing.npz: no such file"),
    ],
)
def test_suffix_options_are_checked(option, value, words):
    with pytest.raises(ConfigError, match=re.escape(words)):
        SpeculativeConfig(method="suffix", **{option: value})


def test_suffix_corpus_list_becomes_a_tuple(tmp_path):
    path = tmp_path / "c.npz"
    path.write_bytes(b"")
    assert SpeculativeConfig(method="suffix_tree", suffix_corpus=[str(path)]).suffix_corpus == (str(path),)


@pytest.mark.parametrize("temperature", [1e308, float("inf"), float("nan"), -1.0])
def test_a_temperature_fp32_cannot_hold_is_refused(temperature):
    """The logits are divided by it in fp32: 1e308 is inf there and made NaN probabilities (a schema fuzzer's
    find). The largest finite float32 is still accepted."""
    with pytest.raises(ConfigError, match="temperature must be in"):
        SamplingParams(temperature=temperature)
    assert SamplingParams(temperature=3.4e38).temperature == 3.4e38
