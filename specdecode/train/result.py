"""What a training run returns, draft or heads: apart from both trainers so that neither imports the other."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class DistillResult:
    out: Path
    losses: list[float]  # one per step run in this process
    accuracies: list[float]
    manifest: dict
