"""Speculation-length controllers, by name."""

from specdecode.config import ConfigError
from specdecode.control.base import Controller, StepStats
from specdecode.control.fixed import FixedController
from specdecode.control.heuristic import HeuristicController

CONTROLLERS = {"fixed": FixedController, "heuristic": HeuristicController}


def make_controller(name: str) -> Controller:
    if name not in CONTROLLERS:
        raise ConfigError(f"unknown controller {name!r}; expected one of {', '.join(CONTROLLERS)}")
    return CONTROLLERS[name]()


__all__ = ["CONTROLLERS", "Controller", "StepStats", "make_controller"]
