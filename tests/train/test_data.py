"""Windows, masks and batch order of the distillation data."""

from __future__ import annotations

import numpy as np
import pytest

from specdecode.config import ConfigError
from specdecode.train import data as D
from tests.train.conftest import VOCAB, write_npz


def _samples(lengths_prompt: list[tuple[int, int]]) -> D.Samples:
    seqs = [np.arange(n) + 10 for n, _ in lengths_prompt]
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in seqs])])
    return D.Samples(np.concatenate(seqs), offsets, np.asarray([p for _, p in lengths_prompt]))


def test_mask_marks_positions_whose_next_token_is_response():
    s = _samples([(6, 3)])  # tokens 10..15, response = 13, 14, 15
    b = D.make_batch(s, D.window_starts(s, 8), 8)
    assert b.input_ids[0].tolist() == [10, 11, 12, 13, 14, 15, D.PAD_ID, D.PAD_ID]
    assert b.loss_mask[0].tolist() == [False, False, True, True, True, False, False, False]
    assert b.labels[0][b.loss_mask[0]].tolist() == [13, 14, 15]


def test_long_samples_cover_every_transition_once():
    s = _samples([(20, 4)])
    windows = D.window_starts(s, 6)
    b = D.make_batch(s, windows, 6)
    labels = sorted(b.labels[b.loss_mask].tolist())
    assert labels == list(range(14, 30))  # every response token predicted exactly once


def test_prompt_only_windows_are_skipped():
    s = _samples([(20, 15)])
    starts = D.window_starts(s, 6)[:, 1].tolist()
    assert starts == [10, 15]  # windows 0 and 5 only predict prompt tokens


def test_batch_order_is_a_function_of_seed_and_step():
    a = [D.batch_windows(10, 4, step, seed=3).tolist() for step in range(6)]
    assert a == [D.batch_windows(10, 4, step, seed=3).tolist() for step in range(6)]
    assert a != [D.batch_windows(10, 4, step, seed=4).tolist() for step in range(6)]
    first_epoch = sorted(sum(a[:2], []) + a[2][:2])
    assert first_epoch == list(range(10))  # an epoch visits every window once


def test_bad_token_id_names_file_and_id(tmp_path):
    path = write_npz(tmp_path / "bad.npz", bad_id=VOCAB + 4)
    with pytest.raises(ConfigError, match=rf"bad\.npz.*token id {VOCAB + 4}.*vocabulary"):
        D.load_samples([path], VOCAB)


def test_missing_arrays_and_bad_offsets(tmp_path):
    np.savez(tmp_path / "a.npz", tokens=np.arange(5, dtype=np.uint16))
    with pytest.raises(ConfigError, match="missing array"):
        D.load_samples([tmp_path / "a.npz"], VOCAB)
    np.savez(tmp_path / "b.npz", tokens=np.arange(5), offsets=[0, 7], prompt_len=[2], response_len=[3])
    with pytest.raises(ConfigError, match="offsets"):
        D.load_samples([tmp_path / "b.npz"], VOCAB)
    with pytest.raises(ConfigError, match="not found"):
        D.load_samples([tmp_path / "missing.npz"], VOCAB)
