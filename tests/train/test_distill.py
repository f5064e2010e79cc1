"""End to end distillation on the tiny target: learning, loadable output, lossless drafting, exact resume."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers
from safetensors.torch import load_file

from specdecode.cli import main
from specdecode.config import ConfigError, SamplingParams
from specdecode.train.distill import DistillConfig, distill
from specdecode.train.draft_config import DraftOptions
from tests.train.conftest import VOCAB, crash_after_checkpoint, write_npz

SMALL = dict(batch_size=4, seq_len=24, warmup=3, progress=False)


def _cfg(target, data, out, **kw) -> DistillConfig:
    return DistillConfig(target=str(target), data=[str(d) for d in data], out=str(out), **{**SMALL, **kw})


def test_end_to_end(tiny_target, train_npz, eval_npz, tmp_path):
    out = tmp_path / "draft"
    draft = DraftOptions(num_layers=1)  # random init: the target's tensors would start the loss near zero
    result = distill(_cfg(tiny_target, [train_npz], out, draft=draft, steps=30, lr=3e-3, eval_data=str(eval_npz)))
    assert np.mean(result.losses[-5:]) < np.mean(result.losses[:5])

    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["steps"] == 30 and manifest["tokens_seen"] > 0
    assert 0.0 <= manifest["eval"]["accuracy"] <= 1.0 and manifest["eval"]["tokens"] > 0
    assert manifest["draft_config"]["num_hidden_layers"] == 1 and manifest["draft_config"]["vocab_size"] == VOCAB
    assert not list(tmp_path.glob("draft.tmp-*"))  # the build directory was renamed into place

    hf = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert hf.config.num_hidden_layers == 1

    from specdecode.llm import LLM
    from specdecode.models.llama import load_llama

    assert load_llama(out, "cpu", torch.float32).cfg.vocab_size == VOCAB
    prompt = [5, 17, 40, 3, 77, 12]
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    plain = LLM(target=str(tiny_target), method="none").generate([prompt], greedy)[0].token_ids
    spec = LLM(target=str(tiny_target), draft=str(out), method="draft", num_speculative_tokens=3)
    assert spec.generate([prompt], greedy)[0].token_ids == plain


def test_init_from_target_copies_matching_tensors(tiny_target, train_npz, tmp_path):
    out = tmp_path / "draft"
    draft = DraftOptions(num_layers=1, init_from_target=True, freeze_embeddings=True)
    distill(_cfg(tiny_target, [train_npz], out, draft=draft, steps=2))
    student, target = load_file(out / "model.safetensors"), load_file(next(tiny_target.glob("*.safetensors")))
    name = "model.embed_tokens.weight"
    assert torch.equal(student[name], target[name])  # frozen, so still the target's


def test_resume_matches_uninterrupted_run(tiny_target, train_npz, tmp_path, monkeypatch):
    draft = DraftOptions(num_layers=1)
    straight = distill(_cfg(tiny_target, [train_npz], tmp_path / "a", draft=draft, steps=10, save_every=100)).out

    with crash_after_checkpoint(monkeypatch):  # as if the process died right after the step-5 checkpoint
        distill(_cfg(tiny_target, [train_npz], tmp_path / "b", draft=draft, steps=10, save_every=5))
    assert not (tmp_path / "b" / "model.safetensors").exists()
    resumed = distill(_cfg(tiny_target, [train_npz], tmp_path / "b", draft=draft, steps=10, save_every=5, resume=True))

    assert resumed.manifest["tokens_seen"] == json.loads((straight / "manifest.json").read_text())["tokens_seen"]
    a, b = load_file(straight / "model.safetensors"), load_file(resumed.out / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-6), k
    # negative control: one step fewer is visibly different, so the comparison can fail
    short = distill(_cfg(tiny_target, [train_npz], tmp_path / "c", draft=draft, steps=9, save_every=100))
    assert not torch.allclose(load_file(short.out / "model.safetensors")["lm_head.weight"], a["lm_head.weight"])


def test_bad_token_id_writes_nothing(tiny_target, tmp_path):
    bad = write_npz(tmp_path / "bad.npz", bad_id=VOCAB)
    out = tmp_path / "draft"
    with pytest.raises(ConfigError, match=f"bad.npz: token id {VOCAB}"):
        distill(_cfg(tiny_target, [bad], out, steps=2))
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["bad.npz"]


def test_existing_output_needs_overwrite(tiny_target, train_npz, tmp_path):
    out = tmp_path / "draft"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(ConfigError, match="already exists.*--overwrite"):
        distill(_cfg(tiny_target, [train_npz], out, steps=2))
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    with pytest.raises(ConfigError, match="no checkpoint"):
        distill(_cfg(tiny_target, [train_npz], out, steps=2, resume=True))
    distill(_cfg(tiny_target, [train_npz], out, steps=2, overwrite=True, draft=DraftOptions(num_layers=1)))
    assert (out / "model.safetensors").exists() and not (out / "keep.txt").exists()


def test_cli_missing_data_file_is_one_line(tiny_target, tmp_path, capsys):
    argv = ["distill", "--target", str(tiny_target), "--data", str(tmp_path / "nope.npz"), "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "data file not found" in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_resume_with_other_architecture_is_refused(tiny_target, train_npz, tmp_path):
    out = tmp_path / "draft"
    distill(_cfg(tiny_target, [train_npz], out, steps=2, save_every=2, draft=DraftOptions(num_layers=1)))
    with pytest.raises(ConfigError, match="different draft configuration"):
        distill(_cfg(tiny_target, [train_npz], out, steps=4, resume=True, draft=DraftOptions(num_layers=2)))
    assert (out / "model.safetensors").exists()  # the finished draft is untouched


def test_init_draft_starts_from_a_trained_draft(tiny_target, train_npz, tmp_path):
    """--init-draft starts from a trained draft, so its first steps' loss is far below a cold start's (its
    control: the same run without it); a draft of another shape is refused with one line."""
    draft = DraftOptions(num_layers=1)
    first = distill(_cfg(tiny_target, [train_npz], tmp_path / "a", draft=draft, steps=30, lr=3e-3))
    again = dict(draft=draft, steps=3, lr=1e-4)
    warm = distill(_cfg(tiny_target, [train_npz], tmp_path / "b", init_draft=str(first.out), **again))
    cold = distill(_cfg(tiny_target, [train_npz], tmp_path / "c", **again))
    assert np.mean(warm.losses) < 0.7 * np.mean(cold.losses), (np.mean(warm.losses), np.mean(cold.losses))
    assert warm.manifest["init_draft"] == str(first.out.resolve())
    with pytest.raises(ConfigError, match="--init-draft .* is a different draft"):
        distill(_cfg(tiny_target, [train_npz], tmp_path / "d", init_draft=str(first.out), steps=1))
