"""The teacher cache (`distill cache`): training from it equals training on the fly (drafts and heads), caches
that do not match or are damaged are refused, and an interrupted build resumes to the same bytes."""

from __future__ import annotations

import json
import math
import os
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from experiments import distill_cache as bench
from specdecode.cli import main
from specdecode.config import ConfigError
from specdecode.train import build_cache as B
from specdecode.train import data as D
from specdecode.train.build_cache import CacheConfig, build_cache
from specdecode.train.distill import DistillConfig, distill
from specdecode.train.draft_config import DraftOptions
from specdecode.train.teacher_cache import open_cache
from specdecode.train.topk import teacher_topk, topk_of
from tests.train.conftest import VOCAB, Interrupted, crash_after_checkpoint, write_npz

SEQ_LEN, BATCH = 24, 4
SMALL = dict(batch_size=BATCH, seq_len=SEQ_LEN, warmup=3, progress=False)
ARRAYS = ("windows", "loss_offsets", "topk_logp", "topk_ids", "log_rest", "token_offsets", "features")
SUBSET = 40  # --draft-vocab: the 40 most frequent of the tiny target's 96 tokens
SUBSET_DRAFT = DraftOptions(num_layers=1, vocab_subset=SUBSET)


def _cache(target, data, out, **kw):
    base = dict(seq_len=SEQ_LEN, batch_size=BATCH, dtype="float32", save_every=0.0, progress=False)
    return build_cache(CacheConfig(target=str(target), data=[str(d) for d in data], out=str(out), **{**base, **kw})).out


def _train(target, data, out, **kw):
    if kw.get("head") is None:
        kw.setdefault("draft", DraftOptions(num_layers=1))
    else:
        kw.setdefault("num_head_tokens", 2)
    return distill(DistillConfig(target=str(target), data=[str(d) for d in data], out=str(out), **{**SMALL, **kw}))


def _step0_window(cache) -> int:
    """A window that training step 0 draws (seed 0): a change to its rows must show in the first loss."""
    num_windows = len(np.load(cache / "windows.npy"))
    return int(D.batch_windows(num_windows, BATCH, 0, seed=0)[0])


def _tail_term(log_p: torch.Tensor, log_q: torch.Tensor, top) -> torch.Tensor:
    """[] mean of p_rest * KL(tail_p || tail_q): what the k + 1 buckets leave out (log_p, log_q [N, V])."""
    tail = torch.ones_like(log_p, dtype=torch.bool).scatter(1, top.ids, False)  # [N, V]
    lp = log_p.masked_fill(~tail, -math.inf).log_softmax(-1)  # [N, V] the teacher's tail, renormalised
    lq = log_q.masked_fill(~tail, -math.inf).log_softmax(-1)
    tail_kl = torch.where(tail, lp.exp() * (lp - lq), torch.zeros_like(lp)).sum(-1)  # [N]
    return (top.log_rest.exp() * tail_kl).mean()


def test_topk_kl_is_full_kl_minus_the_tail_term():
    g = torch.Generator().manual_seed(0)
    log_p = (3 * torch.randn(6, 40, generator=g)).log_softmax(-1)  # [N, V]
    log_q = (3 * torch.randn(6, 40, generator=g)).log_softmax(-1)  # [N, V]
    full = F.kl_div(log_q, log_p, log_target=True, reduction="batchmean")
    assert torch.allclose(topk_of(log_p, 40).kl(log_q), full, atol=1e-6)  # k = vocab: exactly the full KL

    top = topk_of(log_p, 8)
    p_rest = top.log_rest.exp()  # [N]
    assert torch.allclose(p_rest, 1 - top.log_p.exp().sum(-1), atol=1e-6)  # the exact mass outside the top-k
    # chain rule: full KL = KL over the k + 1 buckets + p_rest * KL(tail_p || tail_q)
    assert torch.allclose(top.kl(log_q) + _tail_term(log_p, log_q, top), full, atol=1e-5)
    assert full - top.kl(log_q) > 1e-3  # control: the dropped tail term is not negligible here


def test_subset_topk_kl_is_the_subset_kl_minus_the_tail_term():
    """With a draft vocabulary the buckets partition the subset: the same chain rule holds against distill_loss's
    KL to the teacher renormalised over the subset, so the rest bucket must hold the subset's mass past the top-k."""
    g = torch.Generator().manual_seed(1)
    logits = 3 * torch.randn(6, 40, generator=g)  # [N, V] the teacher
    subset = torch.randperm(40, generator=g)[:15].sort().values  # [S]
    log_q = (3 * torch.randn(6, 15, generator=g)).log_softmax(-1)  # [N, S] the student over the subset
    log_p = logits[:, subset].log_softmax(-1)  # [N, S] the teacher as distill_loss sees it
    subset_kl = F.kl_div(log_q, log_p, log_target=True, reduction="batchmean")
    assert torch.allclose(teacher_topk(logits, 15, subset).kl(log_q), subset_kl, atol=1e-6)  # k = S: exact

    top = teacher_topk(logits, 5, subset)
    assert top.vocab_size == 15 and torch.equal(top.argmax(), logits.argmax(-1))  # argmax over the whole vocab
    assert torch.allclose(top.log_rest.exp(), 1 - top.log_p.exp().sum(-1), atol=1e-6)  # the subset's rest
    assert torch.allclose(top.kl(log_q) + _tail_term(log_p, log_q, top), subset_kl, atol=1e-5)
    # negative control: the same identity without the rest bucket misses by far more than its tolerance
    dropped = replace(top, log_rest=torch.full_like(top.log_rest, -math.inf))
    assert (dropped.kl(log_q) + _tail_term(log_p, log_q, top) - subset_kl).abs() > 1e-2


def test_draft_from_full_cache_equals_on_the_fly(tiny_target, train_npz, tmp_path):
    """k >= vocab: the cache holds the whole distribution, so the losses agree up to float rounding (the cache
    runs our runtime, distill's on-the-fly teacher Hugging Face's: logits differ by ~1e-6)."""
    cache = _cache(tiny_target, [train_npz], tmp_path / "cache", top_k=128)
    assert json.loads((cache / "manifest.json").read_text())["top_k"] == VOCAB  # clamped to the vocabulary
    fly = _train(tiny_target, [train_npz], tmp_path / "fly", steps=6).losses
    cached = _train(tiny_target, [train_npz], tmp_path / "cached", steps=6, teacher_cache=str(cache))
    np.testing.assert_allclose(cached.losses, fly, atol=1e-5, rtol=0)
    assert cached.manifest["teacher_cache"] == str(cache.resolve())

    # negative control: one position of a window step 0 uses gets a wrong teacher (its top-k ids rolled by one)
    row = int(np.load(cache / "loss_offsets.npy")[_step0_window(cache)])
    ids = np.lib.format.open_memmap(cache / "topk_ids.npy", mode="r+")
    ids[row] = np.roll(ids[row], 1)
    ids.flush()
    del ids
    mutated = _train(tiny_target, [train_npz], tmp_path / "mutated", steps=6, teacher_cache=str(cache)).losses
    assert not np.allclose(mutated, fly, atol=1e-5, rtol=0)


def test_draft_from_top_k_cache_is_close(tiny_target, train_npz, tmp_path):
    """k = 32 of 96: the cached loss leaves out p_rest * KL(tail_p || tail_q) >= 0 (see topk.py), so it is lower
    than the on-the-fly loss by that term. On this peaked tiny target the term stays under 2e-3 (~0.05% of a loss
    of ~3.3) over these steps; the weights barely move apart, so the sign holds at every step."""
    cache = _cache(tiny_target, [train_npz], tmp_path / "cache", top_k=32, dtype="float16")
    fly = np.array(_train(tiny_target, [train_npz], tmp_path / "fly", steps=6).losses)
    cached = np.array(_train(tiny_target, [train_npz], tmp_path / "c", steps=6, teacher_cache=str(cache)).losses)
    gap = fly - cached
    assert np.all(gap > -1e-4) and np.all(gap < 2e-3), gap  # -1e-4: fp16 storage of the log-probs


def _other_subset(subset: torch.Tensor) -> torch.Tensor:
    """[S] as many other token ids: the tokens outside `subset`, smallest first."""
    outside = torch.ones(VOCAB, dtype=torch.bool, device=subset.device)
    outside[subset] = False
    return outside.nonzero().flatten()[: len(subset)]


# Faults a draft-vocabulary cache could be built with, injected into the build's teacher_topk(logits, k, subset).
SUBSET_FAULTS = {
    # the pass scores another subset than the one the manifest names
    "other subset": lambda logits, k, subset: teacher_topk(logits, k, _other_subset(subset)),
    # the subset's rows of the full-vocabulary log-probs: the mass outside the subset is not renormalised away
    "not renormalised": lambda logits, k, subset: replace(
        topk_of(logits.log_softmax(-1)[:, subset], k), top_token=logits.argmax(-1)
    ),
    # the mass inside the subset but outside the top-k is dropped (the rest bucket empty)
    "rest dropped": lambda logits, k, subset: replace(
        teacher_topk(logits, k, subset), log_rest=torch.full((len(logits),), -math.inf)
    ),
}


def _subset_runs(tiny_target, train_npz, tmp_path, monkeypatch, fault: str | None, **cache_kw) -> tuple:
    """(on the fly, from a --draft-vocab cache built with `fault`) losses and accuracies of the same draft."""
    if fault is not None:
        monkeypatch.setattr(B, "teacher_topk", SUBSET_FAULTS[fault])
    cache = _cache(tiny_target, [train_npz], tmp_path / "cache", draft_vocab=SUBSET, **cache_kw)
    monkeypatch.undo()
    run = dict(steps=6, ce_weight=0.5, draft=SUBSET_DRAFT)
    fly = _train(tiny_target, [train_npz], tmp_path / "fly", **run)
    cached = _train(tiny_target, [train_npz], tmp_path / "cached", teacher_cache=str(cache), **run)
    np.testing.assert_array_equal(np.load(cache / "vocab.npy"), np.load(cached.out / "vocab.npy"))  # one subset
    return fly, cached


@pytest.mark.parametrize("fault", [None, "other subset", "not renormalised"])
def test_draft_vocab_from_subset_cache_equals_on_the_fly(fault, tiny_target, train_npz, tmp_path, monkeypatch):
    """k >= S: the cache holds the target renormalised over the draft vocabulary, the distribution distill_loss
    trains on the fly, so the losses (KL plus hard-label CE inside the subset) and accuracies (against the
    target's argmax over the whole vocabulary) agree up to float rounding. Each fault misses by > 100x atol."""
    fly, cached = _subset_runs(tiny_target, train_npz, tmp_path, monkeypatch, fault, top_k=128)
    assert cached.manifest["draft_vocab"] == SUBSET
    gap = np.abs(np.array(cached.losses) - np.array(fly.losses)).max()
    if fault is None:
        assert json.loads((tmp_path / "cache" / "manifest.json").read_text())["top_k"] == SUBSET  # clamped to S
        np.testing.assert_allclose(cached.losses, fly.losses, atol=1e-5, rtol=0)
        assert cached.accuracies == fly.accuracies
    else:
        assert gap > 1e-3, gap


@pytest.mark.parametrize("fault", [None, "rest dropped"])
def test_draft_vocab_from_top_k_subset_cache_is_close(fault, tiny_target, train_npz, tmp_path, monkeypatch):
    """k = 8 of S = 40: as for the full vocabulary, the cached loss leaves out p_rest * KL(tail_p || tail_q) >= 0,
    the rest bucket now being the subset's mass outside the top-k: the cached loss is never above the on-the-fly
    one (up to fp16 storage), and here within 3e-2 below it (the term is ~0.02 with only 8 of 40 kept). Without
    the rest bucket the cached loss is above the on-the-fly one at every step, by > 100x the fp16 tolerance."""
    fly, cached = _subset_runs(tiny_target, train_npz, tmp_path, monkeypatch, fault, top_k=8, dtype="float16")
    gap = np.array(fly.losses) - np.array(cached.losses)
    if fault is None:
        assert np.all(gap > -1e-4) and np.all(gap < 3e-2), gap  # -1e-4: fp16 storage of the log-probs
    else:
        assert np.all(gap < -1e-2), gap


def test_cache_for_another_draft_vocab_is_refused(tiny_target, train_npz, tmp_path, capsys):
    full = _cache(tiny_target, [train_npz], tmp_path / "full", top_k=8)
    subset = _cache(tiny_target, [train_npz], tmp_path / "subset", top_k=8, draft_vocab=SUBSET)
    digest = r"\(subset [0-9a-f]{16}\)"
    cases = [
        (full, dict(draft=SUBSET_DRAFT), f"full vocabulary, not for --draft-vocab {SUBSET} {digest}"),
        (subset, dict(draft=DraftOptions(vocab_subset=48)), f"{SUBSET} {digest}, not for --draft-vocab 48 {digest}"),
        (subset, {}, f"built for --draft-vocab {SUBSET} {digest}, not for the full vocabulary"),
        (subset, dict(head="eagle"), f"built for --draft-vocab {SUBSET} {digest}, not for the full vocabulary"),
    ]
    for cache, kw, message in cases:
        with pytest.raises(ConfigError, match=message) as e:
            _train(tiny_target, [train_npz], tmp_path / "out", steps=1, teacher_cache=str(cache), **kw)
        assert "\n" not in str(e.value) and "build one with `specdecode distill cache`" in str(e.value)
    with pytest.raises(ConfigError, match=f"--draft-vocab {SUBSET} {digest}, not for --draft-vocab 48"):
        _cache(tiny_target, [train_npz], subset, top_k=8, draft_vocab=48, resume=True)
    assert not (tmp_path / "out").exists()

    vocab = np.lib.format.open_memmap(subset / "vocab.npy", mode="r+")  # the subset file replaced after the build
    vocab[:] = _other_subset(torch.from_numpy(np.array(vocab))).numpy()
    vocab.flush()
    del vocab
    with pytest.raises(ConfigError, match="vocab.npy is not the subset its manifest names"):
        _train(tiny_target, [train_npz], tmp_path / "out", teacher_cache=str(subset), draft=SUBSET_DRAFT)

    argv = ["distill", "--target", str(tiny_target), "--data", str(train_npz), "--seq-len", str(SEQ_LEN)]
    argv += ["--out", str(tmp_path / "out"), "--draft-vocab", "8", "--teacher-cache", str(full), "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not for --draft-vocab 8" in err and "Traceback" not in err, err


def test_format_1_cache_still_trains_the_full_vocabulary(tiny_target, train_npz, tmp_path):
    """Caches from before draft vocabularies (format 1, no draft_vocab) read as full-vocabulary ones."""
    cache = _cache(tiny_target, [train_npz], tmp_path / "cache", top_k=8)
    now = _train(tiny_target, [train_npz], tmp_path / "now", steps=2, teacher_cache=str(cache)).losses
    manifest = json.loads((cache / "manifest.json").read_text())
    del manifest["draft_vocab"]
    (cache / "manifest.json").write_text(json.dumps({**manifest, "format": 1}))
    old = _train(tiny_target, [train_npz], tmp_path / "old", steps=2, teacher_cache=str(cache)).losses
    assert old == now
    with pytest.raises(ConfigError, match=f"full vocabulary, not for --draft-vocab {SUBSET}"):
        _train(tiny_target, [train_npz], tmp_path / "x", teacher_cache=str(cache), draft=SUBSET_DRAFT)
    manifest["format"] = 2  # a format 2 manifest must say which vocabulary it holds
    (cache / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ConfigError, match="malformed.*missing draft_vocab"):
        _train(tiny_target, [train_npz], tmp_path / "x", teacher_cache=str(cache))


@pytest.mark.parametrize("kind", ["eagle", "medusa", "mtp"])
def test_heads_from_cache_equal_on_the_fly(kind, tiny_target, train_npz, tmp_path):
    cache = _cache(tiny_target, [train_npz], tmp_path / "cache", top_k=VOCAB, features=True)
    fly = _train(tiny_target, [train_npz], tmp_path / "fly", head=kind, steps=5).losses
    cached = _train(tiny_target, [train_npz], tmp_path / "cached", head=kind, steps=5, teacher_cache=str(cache))
    np.testing.assert_allclose(cached.losses, fly, atol=1e-5, rtol=0)

    # negative control: the features of one window that step 0 uses are moved
    w = _step0_window(cache)
    lo, hi = np.load(cache / "token_offsets.npy")[w : w + 2]
    feats = np.lib.format.open_memmap(cache / "features.npy", mode="r+")
    feats[lo:hi] += 0.5
    feats.flush()
    del feats
    mutated = _train(tiny_target, [train_npz], tmp_path / "m", head=kind, steps=5, teacher_cache=str(cache)).losses
    assert not np.allclose(mutated, fly, atol=1e-5, rtol=0)


def test_resume_from_cache_matches_uninterrupted_run(tiny_target, train_npz, tmp_path, monkeypatch):
    """Cached batches are looked up by window id, so a resumed run draws (and reads) the same batches."""
    cache = str(_cache(tiny_target, [train_npz], tmp_path / "cache", top_k=8))
    straight = _train(tiny_target, [train_npz], tmp_path / "a", steps=6, teacher_cache=cache)
    with crash_after_checkpoint(monkeypatch):
        _train(tiny_target, [train_npz], tmp_path / "b", steps=6, save_every=3, teacher_cache=cache)
    resumed = _train(tiny_target, [train_npz], tmp_path / "b", steps=6, save_every=3, resume=True, teacher_cache=cache)
    np.testing.assert_allclose(resumed.losses, straight.losses[3:], atol=1e-6, rtol=0)
    a, b = load_file(straight.out / "model.safetensors"), load_file(resumed.out / "model.safetensors")
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def test_truncated_array_is_refused(tiny_target, train_npz, tmp_path):
    cache = _cache(tiny_target, [train_npz], tmp_path / "cache", top_k=8, features=True)
    for name in ("topk_logp", "features"):
        path = cache / f"{name}.npy"
        size = path.stat().st_size
        os.truncate(path, size - 8)
        with pytest.raises(ConfigError, match=f"{name}.npy is truncated .* expected {size:,}"):
            _train(tiny_target, [train_npz], tmp_path / "out", head="eagle", steps=1, teacher_cache=str(cache))
        assert not (tmp_path / "out").exists()
        os.truncate(path, size)  # back to full length (zeros): the next array is the one refused


def test_missing_or_malformed_manifest_is_refused(tiny_target, train_npz, tmp_path):
    cache = _cache(tiny_target, [train_npz], tmp_path / "cache", top_k=8)
    manifest = cache / "manifest.json"
    good = json.loads(manifest.read_text())
    cases = [
        (None, "not a teacher cache"),
        ("{", "malformed teacher-cache manifest"),
        (json.dumps({k: v for k, v in good.items() if k != "top_k"}), "malformed.*top_k"),
        (json.dumps({**good, "format": 99}), "malformed.*format 99"),
    ]
    for text, message in cases:
        if text is None:
            manifest.unlink()
        else:
            manifest.write_text(text)
        with pytest.raises(ConfigError, match=message):
            _train(tiny_target, [train_npz], tmp_path / "out", steps=1, teacher_cache=str(cache))


def test_cache_for_other_target_data_or_settings_is_refused(tiny_target, tiny_draft, train_npz, eval_npz, tmp_path):
    other_target = _cache(tiny_draft, [train_npz], tmp_path / "other", top_k=8)  # same shapes, other weights
    with pytest.raises(ConfigError, match="was built for target .* not for"):
        _train(tiny_target, [train_npz], tmp_path / "out", steps=1, teacher_cache=str(other_target))

    cache = _cache(tiny_target, [train_npz], tmp_path / "cache", top_k=8)
    with pytest.raises(ConfigError, match=r"other token files \(train.npz\)"):
        _train(tiny_target, [eval_npz], tmp_path / "out", steps=1, teacher_cache=str(cache))
    with pytest.raises(ConfigError, match="other token files"):  # the same files in another order
        _train(tiny_target, [eval_npz, train_npz], tmp_path / "out", steps=1, teacher_cache=str(cache))
    with pytest.raises(ConfigError, match="--seq-len 24, not 16"):
        _train(tiny_target, [train_npz], tmp_path / "out", steps=1, seq_len=16, teacher_cache=str(cache))
    with pytest.raises(ConfigError, match="no target features"):
        _train(tiny_target, [train_npz], tmp_path / "out", head="eagle", steps=1, teacher_cache=str(cache))
    assert not (tmp_path / "out").exists()


def test_top_k_mismatch_is_refused(tiny_target, train_npz, tmp_path):
    cache = _cache(tiny_target, [train_npz], tmp_path / "cache", top_k=16)
    with pytest.raises(ConfigError, match="--top-k 16, not 32"):
        _cache(tiny_target, [train_npz], cache, top_k=32, resume=True)
    with pytest.raises(ConfigError, match="--dtype float32, not float16"):
        _cache(tiny_target, [train_npz], cache, top_k=16, dtype="float16", resume=True)
    windows = np.load(cache / "windows.npy")
    with pytest.raises(ConfigError, match="--top-k 16, not 8"):
        open_cache(cache, {"top_k": 8}, windows)
    assert open_cache(cache, {"top_k": 16}, windows).manifest["top_k"] == 16


def test_interrupted_build_resumes_to_the_same_bytes(tiny_target, train_npz, tmp_path, monkeypatch):
    settings = dict(top_k=16, features=True)
    straight = _cache(tiny_target, [train_npz], tmp_path / "a", **settings)
    num_windows = json.loads((straight / "manifest.json").read_text())["num_windows"]
    real, calls = B.teacher_pass, []

    def crash_on_fourth(*args, **kwargs):
        if len(calls) == 3:
            raise Interrupted  # as if the process were killed during the fourth batch
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(B, "teacher_pass", crash_on_fourth)
    with pytest.raises(Interrupted):
        _cache(tiny_target, [train_npz], tmp_path / "b", **settings)
    resumed = tmp_path / "b"
    assert json.loads((resumed / "manifest.json").read_text())["windows_done"] == 3 * BATCH
    assert not np.array_equal(np.load(resumed / "topk_ids.npy"), np.load(straight / "topk_ids.npy"))  # control
    with pytest.raises(ConfigError, match=f"incomplete \\({3 * BATCH} of {num_windows} windows\\)"):
        _train(tiny_target, [train_npz], tmp_path / "out", steps=1, teacher_cache=str(resumed))
    with pytest.raises(ConfigError, match="already exists; pass --resume"):
        _cache(tiny_target, [train_npz], resumed, **settings)

    calls.clear()
    monkeypatch.setattr(B, "teacher_pass", lambda *a, **k: calls.append(1) or real(*a, **k))
    _cache(tiny_target, [train_npz], resumed, resume=True, **settings)
    assert len(calls) == math.ceil((num_windows - 3 * BATCH) / BATCH)  # only the batches not yet done
    for name in ARRAYS:
        assert (resumed / f"{name}.npy").read_bytes() == (straight / f"{name}.npy").read_bytes(), name


def test_cli_cache_then_distill(tiny_target, train_npz, eval_npz, tmp_path, capsys):
    cache, t, data = tmp_path / "cache", str(tiny_target), str(train_npz)
    common = ["--target", t, "--data", data, "--seq-len", str(SEQ_LEN), "--no-progress"]
    assert main(["distill", "cache", *common, "--out", str(cache), "--top-k", "8", "--features"]) == 0
    assert "teacher cache written to" in capsys.readouterr().out
    draft = ["distill", *common, "--steps", "2", "--batch-size", "4", "--layers", "1", "--teacher-cache", str(cache)]
    assert main([*draft, "--out", str(tmp_path / "d"), "--eval-data", str(eval_npz)]) == 0  # scored on the fly
    manifest = json.loads((tmp_path / "d" / "manifest.json").read_text())
    assert manifest["teacher_cache"] == str(cache.resolve()) and manifest["eval"]["tokens"] > 0
    heads = ["distill", *common, "--steps", "2", "--batch-size", "4", "--head", "eagle", "--teacher-cache", str(cache)]
    assert main([*heads, "--out", str(tmp_path / "h")]) == 0
    capsys.readouterr()

    bad = write_npz(tmp_path / "bad.npz", bad_id=VOCAB)
    errors = [
        (["--target", t, "--data", data, "--out", str(cache)], "already exists; pass --resume"),
        (["--target", t, "--data", str(tmp_path / "nope.npz"), "--out", str(tmp_path / "x")], "data file not found"),
        (["--target", t, "--data", str(bad), "--out", str(tmp_path / "x")], f"token id {VOCAB} is outside"),
        (["--target", t, "--data", data, "--out", str(tmp_path / "x"), "--resume"], "no teacher cache in"),
    ]
    for argv, message in errors:
        assert main(["distill", "cache", *argv, "--no-progress"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and message in err and "Traceback" not in err, err
    assert not (tmp_path / "x").exists()


def test_bench_writes_json(tiny_target, train_npz, tmp_path, capsys):
    out = tmp_path / "bench.json"
    argv = ["--target", str(tiny_target), "--data", str(train_npz), "--samples", "10", "--seq-len", str(SEQ_LEN)]
    argv += ["--init-from-target", "--freeze-embeddings", "--draft-vocab", str(SUBSET)]  # the shipped draft's flags
    argv += ["--steps", "2", "--warmup", "1", "--layers", "1", "--rounds", "2", "--output", str(out)]
    assert bench.main(argv) == 0
    result = json.loads(out.read_text())
    assert len(result["from_cache"]["rounds_tokens_per_s"]) == 2
    for mode in ("build", "on_the_fly_padded", "on_the_fly", "from_cache"):
        assert result[mode]["tokens_per_s"] > 0 and result[mode]["tokens"] > 0, mode
    tokens = {result[mode]["tokens"] for mode in ("on_the_fly_padded", "on_the_fly", "from_cache")}
    assert len(tokens) == 1  # the same batches, every way
    assert result["settings"]["draft_vocab"] == SUBSET and result["settings"]["freeze_embeddings"]
    assert "from cache" in capsys.readouterr().out


def test_bench_of_heads_has_no_padded_arm(tiny_target, train_npz, tmp_path):
    """Heads always train one window a row: their bench compares the cache with that one on-the-fly arm."""
    out = tmp_path / "bench.json"
    argv = ["--target", str(tiny_target), "--data", str(train_npz), "--samples", "10", "--seq-len", str(SEQ_LEN)]
    argv += ["--head", "eagle", "--steps", "2", "--warmup", "1", "--rounds", "1", "--bf16", "--output", str(out)]
    assert bench.main(argv) == 0
    result = json.loads(out.read_text())
    assert "on_the_fly_padded" not in result
    assert result["from_cache_bf16"]["tokens"] == result["on_the_fly"]["tokens"] > 0


def test_bf16_teacher_cache_is_close_recorded_and_not_mixed(tiny_target, train_npz, tmp_path):
    """--teacher-dtype bfloat16 runs the target in bf16: the cache records it, stays close to the fp32 teacher
    (not equal to it: the bitwise check is the control that the dtype was applied), trains a head, and an fp32
    build is refused to resume it."""
    settings = dict(top_k=16, features=True)
    exact = _cache(tiny_target, [train_npz], tmp_path / "fp32", **settings)
    fast = _cache(tiny_target, [train_npz], tmp_path / "bf16", teacher_dtype="bfloat16", **settings)
    assert json.loads((fast / "manifest.json").read_text())["target"]["dtype"] == "bfloat16"
    a, b = np.load(exact / "features.npy"), np.load(fast / "features.npy")
    assert not np.array_equal(a, b)
    assert np.abs(a - b).max() / np.abs(a).max() < 0.05
    top_a, top_b = np.load(exact / "topk_ids.npy")[:, 0], np.load(fast / "topk_ids.npy")[:, 0]
    assert (top_a == top_b).mean() > 0.9
    head = _train(tiny_target, [train_npz], tmp_path / "head", head="eagle", steps=2, teacher_cache=str(fast))
    assert head.manifest["teacher_dtype"] == "bfloat16"
    with pytest.raises(ConfigError, match="--teacher-dtype bfloat16, not float32"):
        _cache(tiny_target, [train_npz], fast, resume=True, **settings)
    with pytest.raises(ConfigError, match="unknown --teacher-dtype"):
        CacheConfig(target=str(tiny_target), data=[str(train_npz)], out=str(tmp_path / "x"), teacher_dtype="int8")
