"""`specdecode distill vocab`: a draft's drafting vocabulary from token counts over a corpus, and where the engine
finds the vocabulary a draft drafts from (beside it, shipped for a built-in draft, a path, or the whole)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from specdecode.cli import main
from specdecode.config import ConfigError
from specdecode.drafters.draft_model import drafting_vocabulary
from specdecode.drafters.subset_head import VOCAB_FILE
from specdecode.models.shipped_draft import DRAFT_ASSETS
from specdecode.train import draft_vocab as dv


def test_top_tokens_keeps_the_always_ids_then_the_most_frequent_ties_to_the_lower_id():
    counts = np.array([0, 5, 9, 5, 0, 1, 0, 7])
    assert dv.top_tokens(counts, 3, always=[]).tolist() == [1, 2, 7]  # 9, 7, then the 5 at id 1 (before id 3)
    assert dv.top_tokens(counts, 3, always=[6]).tolist() == [2, 6, 7]  # 6 unseen, kept; 5s lose their place
    assert dv.top_tokens(counts, 6, always=[]).tolist() == [0, 1, 2, 3, 5, 7]  # the unseen tie: lowest id, 0
    with pytest.raises(ConfigError, match="--size must be in 1..8"):
        dv.top_tokens(counts, 9, always=[])


class CharTokenizer:
    """One token per character (its code point mod 50): counts anyone can check by hand."""

    def __call__(self, texts: list[str]) -> dict:
        return {"input_ids": [[ord(c) % 50 for c in t] for t in texts]}


def test_count_tokens_counts_every_text_across_batches():
    texts = [f"text {i}" for i in range(dv.BATCH * 2 + 7)]  # two full batches and a partial one
    counts = dv.count_tokens(CharTokenizer(), texts, 50, "test")
    want = np.bincount([ord(c) % 50 for t in texts for c in t], minlength=50)
    assert counts.tolist() == want.tolist() and counts.sum() == sum(map(len, texts))


def test_text_files_leave_out_tests_and_installed_packages(tmp_path):
    for rel in ("a.py", "pkg/b.c", "pkg/tests/c.py", "test/d.py", "site-packages/e.py", "pkg/f.bin", "g.md"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x")
    got = [p.relative_to(tmp_path).as_posix() for p in dv.text_files([str(tmp_path)])]
    assert got == ["a.py", "g.md", "pkg/b.c"]
    with pytest.raises(ConfigError, match="no such file or directory"):
        dv.text_files([str(tmp_path / "missing")])


def test_the_command_writes_a_vocabulary_of_the_drafts_tokenizer(tmp_path, smollm2_tokenizer, capsys):
    """On SmolLM2's tokenizer: `size` distinct sorted ids, the special ones among them, and the corpus's words."""
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "a.py").write_text("def add(a, b):\n    return a + b\n" * 20)
    out = tmp_path / "vocab.npy"
    args = ["distill", "vocab", "--draft", "smollm2-135m-instruct", "--size", "40", "--texts", str(tmp_path / "code")]
    assert main([*args, "--out", str(out)]) == 0
    vocab = np.load(out)
    assert len(vocab) == 40 and (np.diff(vocab) > 0).all()
    assert set(smollm2_tokenizer.all_special_ids) <= set(vocab.tolist())
    assert set(smollm2_tokenizer.encode("def add(a, b):\n    return a + b\n")) <= set(vocab.tolist())
    assert "40 of 49152 tokens written" in capsys.readouterr().out


def test_the_command_refuses_bad_input_in_one_line(tmp_path, capsys):
    base = ["distill", "vocab", "--draft", "smollm2-135m-instruct", "--out", str(tmp_path / "v.npy")]
    assert main(base) == 2
    assert main([*base, "--responses", str(tmp_path / "v.npy")]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("specdecode:")]  # no bars
    assert err[0] == "specdecode: error: give --texts and/or --responses to count tokens over"
    assert err[1].startswith(f"specdecode: error: --responses {tmp_path / 'v.npy'}: not a distillation file")
    assert len(err) == 2


def test_drafting_vocabulary_beside_the_draft_shipped_a_path_or_full(tmp_path):
    np.save(tmp_path / "mine.npy", np.arange(4))
    assert drafting_vocabulary("d", tmp_path, "full") is None
    assert drafting_vocabulary("d", tmp_path, None) is None  # nothing beside it, nothing shipped
    assert drafting_vocabulary("d", tmp_path, str(tmp_path / "mine.npy")) == tmp_path / "mine.npy"
    with pytest.raises(ConfigError, match="no such file"):
        drafting_vocabulary("d", tmp_path, str(tmp_path / "absent.npy"))
    np.save(tmp_path / VOCAB_FILE, np.arange(4))
    assert drafting_vocabulary("d", tmp_path, None) == tmp_path / VOCAB_FILE
    shipped = "qwen2.5-coder-0.5b-instruct"
    assert drafting_vocabulary(shipped, tmp_path / "elsewhere", None) == DRAFT_ASSETS / f"{shipped}.{VOCAB_FILE}"


def test_the_shipped_vocabulary_of_the_05b_draft():
    """32,768 distinct sorted ids of the 0.5B's 151,936, Qwen's chat and end tokens among them."""
    vocab = np.load(Path(DRAFT_ASSETS) / f"qwen2.5-coder-0.5b-instruct.{VOCAB_FILE}")
    assert len(vocab) == 32768 and (np.diff(vocab) > 0).all() and 0 <= vocab.min() and vocab.max() < 151936
    assert {151643, 151644, 151645} <= set(vocab.tolist())  # <|endoftext|>, <|im_start|>, <|im_end|>
