"""Distillation data: npz files of prompt + target response, cut into fixed-length training windows.

Each sample is cropped into windows of `seq_len` tokens that overlap by one token, so every next-token
transition of a long sample lands in exactly one window; short samples are right-padded (padding sits after
every real token, so under causal attention it changes nothing and is masked out of the loss). Windows never
mix samples: the draft sees one conversation at a time at inference, and so does it here.

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
    window_ids: np.ndarray | None = None  # [batch] rows of window_starts (what the teacher cache is indexed by)


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


def make_batch(samples: Samples, windows: np.ndarray, seq_len: int, window_ids: np.ndarray | None = None) -> Batch:
    """Materialize the rows `windows` ([batch, 2]) into padded arrays; `window_ids` ([batch]) says which rows of
    window_starts they are."""
    b = len(windows)
    input_ids = np.full((b, seq_len), PAD_ID, np.int64)  # [batch, seq_len]
    labels = np.full((b, seq_len), PAD_ID, np.int64)  # [batch, seq_len]
    loss_mask = np.zeros((b, seq_len), bool)  # [batch, seq_len]
    num_tokens = 0
    for row, (i, start) in enumerate(windows.tolist()):
        lo = samples.offsets[i]
        sample = samples.tokens[lo : samples.offsets[i + 1]]
        chunk = sample[start : start + seq_len]
        input_ids[row, : len(chunk)] = chunk
        num_tokens += len(chunk)
        labels[row, : len(chunk) - 1] = chunk[1:]
        next_pos = np.arange(start + 1, start + len(chunk))  # position in the sample of each next token
        loss_mask[row, : len(chunk) - 1] = next_pos >= samples.prompt_len[i]
    labels[~loss_mask] = PAD_ID
    return Batch(input_ids, loss_mask, labels, num_tokens, window_ids)


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
    samples: Samples, windows: np.ndarray, seq_len: int, batch_size: int, seed: int, start_step: int = 0
) -> Iterator[Batch]:
    """The endless stream of training batches from `start_step` on."""
    step = start_step
    while True:
        ids = batch_windows(len(windows), batch_size, step, seed)  # [batch_size]
        yield make_batch(samples, windows[ids], seq_len, ids)
        step += 1


def eval_batches(samples: Samples, windows: np.ndarray, seq_len: int, batch_size: int) -> Iterator[Batch]:
    """Every window once, in order."""
    for lo in range(0, len(windows), batch_size):
        hi = min(lo + batch_size, len(windows))
        yield make_batch(samples, windows[lo:hi], seq_len, np.arange(lo, hi))
