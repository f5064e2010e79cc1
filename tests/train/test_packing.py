"""Packed batches (a batch's short windows sharing rows) train exactly what padded ones do: the same loss at
every step, on the fly and from a teacher cache, because each window attends to itself only, from position 0.
The controls run the same training with the packed rows' positions withheld, or with transformers' KV cache
left on (which turns off its packed-sequence masking): windows then see their row-mates and the losses part."""

from __future__ import annotations

import numpy as np
import pytest

from specdecode.train import data as D
from specdecode.train import distill as distill_mod
from specdecode.train.build_cache import CacheConfig, build_cache
from specdecode.train.distill import DistillConfig, distill
from specdecode.train.draft_config import DraftOptions

SEQ_LEN, BATCH, STEPS = 48, 4, 4  # samples of 16-35 tokens: two often share a row
RUN = dict(batch_size=BATCH, seq_len=SEQ_LEN, warmup=2, steps=STEPS, progress=False, draft=DraftOptions(num_layers=1))


def _losses(target, data, out, pack: bool, cache=None) -> np.ndarray:
    cfg = DistillConfig(target=str(target), data=[str(data)], out=str(out), pack=pack, teacher_cache=cache, **RUN)
    return np.array(distill(cfg).losses)


def _fault(monkeypatch, fault: str | None) -> None:
    real = distill_mod.model_inputs

    def faulty(batch, device):
        inputs = real(batch, device)
        if fault == "positions withheld":
            inputs.pop("position_ids", None)
        else:
            inputs["use_cache"] = True
        return inputs

    if fault is not None:
        monkeypatch.setattr(distill_mod, "model_inputs", faulty)


def test_the_data_packs(train_npz):
    """The fixture's samples (16-35 tokens, one window each) share rows at most steps: the comparisons below
    exercise packing."""
    samples = D.load_samples([train_npz], 96)
    stream = D.batches(samples, D.window_starts(samples, SEQ_LEN), SEQ_LEN, BATCH, seed=0, pack=True)
    shared = [next(stream).position_ids is not None for _ in range(STEPS)]
    assert sum(shared) >= STEPS - 1, shared


@pytest.mark.parametrize("fault", [None, "positions withheld", "kv cache on"])
@pytest.mark.parametrize("source", ["on the fly", "cache"])
def test_packed_training_equals_padded(source, fault, tiny_target, train_npz, tmp_path, monkeypatch):
    cache = None
    if source == "cache":
        cfg = CacheConfig(
            target=str(tiny_target), data=[str(train_npz)], out=str(tmp_path / "cache"), seq_len=SEQ_LEN,
            batch_size=BATCH, dtype="float32", top_k=8, progress=False,
        )  # fmt: skip
        cache = str(build_cache(cfg).out)
    padded = _losses(tiny_target, train_npz, tmp_path / "padded", pack=False, cache=cache)
    _fault(monkeypatch, fault)
    packed = _losses(tiny_target, train_npz, tmp_path / "packed", pack=True, cache=cache)
    gap = np.abs(packed - padded).max()
    if fault is None:
        assert gap < 1e-5, gap
    else:
        assert gap > 1e-3, gap  # > 100x the tolerance


@pytest.mark.parametrize("fault", [None, "rows attend to each other", "window order not restored"])
def test_packed_cache_equals_padded(fault, tiny_target, train_npz, tmp_path, monkeypatch):
    """`distill cache` packs too: every array (top-k log-probs and ids, rest mass, features) equals the padded
    build's, window by window. Controls: packed rows without the per-window mask, or the rows left in packed
    order, miss by far more than float rounding."""
    import specdecode.train.build_cache as B

    def build(out, pack):
        cfg = CacheConfig(
            target=str(tiny_target), data=[str(train_npz)], out=str(tmp_path / out), seq_len=SEQ_LEN,
            batch_size=BATCH, dtype="float32", top_k=8, features=True, progress=False, pack=pack,
        )  # fmt: skip
        return build_cache(cfg).out

    padded = build("padded", False)
    if fault == "rows attend to each other":
        monkeypatch.setattr(B, "packed_attention", lambda batch, device: {})
    elif fault == "window order not restored":
        monkeypatch.setattr(B, "window_order", lambda counts, ids: np.arange(int(np.sum(counts))))
    packed = build("packed", True)
    gaps = {
        name: np.abs(np.load(packed / f"{name}.npy").astype(np.float64) - np.load(padded / f"{name}.npy")).max()
        for name in ("topk_logp", "log_rest", "features")
    }
    if fault is None:
        assert max(gaps.values()) < 1e-4, gaps
        np.testing.assert_array_equal(np.load(packed / "topk_ids.npy"), np.load(padded / "topk_ids.npy"))
    else:
        assert max(gaps.values()) > 1e-1, gaps  # > 1000x the tolerance
