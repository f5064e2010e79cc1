"""Each built-in target's default arm: the drafter and K that `LLM(target=...)` (and every command without
--method) uses, chosen on the target's dev prompts (the code set's dev split: never the evaluation prompts), with
the command and results file that measured it. A target not listed, or settings that name a method, get nothing
from here: the config's own defaults (n-gram, K = 5) and what the caller gave.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DefaultArm:
    method: str
    num_speculative_tokens: int
    measured: str  # the results file whose dev run chose it


DEFAULT_ARMS: dict[str, DefaultArm] = {}


def with_default_arm(target: str, settings: dict) -> dict:
    """`settings` (LLM keywords) with the target's default method and K filled in where no method is given; a K
    given without a method keeps its value."""
    arm = DEFAULT_ARMS.get(target)
    if arm is None or settings.get("method") is not None:
        return settings
    return {"method": arm.method, "num_speculative_tokens": arm.num_speculative_tokens, **settings}
