"""Training checkpoints: everything needed for a resumed run to match an uninterrupted one bit for bit.

The batch order is a function of (seed, step) (see data.py), so the state is the student, the optimizer, the
scheduler, the step and the RNG states. Writes are atomic: a crash mid-save leaves the previous checkpoint.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from specdecode.atomic_dir import CHECKPOINT_DIR
from specdecode.config import ConfigError

__all__ = ["CHECKPOINT_DIR", "load_checkpoint", "save_checkpoint"]
STATE_FILE = "state.pt"


def save_checkpoint(out_dir: Path, student, optimizer, scheduler, step: int, totals: dict[str, float]) -> Path:
    """`totals` are running counters (tokens seen) that the manifest reports over the whole run."""
    ckpt = out_dir / CHECKPOINT_DIR
    ckpt.mkdir(parents=True, exist_ok=True)
    state = {
        "student": student.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "step": step,
        "totals": dict(totals),
        "cpu_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }
    tmp = ckpt / f"{STATE_FILE}.tmp-{os.getpid()}"
    torch.save(state, tmp)
    os.replace(tmp, ckpt / STATE_FILE)  # atomic on POSIX: readers see the old file or the new one
    return ckpt / STATE_FILE


def load_checkpoint(out_dir: Path, student, optimizer, scheduler) -> tuple[int, dict[str, float]]:
    """Restore the state in place; returns the number of steps already done and the running totals."""
    path = out_dir / CHECKPOINT_DIR / STATE_FILE
    if not path.is_file():
        raise ConfigError(f"--resume: no checkpoint at {path}")
    state = torch.load(path, map_location="cpu", weights_only=True)  # our own file, still no arbitrary unpickling
    try:
        student.load_state_dict(state["student"])
        optimizer.load_state_dict(state["optimizer"])
    except (RuntimeError, ValueError):
        raise ConfigError(f"--resume: {path} was trained with a different draft configuration") from None
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["cpu_rng"])
    if state["cuda_rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    return int(state["step"]), dict(state["totals"])
