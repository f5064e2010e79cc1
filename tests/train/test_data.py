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


def test_packed_batch_holds_the_same_windows_in_fewer_rows():
    """Short windows share rows (longest first); each keeps its tokens, labels and loss mask, its positions
    restart at 0, and window_ids list the windows in row-major order, as the teacher cache reads them."""
    s = _samples([(6, 2), (3, 1), (8, 4), (2, 1), (5, 1)])  # one window each
    windows, ids = D.window_starts(s, 8), np.array([10, 11, 12, 13, 14])
    padded, packed = D.make_batch(s, windows, 8, ids), D.make_batch(s, windows, 8, ids, pack=True)
    assert padded.position_ids is None and len(padded.input_ids) == 5
    assert len(packed.input_ids) == 3 and packed.num_tokens == padded.num_tokens == 24
    assert packed.window_ids.tolist() == [12, 10, 13, 14, 11]  # rows of lengths [8], [6, 2], [5, 3]
    assert packed.position_ids[1].tolist() == [0, 1, 2, 3, 4, 5, 0, 1]
    assert packed.segments()[1].tolist() == [1, 1, 1, 1, 1, 1, 2, 2]
    by_window = {w: padded.labels[r][padded.loss_mask[r]].tolist() for r, w in enumerate(ids)}
    want = sum((by_window[w] for w in packed.window_ids), [])
    assert packed.labels[packed.loss_mask].tolist() == want  # row-major order = window_ids order


def test_full_windows_are_not_packed():
    s = _samples([(8, 2), (9, 2)])
    windows = D.window_starts(s, 8)[[0, 2]]  # two full windows: nothing can share a row
    b = D.make_batch(s, windows, 8, np.array([0, 2]), pack=True)
    assert b.position_ids is None and len(b.input_ids) == 2
