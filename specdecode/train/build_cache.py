"""`specdecode distill cache`: one teacher-forced pass of the target over the token files, into a teacher cache.

Usage:
    specdecode distill cache --target smollm2-135m-instruct \
        --data ../shared/data/distill/smollm2_135m_instruct_responses_part1.npz --out cache/part1 \
        --seq-len 512 --top-k 64 --features
    specdecode distill --teacher-cache cache/part1 --data ...part1.npz --seq-len 512 --out drafts/smol-2l ...
    specdecode distill cache ... --draft-vocab 16384 --out cache/part1-v16k  (for `distill --draft-vocab 16384`)
    specdecode distill --head eagle --teacher-cache cache/part1 --data ...part1.npz --seq-len 512 --out heads/e

The pass runs the same forward as `distill --head` (our runtime, fp32) over the windows training cuts, in
order, --batch-size windows at a time (short windows packed into shared rows, each attending only to itself;
`--no-pack`: one a row), and writes each batch into preallocated .npy memory maps (format in
teacher_cache.py). Progress is committed every --save-every seconds (arrays flushed first, then the manifest
replaced atomically), so an interrupted run resumes with --resume at the last commit. Commits fall on batch
boundaries and the batches are the same, so a resumed cache equals an uninterrupted one bit for bit.
With --draft-vocab S the pass picks the subset `distill --draft-vocab S` picks from the same data and stores the
target renormalised over it, which is what that training learns (a draft-vocabulary cache serves only it).
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from specdecode.config import ConfigError
from specdecode.models.llama import AttentionMetadata, LlamaModel, load_llama
from specdecode.models.loader import resolve_model_dir
from specdecode.train import data as D
from specdecode.train import teacher_cache as C
from specdecode.train.config import CacheConfig
from specdecode.train.distill import draft_subset, training_device
from specdecode.train.topk import TopKTeacher, teacher_topk

LOGIT_CHUNK = 1024  # loss positions per LM-head chunk: [1024, 49152] fp32 logits are 200 MB


@dataclass
class CacheResult:
    out: Path
    manifest: dict
    tokens: int  # tokens the target ran over in this process
    seconds: float  # time of the pass itself (no loading)


def _check_output(cfg: CacheConfig) -> Path:
    out = Path(cfg.out).expanduser()
    if out.exists() and not out.is_dir():
        raise ConfigError(f"output {out} exists and is not a directory")
    if cfg.resume and not (out / C.MANIFEST).is_file():
        raise ConfigError(f"--resume: no teacher cache in {out} (no {C.MANIFEST})")
    if out.exists() and not (cfg.resume or cfg.overwrite):
        raise ConfigError(f"output directory {out} already exists; pass --resume to finish it or --overwrite")
    return out


def cache_key(cfg: CacheConfig, target_dir: Path, target_json: dict, subset: torch.Tensor | None) -> dict:
    """What a cache is for: resuming needs all of it to match, training the target, data, seq-len and draft
    vocabulary."""
    distribution = int(target_json["vocab_size"]) if subset is None else len(subset)
    return {
        "target": {
            "spec": cfg.target,
            "dir": str(target_dir),
            "fingerprint": C.target_fingerprint(target_dir),
            "vocab_size": int(target_json["vocab_size"]),
            "hidden_size": int(target_json["hidden_size"]),
            "dtype": cfg.teacher_dtype,  # the teacher's compute dtype
        },
        "data": C.data_fingerprint(cfg.data),
        "seq_len": cfg.seq_len,
        "top_k": min(cfg.top_k, distribution),
        "dtype": cfg.dtype,
        "features": cfg.features,
        "batch_size": cfg.batch_size,
        "draft_vocab": C.vocab_key(subset),
    }


def _new_cache(out: Path, key: dict, windows: np.ndarray, layout: C.Layout, subset, command: str) -> dict:
    """Preallocate every array (sparse files) and commit progress 0."""
    out.mkdir(parents=True)
    manifest = {
        "format": C.FORMAT,
        **key,
        "num_windows": len(windows),
        "num_loss_positions": layout.num_loss,
        "num_tokens": layout.num_tokens,
        "windows_done": 0,
        "command": command,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    specs = C.array_specs(manifest)
    manifest["arrays"] = {name: {"shape": list(s), "dtype": d} for name, (s, d) in specs.items()}
    for name, (shape, dtype) in specs.items():
        np.lib.format.open_memmap(out / f"{name}.npy", mode="w+", dtype=dtype, shape=shape)
    fixed = {"windows": windows, "loss_offsets": layout.loss_offsets, "token_offsets": layout.token_offsets}
    if subset is not None:
        fixed["vocab"] = subset.numpy()
    for name, values in fixed.items():
        if name in specs:
            a = np.lib.format.open_memmap(out / f"{name}.npy", mode="r+")
            a[:] = values
            a.flush()
    C.write_manifest(out, manifest)
    return manifest


def _resumed_cache(out: Path, key: dict, windows: np.ndarray, layout: C.Layout) -> dict:
    manifest = C.read_manifest(out)
    C.check_key(manifest, key, out)
    if manifest["num_loss_positions"] != layout.num_loss or manifest["num_windows"] != len(windows):
        raise ConfigError(f"--resume: {out} was laid out for other windows; rebuild it with --overwrite")
    return manifest


@torch.no_grad()
def teacher_pass(
    target: LlamaModel, batch: D.Batch, k: int, device: torch.device, subset: torch.Tensor | None = None
) -> tuple[TopKTeacher, torch.Tensor]:
    """The target teacher-forced over one batch: top-k at the loss positions ([num_masked], row-major; over the
    draft vocabulary `subset` ([S] on `device`) when given) and the final hidden states ([B, T, H]); the LM head
    runs only at the loss positions, a chunk at a time."""
    ids = torch.from_numpy(batch.input_ids).to(device)  # [B, T]
    b, t = ids.shape
    meta = AttentionMetadata.build(list(range(b)), [0] * b, t, device, **packed_attention(batch, device))
    first = torch.zeros(b, 1, dtype=torch.int64, device=device)  # logits at one position: the head runs below
    _, hidden = target(ids, meta, target.new_cache(b, t), logits_index=first, return_hidden=True)  # [B, T, H]
    at_loss = hidden[torch.from_numpy(batch.loss_mask).to(device)]  # [num_masked, H]
    parts = [
        teacher_topk(target.lm_head(at_loss[lo : lo + LOGIT_CHUNK]).float(), k, subset)
        for lo in range(0, len(at_loss), LOGIT_CHUNK)
    ]
    top = TopKTeacher(
        torch.cat([p.log_p for p in parts]),  # [num_masked, k]
        torch.cat([p.ids for p in parts]),  # [num_masked, k]
        torch.cat([p.log_rest for p in parts]),  # [num_masked]
        target.cfg.vocab_size if subset is None else len(subset),
        None if subset is None else torch.cat([p.top_token for p in parts]),  # [num_masked]
    )
    return top, hidden


def packed_attention(batch: D.Batch, device: torch.device) -> dict[str, torch.Tensor]:
    """AttentionMetadata.build's tree arguments for a packed batch: each window a chain of its own, positions
    from 0 and attending to itself only (exactly what it sees in a row alone); none for one window a row."""
    if batch.position_ids is None:
        return {}
    segment = torch.from_numpy(batch.segments()).to(device)  # [B, T]
    t = segment.shape[1]
    causal = torch.ones(t, t, dtype=torch.bool, device=device).tril()  # [T, T]
    mask = (segment[:, :, None] == segment[:, None, :]) & causal  # [B, T, T]
    return {"tree_depth": torch.from_numpy(batch.position_ids).to(device), "tree_mask": mask}


def window_order(counts: np.ndarray, window_ids: np.ndarray) -> np.ndarray:
    """[sum(counts)] indices that put rows laid out window after window in `window_ids` order ([n], with
    counts[j] rows for window_ids[j]) into ascending window order."""
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])  # [n] first row of each window
    by_id = np.argsort(window_ids, kind="stable")  # [n]
    return np.concatenate([np.arange(starts[j], starts[j] + counts[j]) for j in by_id] or [np.zeros(0, np.int64)])


def _write_batch(arrays: dict, layout: C.Layout, lo: int, hi: int, top: TopKTeacher, hidden, batch: D.Batch) -> None:
    """Windows lo..hi-1 into their rows of every array (a packed batch's rows are put back in window order)."""
    ids = batch.window_ids  # [hi - lo] in layout order
    loss = window_order(layout.loss_offsets[ids + 1] - layout.loss_offsets[ids], ids)  # [num_masked]
    rows = slice(int(layout.loss_offsets[lo]), int(layout.loss_offsets[hi]))
    arrays["topk_logp"][rows] = top.log_p.cpu().numpy()[loss]
    arrays["topk_ids"][rows] = top.ids.cpu().numpy()[loss]
    arrays["log_rest"][rows] = top.log_rest.cpu().numpy()[loss]
    if "target_argmax" in arrays:
        arrays["target_argmax"][rows] = top.top_token.cpu().numpy()[loss]
    if "features" in arrays:
        real = torch.from_numpy(batch.real()).to(hidden.device)  # [B, T]
        tokens = slice(int(layout.token_offsets[lo]), int(layout.token_offsets[hi]))
        order = window_order(layout.token_offsets[ids + 1] - layout.token_offsets[ids], ids)  # [real tokens]
        arrays["features"][tokens] = hidden[real].float().cpu().numpy()[order]


def _commit(out: Path, manifest: dict, arrays: dict, done: int) -> None:
    for a in arrays.values():
        a.flush()
    manifest["windows_done"] = done
    C.write_manifest(out, manifest)


def build_cache(cfg: CacheConfig) -> CacheResult:
    """Validate everything, then run (or finish) the pass; returns the finished cache's manifest."""
    out = _check_output(cfg)
    device = training_device(cfg.device)
    target_dir = resolve_model_dir(cfg.target)
    target_json = json.loads((target_dir / "config.json").read_text())
    samples = D.load_samples(cfg.data, int(target_json["vocab_size"]))
    windows = D.window_starts(samples, cfg.seq_len)
    layout = C.plan_layout(samples, windows, cfg.seq_len)
    subset = draft_subset(cfg.draft_vocab, samples, target_json)  # [S] or None
    key = cache_key(cfg, target_dir, target_json, subset)
    if cfg.resume:
        manifest = _resumed_cache(out, key, windows, layout)
    target = load_llama(target_dir, device, getattr(torch, cfg.teacher_dtype))
    target.requires_grad_(False)
    if not cfg.resume:
        if out.exists():  # --overwrite, now that every input has been checked
            shutil.rmtree(out)
        manifest = _new_cache(out, key, windows, layout, subset, cfg.command)
    specs = C.array_specs(manifest)
    written = [n for n in (*C.LOSS_ARRAYS, "features") if n in specs]
    arrays = {n: C.open_array(out / f"{n}.npy", *specs[n], mode="r+") for n in written}
    subset = None if subset is None else subset.to(device)
    return _run_pass(cfg, out, manifest, arrays, target, samples, windows, layout, device, subset)


def _run_pass(cfg, out, manifest, arrays, target, samples, windows, layout, device, subset) -> CacheResult:
    """Batches from the last commit to the end; commits every cfg.save_every seconds, at the end, and on the way
    out of an exception (only whole batches are ever counted)."""
    done, total, k = manifest["windows_done"], len(windows), manifest["top_k"]
    bar = tqdm(total=total, initial=done, disable=not cfg.progress, desc="teacher cache", unit="win")
    start = done
    t0 = last_commit = time.perf_counter()
    tokens = 0
    try:
        for lo in range(start, total, cfg.batch_size):
            hi = min(lo + cfg.batch_size, total)
            batch = D.make_batch(samples, windows[lo:hi], cfg.seq_len, np.arange(lo, hi), cfg.pack)
            top, hidden = teacher_pass(target, batch, k, device, subset)
            _write_batch(arrays, layout, lo, hi, top, hidden, batch)
            done, tokens = hi, tokens + batch.num_tokens
            bar.update(hi - lo)
            bar.set_postfix(tok_s=f"{tokens / max(time.perf_counter() - t0, 1e-9):.0f}")
            if time.perf_counter() - last_commit >= cfg.save_every:
                _commit(out, manifest, arrays, done)
                last_commit = time.perf_counter()
    finally:
        bar.close()
        if done > manifest["windows_done"]:
            _commit(out, manifest, arrays, done)
    return CacheResult(out, manifest, tokens, time.perf_counter() - t0)
