"""Synthetic distillation data for the tiny target (vocab 96): structured prompt + response token sequences."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from specdecode.train import loop as loop_mod

VOCAB = 96


class Interrupted(Exception):
    """A training run 'dying' at a chosen point (crash_after_checkpoint, or a test's own fault)."""


@contextmanager
def crash_after_checkpoint(monkeypatch) -> Iterator[None]:
    """Inside the block, the training loop raises Interrupted right after its first checkpoint is saved, as if
    the process died there; the block must end that way, and saving is restored after it."""
    real_save = loop_mod.save_checkpoint

    def save_then_crash(*args, **kwargs):
        real_save(*args, **kwargs)
        raise Interrupted

    monkeypatch.setattr(loop_mod, "save_checkpoint", save_then_crash)
    try:
        with pytest.raises(Interrupted):
            yield
    finally:
        monkeypatch.setattr(loop_mod, "save_checkpoint", real_save)


def write_npz(path: Path, num_samples: int = 40, seed: int = 0, bad_id: int | None = None) -> Path:
    """Random prompts (ids 3..95) followed by a response that walks a fixed stride, so it is learnable."""
    rng = np.random.default_rng(seed)
    seqs, prompt_len, response_len = [], [], []
    for _ in range(num_samples):
        p, r = int(rng.integers(6, 14)), int(rng.integers(10, 22))
        prompt = rng.integers(3, VOCAB, p)
        response = 3 + (prompt[-1] + 7 * np.arange(1, r + 1)) % (VOCAB - 3)
        seqs.append(np.concatenate([prompt, response]))
        prompt_len.append(p)
        response_len.append(r)
    tokens = np.concatenate(seqs).astype(np.uint16)
    if bad_id is not None:
        tokens[5] = bad_id
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in seqs])]).astype(np.int64)
    np.savez(
        path,
        tokens=tokens,
        offsets=offsets,
        prompt_len=np.asarray(prompt_len),
        response_len=np.asarray(response_len),
        sampled=np.zeros(num_samples, np.int8),
        prompt_index=np.arange(num_samples),
    )
    return path


@pytest.fixture
def train_npz(tmp_path) -> Path:
    return write_npz(tmp_path / "train.npz")


@pytest.fixture
def eval_npz(tmp_path) -> Path:
    return write_npz(tmp_path / "eval.npz", num_samples=8, seed=1)
