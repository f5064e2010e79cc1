"""The finished draft directory: HF weights + config, the target's tokenizer, and a manifest of the run.

Built in a sibling temporary directory and renamed into place, so OUT is either the previous state or the
complete new one; a failure mid-write leaves nothing half-written.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
from transformers import AutoTokenizer

from specdecode.drafters.subset_head import VOCAB_FILE
from specdecode.train.checkpoint import CHECKPOINT_DIR

MANIFEST = "manifest.json"


def write_draft_dir(out: Path, student, target_dir: Path, manifest: dict, subset: np.ndarray | None = None) -> Path:
    """Write the final directory at `out`, keeping any training checkpoint inside it for later --resume.
    `subset` ([S] token ids) is the draft vocabulary of a --draft-vocab draft."""

    def fill(tmp: Path) -> None:
        student.save_pretrained(tmp)  # transformers >= 5 always writes safetensors (config.json + model.safetensors)
        AutoTokenizer.from_pretrained(target_dir).save_pretrained(tmp)
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        if subset is not None:
            np.save(tmp / VOCAB_FILE, subset.astype(np.int64))

    return write_atomically(out, fill)


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
