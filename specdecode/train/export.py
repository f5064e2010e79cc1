"""The finished draft directory: HF weights + config, the target's tokenizer, and a manifest of the run.

Built in a sibling temporary directory and renamed into place, so OUT is either the previous state or the
complete new one; a failure mid-write leaves nothing half-written.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from transformers import AutoTokenizer

from specdecode.atomic_dir import write_atomically
from specdecode.drafters.subset_head import VOCAB_FILE

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
