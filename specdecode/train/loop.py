"""The optimisation loop shared by draft and head distillation: one step per batch, a progress bar, checkpoints.

`forward(batch)` returns the step's statistics (loss to minimise, accuracy, tokens the loss counts); the loop
owns backward, clipping, the optimizer and scheduler steps, the token totals, the time spent in steps (totals'
"seconds", excluding loading and checkpoints) and the checkpoint cadence.

With `bf16` (`distill --bf16`, HF Trainer's name) the forward runs under bf16 autocast: the student's matmuls
take bf16 inputs and accumulate in fp32, its weights, gradients and optimizer state stay fp32, and the losses
upcast their logits before any softmax. The teacher is never under it (`teacher_precision`): what the student
learns on the fly is the fp32 target's distribution, whatever precision it learns in (a teacher cache holds the
dtype it was built in: `distill cache --teacher-dtype`, recorded in its manifest and the trained heads').
It pays where the CPU multiplies bf16 natively (AVX512_BF16 or AMX; measured on a 2-core AMD EPYC,
results/distill_cache_bf16.json) or on a GPU; elsewhere autocast emulates bf16 and is slower.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from specdecode.train import data as D
from specdecode.train.checkpoint import save_checkpoint


def teacher_precision(device: torch.device) -> torch.autocast:
    """Autocast off: the teacher's forward inside a step always runs in its own (fp32) precision."""
    return torch.autocast(device.type, enabled=False)


def student_precision(device: torch.device, bf16: bool) -> torch.autocast:
    """The step's forward under bf16 autocast with `bf16`, else as is."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)


def run_steps(
    cfg: Any,  # DistillConfig: steps, batch_size, seq_len, seed, save_every, out, progress, device, bf16
    module: torch.nn.Module,
    forward: Callable[[D.Batch], Any],
    samples: D.Samples,
    windows: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    start: int,
    totals: dict,
    desc: str,
    pack: bool = False,
) -> tuple[list[float], list]:
    """Steps start..cfg.steps-1; updates `totals` in place. Returns per-step losses and accuracies. With `pack`
    the batches' windows share rows (data.py), which `forward` must then read through their position ids."""
    losses, accs = [], []
    bar = tqdm(range(start, cfg.steps), initial=start, total=cfg.steps, disable=not cfg.progress, desc=desc)
    stream = D.batches(samples, windows, cfg.seq_len, cfg.batch_size, cfg.seed, start_step=start, pack=pack)
    t0, tokens0 = time.perf_counter(), totals["tokens"]
    t_step = time.perf_counter()
    precision = student_precision(torch.device(cfg.device), cfg.bf16)
    for step, batch in zip(bar, stream, strict=False):
        with precision:
            stats = forward(batch)
        stats.loss.backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(stats.loss.item())
        accs.append(stats.accuracy)
        totals["tokens"] += batch.num_tokens
        totals["loss_tokens"] += stats.num_tokens
        totals["seconds"] = totals.get("seconds", 0.0) + time.perf_counter() - t_step  # older checkpoints lack it
        rate = (totals["tokens"] - tokens0) / max(time.perf_counter() - t0, 1e-9)
        bar.set_postfix(loss=f"{losses[-1]:.3f}", acc=_fmt(stats.accuracy), tok_s=f"{rate:.0f}")
        if (step + 1) % cfg.save_every == 0:
            save_checkpoint(Path(cfg.out).expanduser(), module, optimizer, scheduler, step + 1, totals)
        t_step = time.perf_counter()  # the next step's batch is drawn from here on
    bar.close()
    return losses, accs


def _fmt(accuracy: float | list[float]) -> str:
    """One accuracy, or one per head/depth joined by '/'."""
    values = accuracy if isinstance(accuracy, list) else [accuracy]
    return "/".join(f"{a:.3f}" for a in values)
