"""Directories written atomically: built in a sibling temporary directory and renamed into place, so a reader
sees the previous state or the complete new one, never half of it. A training checkpoint inside the old
directory moves over, so rewriting a model (or heads) mid-training keeps its resumable state."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

CHECKPOINT_DIR = "checkpoint"  # training's resumable state (train/checkpoint.py)


def write_atomically(out: Path, fill: Callable[[Path], None]) -> Path:
    """`fill` writes the directory's files into a sibling temporary directory, which then replaces `out`; a
    training checkpoint inside `out` moves over."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{out.name}.tmp-", dir=out.parent))
    try:
        fill(tmp)
        if (out / CHECKPOINT_DIR).is_dir():
            os.replace(out / CHECKPOINT_DIR, tmp / CHECKPOINT_DIR)
        _swap_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _swap_into_place(tmp: Path, out: Path) -> None:
    if not out.exists():
        os.replace(tmp, out)
        return
    old = Path(tempfile.mkdtemp(prefix=f"{out.name}.old-", dir=out.parent))
    os.replace(out, old / out.name)  # two renames: the window where OUT is absent is tiny, never partial
    os.replace(tmp, out)
    shutil.rmtree(old, ignore_errors=True)
