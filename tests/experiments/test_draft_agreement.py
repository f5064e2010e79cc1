"""bench.draft_agreement scores a draft as `distill --eval-data` does, whatever file the draft came from."""

from __future__ import annotations

import json

import pytest

from experiments.draft_agreement import main
from specdecode.train.distill import DistillConfig, distill
from specdecode.train.draft_config import DraftOptions
from tests.train.conftest import write_npz


def test_agreement_matches_training_eval_and_separates_drafts(tiny_target, tiny_draft, tmp_path, capsys):
    train, held_out = write_npz(tmp_path / "train.npz"), write_npz(tmp_path / "eval.npz", num_samples=12, seed=1)
    draft = DraftOptions(num_layers=1, init_from_target=True, vocab_subset=64)  # a drafting vocabulary too
    kw = dict(steps=3, batch_size=4, seq_len=24, progress=False, eval_data=str(held_out))
    trained = distill(DistillConfig(str(tiny_target), [str(train)], str(tmp_path / "d"), draft=draft, **kw))
    out = tmp_path / "agreement.json"
    argv = ["--target", str(tiny_target), "--drafts", str(trained.out), str(tiny_target), str(tiny_draft)]
    main([*argv, "--data", str(held_out), "--seq-len", "24", "--batch-size", "4", "--output", str(out)])
    rows = list(json.loads(out.read_text())["drafts"].values())
    assert rows[0]["accuracy"] == pytest.approx(trained.manifest["eval"]["accuracy"], abs=1e-6)
    assert rows[0]["kl"] == pytest.approx(trained.manifest["eval"]["kl"], rel=1e-4)
    assert rows[1]["accuracy"] == 1.0 and rows[1]["kl"] < 1e-4  # the target drafting for itself
    assert rows[2]["accuracy"] < 0.5 and rows[2]["kl"] > 0.1  # its control: an unrelated random draft
    assert "agreement" in capsys.readouterr().out
