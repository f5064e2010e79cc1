"""Generated distillation samples, keyed by prompt index, saved atomically as the training data's .npz format.

The same format serves the partial file of an interrupted run: `prompt_index` says which prompts are done,
`skipped` which were passed over (too long), and `settings` the generation settings that a resumed run must match.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from specdecode.config import ConfigError

TOKEN_DTYPE = np.uint16
MAX_VOCAB = int(np.iinfo(TOKEN_DTYPE).max) + 1  # 65,536 ids fit uint16


@dataclass(frozen=True)
class Sample:
    prompt_ids: list[int]  # chat-formatted prompt
    response_ids: list[int]  # the target's response, ending in EOS unless cut at max_tokens
    sampled: bool


@dataclass
class Responses:
    settings: str  # JSON of the settings that determine the samples
    samples: dict[int, Sample] = field(default_factory=dict)  # prompt index -> sample
    skipped: set[int] = field(default_factory=set)  # prompt indices passed over

    def done(self) -> set[int]:
        return set(self.samples) | self.skipped

    def keep_below(self, num_prompts: int) -> None:
        self.samples = {i: s for i, s in self.samples.items() if i < num_prompts}
        self.skipped = {i for i in self.skipped if i < num_prompts}

    def arrays(self) -> dict[str, np.ndarray]:
        order = sorted(self.samples)
        seqs = [self.samples[i].prompt_ids + self.samples[i].response_ids for i in order]
        lengths = np.asarray([len(s) for s in seqs], np.int64)  # [num_samples]
        flat = [t for s in seqs for t in s]
        if flat and (min(flat) < 0 or max(flat) >= MAX_VOCAB):
            raise ConfigError(f"token ids must lie in [0, {MAX_VOCAB}) to be stored as uint16")
        return {
            "tokens": np.asarray(flat, TOKEN_DTYPE),  # [total_tokens]
            "offsets": np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),  # [num_samples + 1]
            "prompt_len": np.asarray([len(self.samples[i].prompt_ids) for i in order], np.int64),
            "response_len": np.asarray([len(self.samples[i].response_ids) for i in order], np.int64),
            "sampled": np.asarray([self.samples[i].sampled for i in order], np.int8),
            "prompt_index": np.asarray(order, np.int64),
            "skipped": np.asarray(sorted(self.skipped), np.int64),
            "settings": np.asarray(self.settings),
        }

    def save(self, path: Path) -> None:
        """Write to a temporary file beside `path`, then rename: a reader never sees half a file."""
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as f:
            np.savez(f, **self.arrays())
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> Responses:
        try:
            with np.load(path) as d:
                offsets, tokens = d["offsets"], d["tokens"].tolist()
                out = cls(str(d["settings"]), skipped=set(d["skipped"].tolist()))
                rows = zip(d["prompt_index"].tolist(), d["prompt_len"].tolist(), d["sampled"].tolist(), strict=True)
                for n, (i, p, s) in enumerate(rows):
                    seq = tokens[offsets[n] : offsets[n + 1]]
                    out.samples[i] = Sample(seq[:p], seq[p:], bool(s))
        except (OSError, ValueError, KeyError) as e:
            raise ConfigError(f"{path}: unreadable partial output ({e}); delete it to start over") from None
        return out
