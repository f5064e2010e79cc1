"""Tokenizers parsed once per set of files (models/tokenizer_files.py): each caller owns its copy, and a changed
file is read again."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from specdecode.models import tokenizer_files

CHAT = [{"role": "user", "content": "hi"}]


@pytest.fixture
def parses(monkeypatch) -> list[Path]:
    """The directories AutoTokenizer really parsed during a test, from an empty memo."""
    monkeypatch.setattr(tokenizer_files, "_kept", type(tokenizer_files._kept)())
    calls: list[Path] = []
    real = AutoTokenizer.from_pretrained

    def counted(path, *args, **kwargs):
        calls.append(Path(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(tokenizer_files.AutoTokenizer, "from_pretrained", counted)
    return calls


def tokenizer_dir(smollm2_dir: Path, dest: Path) -> Path:
    """A copy of SmolLM2's directory without its weights, and a config.json of other sizes (a tiny model's)."""
    dest.mkdir()
    for f in smollm2_dir.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, dest / f.name)
    config = json.loads((dest / "config.json").read_text())
    (dest / "config.json").write_text(json.dumps(config | {"num_hidden_layers": 2}))
    return dest


def test_one_parse_for_the_same_files_and_each_caller_owns_its_copy(smollm2_dir, tmp_path, parses):
    other = tokenizer_dir(smollm2_dir, tmp_path / "tiny")
    a, b = tokenizer_files.load_tokenizer(smollm2_dir), tokenizer_files.load_tokenizer(other)
    assert parses == [smollm2_dir]  # the other directory's files are the same (its config's sizes aside)
    assert a is not b and a.encode("hello world") == b.encode("hello world")
    a.add_tokens(["<only_a>"])
    assert "<only_a>" not in b.get_vocab() and "<only_a>" not in tokenizer_files.load_tokenizer(other).get_vocab()


def test_a_changed_file_is_read_again(smollm2_dir, tmp_path, parses):
    """Negative control inside: a key that names the directory alone serves the stale template."""
    path = tokenizer_dir(smollm2_dir, tmp_path / "t")
    before = tokenizer_files.load_tokenizer(path).apply_chat_template(CHAT, tokenize=False)
    (path / "chat_template.jinja").write_text("{% for m in messages %}<<{{ m['content'] }}>>{% endfor %}")
    assert tokenizer_files.load_tokenizer(path).apply_chat_template(CHAT, tokenize=False) == "<<hi>>" != before
    assert len(parses) == 2


def test_control_a_key_blind_to_the_content_serves_stale_files(smollm2_dir, tmp_path, parses, monkeypatch):
    monkeypatch.setattr(tokenizer_files, "files_key", lambda model_dir: str(model_dir))
    path = tokenizer_dir(smollm2_dir, tmp_path / "t")
    before = tokenizer_files.load_tokenizer(path).apply_chat_template(CHAT, tokenize=False)
    (path / "chat_template.jinja").write_text("{% for m in messages %}<<{{ m['content'] }}>>{% endfor %}")
    assert tokenizer_files.load_tokenizer(path).apply_chat_template(CHAT, tokenize=False) == before  # stale


def test_at_most_kept_tokenizers_stay(smollm2_dir, tmp_path, parses, monkeypatch):
    monkeypatch.setattr(tokenizer_files, "KEPT", 2)
    dirs = []
    for i in range(tokenizer_files.KEPT + 1):
        path = tokenizer_dir(smollm2_dir, tmp_path / f"t{i}")
        (path / "chat_template.jinja").write_text(f"template {i}")
        dirs.append(path)
        tokenizer_files.vocabulary(path)
    assert len(tokenizer_files._kept) == tokenizer_files.KEPT
    tokenizer_files.vocabulary(dirs[-1])  # kept: not parsed again
    tokenizer_files.vocabulary(dirs[0])  # the least recently used was dropped
    assert parses == [*dirs, dirs[0]]
