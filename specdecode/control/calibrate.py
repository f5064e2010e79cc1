"""Calibration: time real target forwards over a small (batch, tokens per row, context) grid and fit a CostModel.

Usage:
    python -m specdecode.control.calibrate --target smollm2-135m-instruct [--device cpu] [--dtype float32]

The profile lands in <cache_root>/calibration/<fingerprint>.json, where the goodput controller finds it.
The cache's K/V are left as zeros: attention costs the same whatever the values, so no prefill is needed.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from specdecode.control.cost import CostModel, load_or_default
from specdecode.models import quant_int8, quant_rows
from specdecode.models.disk_cache import cache_root
from specdecode.models.llama import AttentionMetadata, LlamaModel
from specdecode.models.quant_int8 import Int8QuantLinear
from specdecode.models.quant_rows import QuantLinear

# ~40 grid points x (1 warm-up + 3 timed) forwards: roughly 20-40 s for the 135M model on a few CPU cores.
BATCH_SIZES = (1, 2, 4, 8)
TOKENS_PER_ROW = (1, 2, 4, 8, 12)  # K + 1
CONTEXT_LENGTHS = (64, 512)


def model_fingerprint(model: LlamaModel) -> dict:
    """What a step-time profile depends on: the architecture and size, where it runs, and torch."""
    cfg = model.cfg
    fingerprint = {
        "model_type": cfg.model_type,
        # From the config: on CPU the linears are packed into oneDNN buffers, so parameters() undercounts.
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_heads": cfg.num_heads,
        "num_kv_heads": cfg.num_kv_heads,
        "num_layers": cfg.num_layers,
        "vocab_size": cfg.vocab_size,
        "device": model.device.type,
        "dtype": str(model.dtype).removeprefix("torch."),
        "torch": torch.__version__,
        "step": "compiled" if model.step.compiled else "eager",  # the compiled step's curve is another curve
    }
    kv = getattr(model, "kv_dtype", None)  # a bf16 cache (models/kv_dtype.py): attention at half the bytes
    if kv is not None:  # only then: fp32-cache fingerprints, and the profiles saved under them, stay as they were
        fingerprint["kv_dtype"] = str(kv).removeprefix("torch.")
    tp = getattr(model, "tensor_parallel_size", 1)  # a sharded target (engine/tensor_parallel.py) costs otherwise
    if tp > 1:  # only then: single-process fingerprints, and the profiles saved under them, stay as they were
        fingerprint["tensor_parallel_size"] = tp
    # GGUF blocks kept: another kernel, another curve (a sharded target is an fp32 module of another process).
    modules = list(model.modules()) if isinstance(model, torch.nn.Module) else []
    if any(isinstance(m, (QuantLinear, Int8QuantLinear)) for m in modules):
        fast = any(isinstance(m, Int8QuantLinear) for m in modules)
        fingerprint["weights"] = "quantized"
        if fast:  # the int8 arithmetic: a third curve
            fingerprint["arithmetic"] = "fast"
        fingerprint["kernel"] = kernel_digest((quant_int8 if fast else quant_rows).SOURCE)
    return fingerprint


def kernel_digest(source: Path) -> str:
    """A kernel source's hash: a profile timed on one kernel does not price another (the 1.5B's fast step went
    from 36 to 21 ms with the grouped-rows kernel, and goodput kept the old profile's prices: K = 0 throughout)."""
    return hashlib.sha256(source.read_bytes()).hexdigest()[:12]


def profile_path(model: LlamaModel) -> Path:
    fp = model_fingerprint(model)
    digest = hashlib.sha256(json.dumps(fp, sort_keys=True).encode()).hexdigest()[:12]
    name = f"{fp['model_type']}-{fp['num_layers']}x{fp['hidden_size']}-{fp['device']}-{fp['dtype']}-{digest}"
    return cache_root() / "calibration" / f"{name}.json"


def load_profile(model: LlamaModel) -> CostModel:
    """The target's calibration profile if one exists and matches, else the default prior (with a warning when
    a profile was there but unusable)."""
    return load_or_default(profile_path(model), model_fingerprint(model))


# The probe at load when no profile was saved: 24 timings, a few seconds for a 135M model on two cores. Token
# counts on both sides of the first knee (cost.KNEES), so the fit sees where the step stops being flat; batch 8,
# so that each row's cache read is told apart from the tokens' work (on the measured grid the fit's mean error
# went from 5.6% to 4.3%, and batch 8 at one token from +7% to +2%).
PROBE = {"batch_sizes": (1, 4, 8), "token_counts": (1, 3, 5, 9), "context_lengths": (64, 512), "repeats": 2}


def profile_or_probe(model: LlamaModel) -> CostModel:
    """The saved profile when one matches this model and machine; otherwise a short probe of the model as it
    steps now (compiled or eager), so that a new model or machine is priced by what it costs, not by a guess.
    The probe is saved where the next start finds it (the 1.5B's took 112 s of a 142 s second start); the
    controller's online correction heals a probe taken on a busy machine, and a full calibration replaces it."""
    cost = load_profile(model)
    if cost.fingerprint:
        return cost
    cost = calibrate(model, **PROBE)
    try:
        cost.save(profile_path(model))
    except OSError:  # a read-only cache: the probe still prices this run
        pass
    return cost


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def time_forward(model: LlamaModel, cache, num_seqs: int, tokens_per_row: int, context: int, repeats: int) -> float:
    """Median seconds of one padded [num_seqs, tokens_per_row] forward on top of `context` cached tokens."""
    device = model.device
    tokens = torch.randint(0, model.cfg.vocab_size, (num_seqs, tokens_per_row), device=device)  # [B, T]
    meta = AttentionMetadata.build(list(range(num_seqs)), [context] * num_seqs, tokens_per_row, device)
    model(tokens, meta, cache)  # warm-up: first call at a new shape pays allocation and kernel selection
    times = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        model(tokens, meta, cache)
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def calibrate(
    model: LlamaModel,
    device: torch.device | str | None = None,
    batch_sizes: Sequence[int] = BATCH_SIZES,
    token_counts: Sequence[int] = TOKENS_PER_ROW,
    context_lengths: Sequence[int] = CONTEXT_LENGTHS,
    repeats: int = 3,
) -> CostModel:
    """Time the grid and fit. `token_counts` are tokens per row (K + 1); N = B * tokens per row.

    `device` must be where the model lives (it is a check, not a move: moving weights is the caller's job)."""
    actual = model.device
    if device is not None and torch.device(device).type != actual.type:
        raise ValueError(f"model is on {actual}, asked to calibrate on {device}")
    cache = model.new_cache(max(batch_sizes), max(context_lengths) + max(token_counts))
    samples = [
        (b, b * t, c, time_forward(model, cache, b, t, c, repeats))
        for b in batch_sizes
        for t in token_counts
        for c in context_lengths
    ]
    return CostModel.fit(samples, model_fingerprint(model))


def run(model: LlamaModel) -> Path:
    """Calibrate the target as the engine steps it (the caller loads it as it would serve it: weights, arithmetic,
    cache dtype, compiled or eager: each is another profile, `model_fingerprint`) and write its profile; returns its
    path."""
    cost = calibrate(model)
    path = cost.save(profile_path(model))
    terms = ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in cost.to_json()["verify"].items())
    print(f"{path}: {terms}")
    return path
