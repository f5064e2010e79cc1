"""Every registered controller inherits ControllerBase: the engine calls each hook (truncate, observe, forget)
without asking whether it exists, so a controller outside the base would fail at its first step rather than here."""

from __future__ import annotations

import pytest

from specdecode.control import CONTROLLERS, make_controller
from specdecode.control.base import ControllerBase


@pytest.mark.parametrize("name", list(CONTROLLERS))
def test_every_controller_inherits_the_base(name):
    assert isinstance(make_controller(name), ControllerBase)
