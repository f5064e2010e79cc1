"""Speculation-length controllers, by name."""

from __future__ import annotations

from collections.abc import Callable

from specdecode.config import ConfigError
from specdecode.control.base import Controller, StepStats
from specdecode.control.confidence import ConfidenceController
from specdecode.control.fixed import FixedController
from specdecode.control.goodput import GoodputController
from specdecode.control.heuristic import HeuristicController
from specdecode.models.llama import LlamaModel, packs_rows


def _goodput(target: LlamaModel | None) -> GoodputController:
    from specdecode.control.calibrate import profile_or_probe  # keyed by the target's fingerprint

    controller = GoodputController(profile_or_probe(target) if target is not None else None)
    controller.cost.packed = target is not None and packs_rows(target.device)  # a verify costs its real tokens
    return controller


# Each builder takes the target model (or None) so that controllers with a cost model can find its profile.
CONTROLLERS: dict[str, Callable[[LlamaModel | None], Controller]] = {
    "goodput": _goodput,
    "fixed": lambda target: FixedController(),
    "heuristic": lambda target: HeuristicController(),
    "confidence": lambda target: ConfidenceController(),
}


def make_controller(name: str, target: LlamaModel | None = None) -> Controller:
    if name not in CONTROLLERS:
        raise ConfigError(f"unknown controller {name!r}; expected one of {', '.join(CONTROLLERS)}")
    return CONTROLLERS[name](target)


__all__ = ["CONTROLLERS", "Controller", "StepStats", "make_controller"]
