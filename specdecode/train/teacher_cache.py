"""The teacher cache: what training needs from the target, computed once and read back as memory maps.

Built by `specdecode distill cache` (build_cache.py), read by `specdecode distill --teacher-cache DIR` and
`distill --head ... --teacher-cache DIR`. The target runs over exactly the windows training cuts
(data.window_starts at the same --seq-len), so a cached distribution is the one training would compute on the
fly. A directory holds .npy arrays (numpy.lib.format, opened with mmap) and manifest.json:

    windows.npy        [num_windows, 2] int64     (sample, start) of each window, in window_starts order
    loss_offsets.npy   [num_windows + 1] int64    window w's loss positions are rows loss_offsets[w]:[w + 1],
                                                  in position order (so a batch's rows follow tensor[loss_mask])
    topk_logp.npy      [num_loss, k] f16|f32      the target's top-k log-probabilities, largest first
    topk_ids.npy       [num_loss, k] int32        their token ids
    log_rest.npy       [num_loss] float32         log of the probability mass outside the top-k
    token_offsets.npy  [num_windows + 1] int64    (--features) window w's tokens are rows token_offsets[w]:[w + 1]
    features.npy       [num_tokens, hidden] f16|f32  (--features) final post-norm hidden state at every real token

Built for a draft vocabulary (--draft-vocab S, the subset `distill --draft-vocab S` picks from the same data),
the loss arrays hold the distribution that training on the fly learns: the target renormalised over the subset
(topk.teacher_topk). topk_ids then index vocab.npy, log_rest is the subset's mass outside the top-k, and

    vocab.npy          [S] int64                  (--draft-vocab) the subset, sorted token ids
    target_argmax.npy  [num_loss] int32           (--draft-vocab) the target's argmax over the whole vocabulary

The manifest names the target (a fingerprint of its config and weights), the token files (sha256), seq-len, k,
dtype, the draft vocabulary (its size and sha256, or null) and progress; a cache that does not match what
training asks for is refused rather than silently used. Format 1 (before draft vocabularies) reads as null.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from specdecode.config import ConfigError
from specdecode.train import data as D
from specdecode.train.config import CACHE_DTYPES
from specdecode.train.head_objective import Teacher
from specdecode.train.topk import TopKTeacher

FORMAT = 2
READS = (1, 2)  # format 1 caches are full-vocabulary ones
MANIFEST = "manifest.json"
LOSS_ARRAYS = ("topk_logp", "topk_ids", "log_rest", "target_argmax")  # the pass writes those in array_specs
FEATURE_ARRAYS = ("token_offsets", "features")
_SAMPLE_CHUNKS, _CHUNK = 64, 1 << 16  # target fingerprint: 64 chunks of 64 KiB per weight file


def target_fingerprint(target_dir: Path) -> str:
    """config.json plus the size and 64 evenly spaced 64 KiB chunks of each weight file: another checkpoint of
    the same shape differs in every chunk, and a 14 GB target is fingerprinted in milliseconds."""
    h = hashlib.sha256((target_dir / "config.json").read_bytes())
    for shard in sorted(target_dir.glob("*.safetensors")):
        size = shard.stat().st_size
        h.update(f"{shard.name}:{size}".encode())
        with shard.open("rb") as f:
            for off in np.linspace(0, max(size - _CHUNK, 0), _SAMPLE_CHUNKS).astype(np.int64).tolist():
                f.seek(off)
                h.update(f.read(_CHUNK))
    return h.hexdigest()[:20]


def data_fingerprint(paths: list[str]) -> list[dict[str, Any]]:
    """One entry per token file, in order: its path, size and the sha256 of its bytes (a few ms per MB). Only the
    hashes are compared: a cache stays valid for the same files moved elsewhere."""
    out = []
    for p in map(Path, paths):
        if not p.is_file():
            raise ConfigError(f"data file not found: {p}")
        h = hashlib.sha256()
        with p.open("rb") as f:
            for block in iter(lambda f=f: f.read(1 << 20), b""):
                h.update(block)
        out.append({"name": p.name, "path": str(p.resolve()), "size": p.stat().st_size, "sha256": h.hexdigest()})
    return out


@dataclass(frozen=True)
class Layout:
    """Where each window's rows live; a pure function of the samples, the windows and seq-len."""

    loss_offsets: np.ndarray  # [num_windows + 1] int64
    token_offsets: np.ndarray  # [num_windows + 1] int64

    @property
    def num_loss(self) -> int:
        return int(self.loss_offsets[-1])

    @property
    def num_tokens(self) -> int:
        return int(self.token_offsets[-1])


def plan_layout(samples: D.Samples, windows: np.ndarray, seq_len: int) -> Layout:
    """Counts what make_batch would: a window holds min(seq_len, n - start) tokens; its loss positions are the
    next-token positions start + 1 .. start + len - 1 that fall in the response (>= prompt_len)."""
    i, start = windows[:, 0], windows[:, 1]  # [num_windows] each
    n = np.diff(samples.offsets)[i]
    length = np.minimum(seq_len, n - start)  # [num_windows]
    first = np.maximum(start + 1, samples.prompt_len[i])
    loss = np.maximum(start + length - first, 0)  # [num_windows]
    zero = np.zeros(1, np.int64)
    return Layout(np.concatenate([zero, np.cumsum(loss)]), np.concatenate([zero, np.cumsum(length)]))


def array_specs(manifest: dict) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (shape, dtype) of every array the manifest promises."""
    w, k, dtype = manifest["num_windows"], manifest["top_k"], manifest["dtype"]
    n = manifest["num_loss_positions"]
    specs = {
        "windows": ((w, 2), "int64"),
        "loss_offsets": ((w + 1,), "int64"),
        "topk_logp": ((n, k), dtype),
        "topk_ids": ((n, k), "int32"),
        "log_rest": ((n,), "float32"),
    }
    if manifest.get("draft_vocab"):
        specs["vocab"] = ((manifest["draft_vocab"]["size"],), "int64")
        specs["target_argmax"] = ((n,), "int32")
    if manifest["features"]:
        specs["token_offsets"] = ((w + 1,), "int64")
        specs["features"] = ((manifest["num_tokens"], manifest["target"]["hidden_size"]), dtype)
    return specs


_FIELDS = ("target", "data", "seq_len", "top_k", "dtype", "features", "num_windows", "num_loss_positions")
_TARGET_FIELDS = ("fingerprint", "vocab_size", "hidden_size")


def _validate(manifest: dict) -> None:
    """Raise ValueError naming the first thing missing or wrong in a parsed manifest."""
    if not isinstance(manifest, dict) or manifest.get("format") not in READS:
        got = manifest.get("format") if isinstance(manifest, dict) else manifest
        raise ValueError(f"format {got!r}, this version reads {' and '.join(map(str, READS))}")
    fields = (*_FIELDS, "num_tokens", "windows_done", *(("draft_vocab",) if manifest["format"] >= 2 else ()))
    missing = [k for k in fields if k not in manifest]
    missing += [f"target.{k}" for k in _TARGET_FIELDS if k not in (manifest.get("target") or {})]
    missing += [f"data[{i}].sha256" for i, d in enumerate(manifest.get("data") or []) if "sha256" not in d]
    if missing:
        raise ValueError(f"missing {', '.join(missing)}")
    if manifest["dtype"] not in CACHE_DTYPES:
        raise ValueError(f"dtype {manifest['dtype']!r}")


def read_manifest(root: Path) -> dict:
    path = root / MANIFEST
    if not path.is_file():
        raise ConfigError(f"{root}: not a teacher cache (no {MANIFEST}); build one with `specdecode distill cache`")
    try:
        manifest = json.loads(path.read_text())
        _validate(manifest)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{path}: malformed teacher-cache manifest ({e})") from None
    return manifest


def write_manifest(root: Path, manifest: dict) -> None:
    """Atomic: a crash leaves the previous manifest, whose progress the flushed arrays already back."""
    tmp = root / f"{MANIFEST}.tmp-{os.getpid()}"
    tmp.write_text(json.dumps(manifest, indent=1))
    os.replace(tmp, root / MANIFEST)


def open_array(path: Path, shape: tuple[int, ...], dtype: str, mode: str = "r") -> np.memmap:
    """Memory-map one array after checking its header and that the file holds every byte the header promises."""
    if not path.is_file():
        raise ConfigError(f"teacher cache: {path} is missing")
    try:
        with path.open("rb") as f:
            version = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            got_shape, _, got_dtype = read(f)
            data_start = f.tell()
    except ValueError as e:
        raise ConfigError(f"teacher cache: {path} is not a .npy array ({e})") from None
    if tuple(got_shape) != tuple(shape) or got_dtype != np.dtype(dtype):
        raise ConfigError(
            f"teacher cache: {path} holds {got_dtype}{list(got_shape)}, the manifest says {dtype}{list(shape)}"
        )
    need = data_start + int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    have = path.stat().st_size
    if have < need:
        raise ConfigError(f"teacher cache: {path} is truncated ({have:,} bytes, expected {need:,}); rebuild it")
    return np.lib.format.open_memmap(path, mode=mode)


def vocab_key(subset: torch.Tensor | np.ndarray | None) -> dict | None:
    """What a cache records of a draft vocabulary: its size and the sha256 of its sorted ids (as int64)."""
    if subset is None:
        return None
    ids = np.asarray(subset, dtype=np.int64)
    return {"size": len(ids), "sha256": hashlib.sha256(ids.tobytes()).hexdigest()[:16]}


def _vocab_name(key: dict | None) -> str:
    return "the full vocabulary" if key is None else f"--draft-vocab {key['size']} (subset {key['sha256']})"


def _check_vocab(built: dict | None, want: dict | None, root: Path) -> None:
    """A draft-vocabulary cache holds the teacher renormalised over its subset: only that subset trains from it."""
    if built == want:
        return
    fix = "without --draft-vocab" if want is None else f"with --draft-vocab {want['size']}"
    raise ConfigError(
        f"teacher cache {root} was built for {_vocab_name(built)}, not for {_vocab_name(want)}; "
        f"build one with `specdecode distill cache` {fix}"
    )


def check_key(manifest: dict, expect: dict, root: Path) -> None:
    """Refuse a cache built for another target, other token files or other settings than `expect` holds."""
    built = manifest["target"]
    want = expect.get("target")
    if want is not None and built.get("fingerprint") != want["fingerprint"]:
        raise ConfigError(
            f"teacher cache {root} was built for target {built.get('spec')!r} ({built.get('fingerprint')}), "
            f"not for {want['spec']!r} ({want['fingerprint']}); rebuild it with `specdecode distill cache`"
        )
    dtype = built.get("dtype", "float32")  # the teacher's compute dtype (older caches: fp32, unrecorded)
    if want is not None and "dtype" in want and dtype != want["dtype"]:  # a resume must not mix two teachers
        raise ConfigError(f"teacher cache {root} was built with --teacher-dtype {dtype}, not {want['dtype']}")
    if "data" in expect and [d["sha256"] for d in manifest["data"]] != [d["sha256"] for d in expect["data"]]:
        names = ", ".join(d["name"] for d in manifest["data"])
        raise ConfigError(f"teacher cache {root} was built from other token files ({names}) than --data names")
    for key in ("seq_len", "top_k", "dtype", "batch_size"):
        flag = "--" + key.replace("_", "-")
        if key in expect and manifest.get(key) != expect[key]:
            raise ConfigError(f"teacher cache {root} was built with {flag} {manifest.get(key)}, not {expect[key]}")
    if "draft_vocab" in expect:
        _check_vocab(manifest.get("draft_vocab"), expect["draft_vocab"], root)
    if expect.get("features") and not manifest["features"]:
        raise ConfigError(f"teacher cache {root} has no target features; heads need one built with --features")


class TeacherCache:
    """A finished cache, opened read-only; gathers the cached teacher of a training batch by its window ids."""

    def __init__(self, root: Path, manifest: dict, arrays: dict[str, np.memmap]) -> None:
        self.root, self.manifest, self.arrays = root, manifest, arrays
        subset = manifest.get("draft_vocab")
        self.vocab_size = int(manifest["target"]["vocab_size"] if subset is None else subset["size"])

    def _rows(self, offsets: str, window_ids: np.ndarray) -> np.ndarray:
        """[n] the rows of `window_ids`, window after window."""
        o = self.arrays[offsets]
        return np.concatenate([np.arange(o[w], o[w + 1]) for w in window_ids.tolist()])

    def _real_positions(self, window_ids: np.ndarray, seq_len: int) -> torch.Tensor:
        """[B, T] bool: row b's position t holds a real token, not padding (make_batch pads at the end)."""
        o = self.arrays["token_offsets"]
        lengths = torch.from_numpy(np.asarray(o[window_ids + 1] - o[window_ids]))  # [B]
        return torch.arange(seq_len)[None, :] < lengths[:, None]

    def topk(self, window_ids: np.ndarray) -> TopKTeacher:
        """[num_masked] the teacher at the batch's loss positions, in the row-major order of tensor[loss_mask]."""
        rows = self._rows("loss_offsets", window_ids)
        a = self.arrays
        top = torch.from_numpy(a["target_argmax"][rows].astype(np.int64)) if "target_argmax" in a else None
        return TopKTeacher(
            torch.from_numpy(a["topk_logp"][rows].astype(np.float32)),  # [num_masked, k]
            torch.from_numpy(a["topk_ids"][rows].astype(np.int64)),  # [num_masked, k] token ids or subset indices
            torch.from_numpy(np.asarray(a["log_rest"][rows])),  # [num_masked]
            self.vocab_size,
            top,  # [num_masked] or None
        )

    def head_teacher(self, batch: D.Batch, device: torch.device) -> Teacher:
        """The Teacher heads.teacher_batch would compute: features at every real token, the top-k distribution
        at the loss positions (other positions hold zeros that no head loss reads)."""
        mask = torch.from_numpy(batch.loss_mask)  # [B, T]
        b, t = mask.shape
        real = self._real_positions(batch.window_ids, t)  # [B, T]
        feats = torch.zeros(b, t, self.arrays["features"].shape[1])  # [B, T, H]
        rows = self._rows("token_offsets", batch.window_ids)
        feats[real] = torch.from_numpy(self.arrays["features"][rows].astype(np.float32))
        sparse = self.topk(batch.window_ids)
        k = sparse.k
        dense = TopKTeacher(
            torch.zeros(b, t, k), torch.zeros(b, t, k, dtype=torch.int64), torch.zeros(b, t), self.vocab_size
        )  # [B, T, k], [B, T, k], [B, T]
        dense.log_p[mask], dense.ids[mask], dense.log_rest[mask] = sparse.log_p, sparse.ids, sparse.log_rest
        ids = torch.from_numpy(batch.input_ids).to(device)  # [B, T]
        return Teacher(feats.to(device), dense.to(device), ids, mask.to(device))


def open_cache(root: str | Path, expect: dict, windows: np.ndarray) -> TeacherCache:
    """Open a finished cache for training after every check: manifest, key, array sizes, the windows."""
    root = Path(root).expanduser()
    manifest = read_manifest(root)
    check_key(manifest, expect, root)
    done, total = manifest["windows_done"], manifest["num_windows"]
    if done < total:
        raise ConfigError(
            f"teacher cache {root} is incomplete ({done:,} of {total:,} windows); finish it with "
            "`specdecode distill cache ... --resume`"
        )
    arrays = {name: open_array(root / f"{name}.npy", *spec) for name, spec in array_specs(manifest).items()}
    if not np.array_equal(arrays["windows"], windows):
        raise ConfigError(f"teacher cache {root} covers other training windows than --data and --seq-len give")
    if "vocab" in arrays and vocab_key(arrays["vocab"]) != manifest["draft_vocab"]:
        raise ConfigError(f"teacher cache {root}: vocab.npy is not the subset its manifest names; rebuild it")
    return TeacherCache(root, manifest, arrays)


def open_for_training(
    root: str | Path,
    target_spec: str,
    target_dir: Path,
    data: list[str],
    seq_len: int,
    windows: np.ndarray,  # [num_windows, 2] the run's data.window_starts
    features: bool = False,
    subset: torch.Tensor | None = None,  # [S] the run's draft vocabulary, or None: the full one
) -> TeacherCache:
    """The cache a training run may use: same target, same token files in the same order, same seq-len, same
    draft vocabulary (or none on both sides)."""
    expect = {
        "target": {"spec": target_spec, "fingerprint": target_fingerprint(target_dir)},
        "data": data_fingerprint(data),
        "seq_len": seq_len,
        "features": features,
        "draft_vocab": vocab_key(None if subset is None else subset.cpu()),
    }
    return open_cache(root, expect, windows)
