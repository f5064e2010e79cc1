"""Packing a draft for shipping (without the embedding it shares with its target) and rebuilding it: the
rebuilt directory loads in specdecode and transformers and computes what the draft computed."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from specdecode.config import ConfigError
from specdecode.models import loader, shipped_draft
from specdecode.models.shipped_draft import PACKED_WEIGHTS, pack_draft
from specdecode.train.distill import DistillConfig, distill
from specdecode.train.draft_config import DraftOptions
from tests.tiny import write_tiny_model

SMALL = dict(batch_size=4, seq_len=24, warmup=3, progress=False, steps=3)


@pytest.fixture(scope="module")
def tied_target(tmp_path_factory, smollm2_tokenizer):
    path = write_tiny_model(tmp_path_factory.mktemp("tied"), tie_word_embeddings=True)
    smollm2_tokenizer.save_pretrained(path)
    return path


def _distill(target, data, out, freeze: bool):
    draft = DraftOptions(num_layers=1, init_from_target=True, freeze_embeddings=freeze, vocab_subset=30)
    return distill(DistillConfig(str(target), [str(data)], str(out), draft=draft, **SMALL)).out


def test_pack_then_rebuild_gives_the_draft_back(tied_target, train_npz, tmp_path, monkeypatch):
    src = _distill(tied_target, train_npz, tmp_path / "draft", freeze=True)
    packed = pack_draft(src, tmp_path / "assets" / "tiny-draft", tied_target)
    names = {p.name for p in packed.iterdir()}
    assert names == {PACKED_WEIGHTS, "config.json", "vocab.npy", "manifest.json"}
    assert json.loads((packed / "manifest.json").read_text())["packed"]["dtype"] == "bfloat16"
    assert (packed / PACKED_WEIGHTS).stat().st_size < (src / "model.safetensors").stat().st_size / 2

    monkeypatch.setattr(shipped_draft, "DRAFT_ASSETS", tmp_path / "assets")
    monkeypatch.setitem(loader.BUILTIN_DRAFTS, "tiny-draft", str(tied_target))
    rebuilt = loader.resolve_model_dir("tiny-draft", cache_dir=tmp_path / "cache")
    assert loader.resolve_model_dir("tiny-draft", cache_dir=tmp_path / "cache") == rebuilt  # built once
    assert (rebuilt / "vocab.npy").is_file() and (rebuilt / "tokenizer.json").is_file()

    ids = torch.tensor([[5, 17, 40, 3, 77, 12]])
    original = transformers.AutoModelForCausalLM.from_pretrained(src).eval()
    again = transformers.AutoModelForCausalLM.from_pretrained(rebuilt).eval()
    with torch.no_grad():
        a, b = original(ids).logits, again(ids).logits  # [1, 6, vocab]
    assert torch.allclose(a, b, atol=0.05 * a.abs().max().item())  # bf16 storage of the layers
    assert torch.equal(a.argmax(-1), b.argmax(-1))


def test_a_draft_that_trained_its_embedding_is_refused(tied_target, train_npz, tmp_path):
    src = _distill(tied_target, train_npz, tmp_path / "draft", freeze=False)
    with pytest.raises(ConfigError, match="embedding differs"):
        pack_draft(src, tmp_path / "packed", tied_target)
    assert not (tmp_path / "packed").exists()
