"""Speculation config: K_max and the controller name are checked on creation."""

from __future__ import annotations

import pytest

from specdecode.config import ConfigError, SpeculativeConfig
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
