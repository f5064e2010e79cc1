"""`specdecode distill --head eagle|medusa|mtp`: train draft heads on the target's teacher-forced features.

Usage:
    specdecode distill --head medusa --num-head-tokens 4 --target smollm2-135m-instruct \
        --data ../shared/data/distill/smollm2_135m_instruct_responses_part2.npz --out heads/medusa \
        --steps 400 --batch-size 4 --seq-len 256 --lr 1e-3

The target runs once per batch without gradients (our oneDNN-packed runtime on CPU) and gives the features
and distributions the heads learn from (head_objective.py); the heads share its frozen embedding and LM head.
With --teacher-cache (built by `distill cache --features`) both are read from the cache instead.
Same data windows, schedule, checkpoints and --resume as the draft distillation.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import torch

from specdecode.config import ConfigError
from specdecode.heads import HeadConfig, build_heads, load_heads, save_heads
from specdecode.models.llama import AttentionMetadata, LlamaModel, load_llama
from specdecode.models.loader import resolve_model_dir
from specdecode.train import data as D
from specdecode.train.checkpoint import load_checkpoint
from specdecode.train.head_objective import HeadStats, Teacher, head_loss
from specdecode.train.loop import run_steps, teacher_precision
from specdecode.train.objective import lr_factor
from specdecode.train.result import DistillResult
from specdecode.train.teacher_cache import open_for_training


@torch.no_grad()  # not inference_mode: its tensors could not enter the heads' autograd graph
def teacher_batch(target: LlamaModel, batch: D.Batch, device: torch.device) -> Teacher:
    ids = torch.from_numpy(batch.input_ids).to(device)  # [B, T]
    b, t = ids.shape
    meta = AttentionMetadata.build(list(range(b)), [0] * b, t, device)
    with teacher_precision(device):
        logits, hidden = target(ids, meta, target.new_cache(b, t), return_hidden=True)  # [B, T, V], [B, T, H]
    mask = torch.from_numpy(batch.loss_mask).to(device)
    return Teacher(hidden, logits.log_softmax(-1), ids, mask)


def _step(cfg, heads, target, lm_head, batch, device) -> HeadStats:
    t = teacher_batch(target, batch, device)
    return head_loss(cfg.head, heads, t, lm_head, target.embed, cfg.eagle_steps)


def evaluate_heads(cfg, heads, target, lm_head, samples: D.Samples, device) -> dict:
    windows = D.window_starts(samples, cfg.seq_len)[: cfg.eval_max_windows]
    heads.eval()
    hits, total = None, 0
    with torch.no_grad():
        for batch in D.eval_batches(samples, windows, cfg.seq_len, cfg.batch_size):
            s = _step(cfg, heads, target, lm_head, batch, device)
            acc = np.array(s.accuracy) * s.num_tokens
            hits, total = (acc if hits is None else hits + acc), total + s.num_tokens
    heads.train()
    return {"accuracy": (hits / max(total, 1)).tolist(), "tokens": int(total)}


def _initial_heads(path: str, target: LlamaModel, hcfg: HeadConfig) -> torch.nn.Module:
    """The heads at `path`, refused with one line unless they are of the kind and shape being trained."""
    module, got, _ = load_heads(path, target, "cpu", torch.float32)
    if (got.kind, got.num_heads) != (hcfg.kind, hcfg.num_heads):
        raise ConfigError(
            f"--init-heads {path} holds {got.num_heads} {got.kind} head(s), not {hcfg.num_heads} {hcfg.kind}"
        )
    return module


def train_heads(cfg, out: Path, device: torch.device):
    """Train, evaluate and write the heads for `cfg` (a DistillConfig with `head` set)."""
    target_dir = resolve_model_dir(cfg.target)
    target = load_llama(target_dir, device, torch.float32)
    target.requires_grad_(False)
    samples = D.load_samples(cfg.data, target.cfg.vocab_size)
    windows = D.window_starts(samples, cfg.seq_len)
    held_out = D.load_samples([cfg.eval_data], target.cfg.vocab_size) if cfg.eval_data else None
    cache = None
    if cfg.teacher_cache:
        cache = open_for_training(cfg.teacher_cache, cfg.target, target_dir, cfg.data, cfg.seq_len, windows, True)
    hcfg = HeadConfig(cfg.head, 1 if cfg.head == "eagle" else cfg.num_head_tokens, target.cfg)
    torch.manual_seed(cfg.seed)
    heads = build_heads(hcfg).to(device).train()
    if cfg.init_heads is not None:
        heads.load_state_dict(_initial_heads(cfg.init_heads, target, hcfg).state_dict())
    optimizer = torch.optim.AdamW(heads.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, cfg.warmup, cfg.steps))
    totals, start = {"tokens": 0, "loss_tokens": 0}, 0
    if cfg.resume:
        start, totals = load_checkpoint(out, heads, optimizer, scheduler)
    lm_head = target.lm_head_weight()

    def forward(batch: D.Batch) -> HeadStats:
        if cache is None:
            return _step(cfg, heads, target, lm_head, batch, device)
        return head_loss(cfg.head, heads, cache.head_teacher(batch, device), lm_head, target.embed, cfg.eagle_steps)

    losses, accs = run_steps(cfg, heads, forward, samples, windows, optimizer, scheduler, start, totals, cfg.head)
    eval_stats = evaluate_heads(cfg, heads, target, lm_head, held_out, device) if held_out is not None else None
    tail = slice(-20, None)
    manifest = {
        "command": cfg.command,
        "target": cfg.target,
        "kind": cfg.head,
        "num_heads": hcfg.num_heads,
        "eagle_steps": cfg.eagle_steps,
        "init_heads": str(Path(cfg.init_heads).resolve()) if cfg.init_heads else None,
        "data": [str(Path(p).resolve()) for p in cfg.data],
        "eval_data": str(Path(cfg.eval_data).resolve()) if cfg.eval_data else None,
        "teacher_cache": str(Path(cfg.teacher_cache).resolve()) if cfg.teacher_cache else None,
        "teacher_dtype": "float32" if cache is None else cache.manifest["target"].get("dtype", "float32"),
        "steps": cfg.steps,
        "batch_size": cfg.batch_size,
        "seq_len": cfg.seq_len,
        "lr": cfg.lr,
        "seed": cfg.seed,
        "bf16": cfg.bf16,
        "tokens_seen": int(totals["tokens"]),
        "train_seconds": round(totals.get("seconds", 0.0), 3),
        "final_loss": float(np.mean(losses[tail])) if losses else None,
        "final_accuracy": np.mean(accs[tail], axis=0).tolist() if accs else None,
        "eval": eval_stats,
        "parameters": sum(p.numel() for p in heads.parameters()),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    save_heads(heads, hcfg, out, manifest)
    first_acc = [a[0] for a in accs]
    return DistillResult(out, losses, first_acc, manifest)
