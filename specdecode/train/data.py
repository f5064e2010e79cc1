"""Distillation data: npz files of prompt + target response, cut into fixed-length training windows.

Each sample is cropped into windows of `seq_len` tokens that overlap by one token, so every next-token
transition of a long sample lands in exactly one window; short samples are right-padded (padding sits after
every real token, so under causal attention it changes nothing and is masked out of the loss). Windows never
mix samples: the draft sees one conversation at a time at inference, and so does it here.

With `pack` a batch's windows are laid out first-fit-decreasing into as few rows of `seq_len` as hold them (a
short window shares a row with others), each restarting its positions at 0 and attending only to itself:
every window sees exactly what it would see alone, so the loss is the padded layout's, with less padding to
compute (on the distillation data ~0.7 of a padded batch is real tokens, ~0.85 packed).

Batch order is a pure function of (seed, step): resuming at step s draws exactly the batches an uninterrupted
run would have drawn, with no iterator state to save.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specdecode.config import ConfigError

REQUIRED_ARRAYS = ("tokens", "offsets", "prompt_len", "response_len")
PAD_ID = 0  # any valid id works: padded positions are excluded from the loss and sit after all real tokens


@dataclass(frozen=True)
class Samples:
    """All samples of one or more files, concatenated. Sample i is tokens[offsets[i]:offsets[i+1]]."""

    tokens: np.ndarray  # [total_tokens] int64
    offsets: np.ndarray  # [num_samples + 1] int64
    prompt_len: np.ndarray  # [num_samples] int64

    @property
    def num_samples(self) -> int:
        return len(self.prompt_len)

    def responses(self) -> list[np.ndarray]:
        """Each sample's response tokens: what follows its prompt."""
        starts = self.offsets[:-1] + self.prompt_len
        return [self.tokens[s:e] for s, e in zip(starts.tolist(), self.offsets[1:].tolist(), strict=True)]


@dataclass(frozen=True)
class Batch:
    input_ids: np.ndarray  # [batch, seq_len] int64
    loss_mask: np.ndarray  # [batch, seq_len] bool: True where the NEXT token is a response token
    labels: np.ndarray  # [batch, seq_len] int64: the data's next token (PAD_ID where loss_mask is False)
    num_tokens: int  # real (unpadded) input tokens
    window_ids: np.ndarray | None = None  # [num_windows] rows of window_starts, in row-major layout order
    position_ids: np.ndarray | None = None  # [batch, seq_len] int64 when a row holds several windows: 0 at each start
    row_lengths: np.ndarray | None = None  # [batch] int64 real tokens in each row

    def segments(self) -> np.ndarray | None:
        """[batch, seq_len] which window of its row each position belongs to (None: one window a row)."""
        return None if self.position_ids is None else np.cumsum(self.position_ids == 0, axis=1)

    def real(self) -> np.ndarray:
        """[batch, seq_len] bool: the position holds a window's token, not padding (padding ends each row)."""
        return np.arange(self.input_ids.shape[1])[None, :] < self.row_lengths[:, None]


def _check_file(path: Path, data, vocab_size: int) -> None:
    missing = [k for k in REQUIRED_ARRAYS if k not in data]
    if missing:
        raise ConfigError(f"{path}: missing array(s) {', '.join(missing)}; expected {', '.join(REQUIRED_ARRAYS)}")
    tokens, offsets = data["tokens"], data["offsets"]
    n = len(offsets) - 1
    if n < 1 or offsets[0] != 0 or offsets[-1] != len(tokens) or np.any(np.diff(offsets) < 0):
        raise ConfigError(f"{path}: offsets must rise from 0 to len(tokens)={len(tokens)}")
    if len(data["prompt_len"]) != n or len(data["response_len"]) != n:
        raise ConfigError(f"{path}: prompt_len and response_len must have one entry per sample ({n})")
    if np.any(data["prompt_len"] + data["response_len"] != np.diff(offsets)):
        raise ConfigError(f"{path}: prompt_len + response_len differs from the sample lengths given by offsets")
    if len(tokens) and int(tokens.max()) >= vocab_size:
        bad = int(tokens.max())
        raise ConfigError(f"{path}: token id {bad} is outside the target's vocabulary (size {vocab_size})")


def load_samples(paths: list[str | Path], vocab_size: int) -> Samples:
    """Read and validate every file before returning; any problem is a ConfigError naming the file."""
    tokens, offsets, prompt_len, base = [], [np.zeros(1, np.int64)], [], 0
    for p in map(Path, paths):
        if not p.is_file():
            raise ConfigError(f"data file not found: {p}")
        try:
            data = np.load(p)
        except (OSError, ValueError) as e:
            raise ConfigError(f"{p}: not a readable .npz file ({e})") from None
        with data:
            _check_file(p, data, vocab_size)
            tokens.append(data["tokens"].astype(np.int64))
            offsets.append(data["offsets"][1:].astype(np.int64) + base)
            prompt_len.append(data["prompt_len"].astype(np.int64))
        base += len(tokens[-1])
    if not tokens:
        raise ConfigError("no data files given")
    return Samples(np.concatenate(tokens), np.concatenate(offsets), np.concatenate(prompt_len))


def window_starts(samples: Samples, seq_len: int) -> np.ndarray:
    """[num_windows, 2] (sample index, start offset in the sample) of every window holding a loss position."""
    if seq_len < 2:
        raise ConfigError(f"seq_len must be >= 2, got {seq_len}")
    rows = []
    lengths = np.diff(samples.offsets)
    for i, (n, p) in enumerate(zip(lengths.tolist(), samples.prompt_len.tolist(), strict=True)):
        # windows step by seq_len - 1 so the last token of one window is the first of the next
        for start in range(0, n - 1, seq_len - 1):
            if min(start + seq_len - 1, n - 1) >= p:  # some next token in the window is a response token
                rows.append((i, start))
    if not rows:
        raise ConfigError("the data holds no response tokens to train on")
    return np.asarray(rows, dtype=np.int64)


def make_batch(
    samples: Samples, windows: np.ndarray, seq_len: int, window_ids: np.ndarray | None = None, pack: bool = False
) -> Batch:
    """Materialize the windows ([num_windows, 2]) into arrays, one a row padded at the end, or with `pack` as few
    rows as hold them; `window_ids` ([num_windows]) says which rows of window_starts they are."""
    chunks = [_chunk(samples, i, start, seq_len) for i, start in windows.tolist()]
    rows = _first_fit([len(c) for c in chunks], seq_len) if pack else [[w] for w in range(len(chunks))]
    b = len(rows)
    input_ids = np.full((b, seq_len), PAD_ID, np.int64)  # [batch, seq_len]
    labels = np.full((b, seq_len), PAD_ID, np.int64)  # [batch, seq_len]
    loss_mask = np.zeros((b, seq_len), bool)  # [batch, seq_len]
    positions = np.zeros((b, seq_len), np.int64)  # [batch, seq_len] restarting at 0 at each window
    for row, members in enumerate(rows):
        at = 0
        for w in members:
            (i, start), chunk = windows[w], chunks[w]
            n = len(chunk)
            input_ids[row, at : at + n] = chunk
            labels[row, at : at + n - 1] = chunk[1:]
            next_pos = np.arange(start + 1, start + n)  # position in the sample of each next token
            loss_mask[row, at : at + n - 1] = next_pos >= samples.prompt_len[i]
            positions[row, at:] = np.arange(seq_len - at)  # padding continues the row's last window
            at += n
    labels[~loss_mask] = PAD_ID
    order = np.asarray([w for members in rows for w in members], np.int64)  # [num_windows] layout order
    ids = None if window_ids is None else np.asarray(window_ids)[order]
    shared = any(len(members) > 1 for members in rows)  # else every row is one window: plain causal attention
    lengths = np.asarray([len(c) for c in chunks], np.int64)  # [num_windows] in the draw's order
    row_lengths = np.asarray([lengths[m].sum() for m in rows], np.int64)  # [batch]
    num_tokens = int(lengths.sum())
    return Batch(input_ids, loss_mask, labels, num_tokens, ids, positions if shared else None, row_lengths)


def _chunk(samples: Samples, i: int, start: int, seq_len: int) -> np.ndarray:
    """[<= seq_len] the window of sample i from `start`."""
    return samples.tokens[samples.offsets[i] : samples.offsets[i + 1]][start : start + seq_len]


def _first_fit(lengths: list[int], seq_len: int) -> list[list[int]]:
    """Window indices per row, longest first into the first row with room (first-fit decreasing)."""
    rows: list[list[int]] = []
    room: list[int] = []
    for w in sorted(range(len(lengths)), key=lambda w: -lengths[w]):  # stable: ties keep the draw's order
        row = next((r for r, free in enumerate(room) if free >= lengths[w]), None)
        if row is None:
            rows.append([])
            room.append(seq_len)
            row = len(rows) - 1
        rows[row].append(w)
        room[row] -= lengths[w]
    return rows


def batch_windows(num_windows: int, batch_size: int, step: int, seed: int) -> np.ndarray:
    """[batch_size] window indices of training step `step` (0-based): epochs of seeded permutations."""
    flat = np.arange(step * batch_size, (step + 1) * batch_size)  # position in the endless stream
    out = np.empty(batch_size, np.int64)
    for epoch in np.unique(flat // num_windows).tolist():
        perm = np.random.default_rng([seed, epoch]).permutation(num_windows)
        sel = flat // num_windows == epoch
        out[sel] = perm[flat[sel] % num_windows]
    return out


def batches(
    samples: Samples,
    windows: np.ndarray,
    seq_len: int,
    batch_size: int,
    seed: int,
    start_step: int = 0,
    pack: bool = False,
) -> Iterator[Batch]:
    """The endless stream of training batches from `start_step` on: batch_size windows each, packed or not."""
    step = start_step
    while True:
        ids = batch_windows(len(windows), batch_size, step, seed)  # [batch_size]
        yield make_batch(samples, windows[ids], seq_len, ids, pack)
        step += 1


def eval_batches(samples: Samples, windows: np.ndarray, seq_len: int, batch_size: int) -> Iterator[Batch]:
    """Every window once, in order."""
    for lo in range(0, len(windows), batch_size):
        hi = min(lo + batch_size, len(windows))
        yield make_batch(samples, windows[lo:hi], seq_len, np.arange(lo, hi))
