"""bench.draft_step times a draft three ways, each loaded as it says: eager or compiled, head precision forced."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import torch

from experiments import draft_step
from specdecode.drafters.subset_head import DRAFTING_DTYPE_ENV, VOCAB_FILE


def test_arms_are_loaded_as_named_and_timed(tiny_target, tiny_draft, tmp_path, monkeypatch):
    shutil.copytree(tiny_draft, tmp_path / "d")
    np.save(tmp_path / "d" / VOCAB_FILE, np.arange(0, 90, 3))
    monkeypatch.setenv(DRAFTING_DTYPE_ENV, "float32")  # a user's setting: restored after every arm
    arms = draft_step.arms_of(str(tmp_path / "d"))
    eager, compiled, default = arms.values()
    assert not eager.step.compiled and compiled.step.compiled and default.step.compiled
    assert eager.lm_head.head.dtype == compiled.lm_head.head.dtype == torch.float32
    native = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    expected = torch.bfloat16 if native else torch.float32  # the machine's choice: the user's setting is lifted
    assert default.lm_head.head.dtype == expected and str(expected).removeprefix("torch.") in list(arms)[2]
    assert os.environ[DRAFTING_DTYPE_ENV] == "float32"
    monkeypatch.delenv(DRAFTING_DTYPE_ENV)
    out = tmp_path / "step.json"
    argv = ["--target", str(tiny_target), "--drafts", str(tmp_path / "d"), "--rounds", "1", "--output", str(out)]
    draft_step.main(argv)
    rows = json.loads(out.read_text())["drafts"][str(tmp_path / "d")]
    assert len(rows) == 3 and all(r["ms"] > 0 and r["c"] > 0 for r in rows.values())
