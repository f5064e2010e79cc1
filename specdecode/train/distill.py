"""Distil a small Llama draft from a target: the training loop.

Usage (the CLI wraps `distill`):
    specdecode distill --target smollm2-135m-instruct \
        --data ../shared/data/distill/smollm2_135m_instruct_responses_part1.npz --out drafts/smol-2l \
        --layers 2 --init-from-target --steps 2000 --batch-size 8 --seq-len 512 --device cuda

The teacher is the target itself, run teacher-forced over the data's own tokens; the student learns its full
next-token distribution at every response position (see objective.py). With --teacher-cache DIR (built once by
`specdecode distill cache`, see build_cache.py) the teacher's top-k distributions are read from DIR instead of
running the target on every batch (with --draft-vocab, from a cache built with the same --draft-vocab). Resuming
from OUT/checkpoint reaches the same weights as an uninterrupted run: batches are a function of (seed, step) and
all state is saved.
"""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import torch
import transformers

from specdecode.config import ConfigError
from specdecode.drafters.subset_head import frequent_tokens
from specdecode.models.loader import resolve_model_dir
from specdecode.train import data as D
from specdecode.train.checkpoint import CHECKPOINT_DIR, load_checkpoint
from specdecode.train.config import DistillConfig
from specdecode.train.draft_config import build_draft_config, freeze_embeddings, init_from_target, summary
from specdecode.train.export import write_draft_dir
from specdecode.train.heads import train_heads
from specdecode.train.loop import run_steps, teacher_precision
from specdecode.train.objective import StepStats, distill_loss, lr_factor, topk_distill_loss
from specdecode.train.result import DistillResult
from specdecode.train.teacher_cache import TeacherCache, open_for_training

LOG_WINDOW = 20  # the reported final loss/accuracy average this many last steps: one batch is noisy


def check_output(cfg: DistillConfig) -> Path:
    """Refuse before any work: an existing OUT needs --overwrite or --resume; --resume needs a checkpoint."""
    out = Path(cfg.out).expanduser()
    if out.exists() and not out.is_dir():
        raise ConfigError(f"output {out} exists and is not a directory")
    if cfg.resume and not (out / CHECKPOINT_DIR).is_dir():
        raise ConfigError(f"--resume: no checkpoint in {out / CHECKPOINT_DIR}")
    if out.exists() and not (cfg.resume or cfg.overwrite):
        raise ConfigError(f"output directory {out} already exists; pass --overwrite to replace it or --resume")
    return out


def training_device(name: str) -> torch.device:
    """The --device to train on, or a clear error (an unknown name, or CUDA where there is none)."""
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"unknown device {name!r}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda asked for, but no CUDA device is available")
    return device


def eos_ids(target_json: dict) -> list[int]:
    eos = target_json.get("eos_token_id")
    return [] if eos is None else [eos] if isinstance(eos, int) else list(eos)


def _load_teacher(target_dir: Path, device: torch.device):
    teacher = transformers.AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).to(device).eval()
    teacher.requires_grad_(False)
    return teacher


def _initial_draft(spec: str, draft_cfg) -> dict[str, torch.Tensor]:
    """The weights of the draft `spec` (a directory or a built-in draft name), refused with one line unless its
    architecture is the one being trained."""
    path = resolve_model_dir(spec)
    got = transformers.AutoConfig.from_pretrained(path)
    if summary(got) != summary(draft_cfg):
        raise ConfigError(f"--init-draft {spec} is a different draft: {summary(got)}, not {summary(draft_cfg)}")
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return model.state_dict()


def _build_student(cfg: DistillConfig, draft_cfg, teacher, device: torch.device):
    torch.manual_seed(cfg.seed)
    student = transformers.LlamaForCausalLM(draft_cfg)
    if cfg.draft.init_from_target and not init_from_target(student, teacher):
        raise ConfigError("--init-from-target: no draft tensor matches the target's shapes (try the default width)")
    if cfg.init_draft is not None:  # after --init-from-target: the draft's own weights win
        student.load_state_dict(_initial_draft(cfg.init_draft, draft_cfg))
    if cfg.draft.freeze_embeddings:
        freeze_embeddings(student)
    return student.to(device).train()


def _loss_tensors(batch: D.Batch, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """[batch, seq_len] each: the loss mask and the labels (the model's inputs are model_inputs)."""
    return torch.from_numpy(batch.loss_mask).to(device), torch.from_numpy(batch.labels).to(device)


def model_inputs(batch: D.Batch, device: torch.device) -> dict[str, torch.Tensor]:
    """A Hugging Face forward's inputs: the token ids, and for a packed batch its positions. With positions
    that restart inside a row and no cache, transformers attends each window to itself only (its
    padding-free "packed sequence" path), so use_cache is always off."""
    inputs = {"input_ids": torch.from_numpy(batch.input_ids).to(device), "use_cache": False}  # [batch, seq_len]
    if batch.position_ids is not None:
        inputs["position_ids"] = torch.from_numpy(batch.position_ids).to(device)  # [batch, seq_len]
    return inputs


def student_logits(
    student,
    inputs: dict[str, torch.Tensor],
    loss_mask: torch.Tensor,
    subset: torch.Tensor | None,
    rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """[num_masked, S] logits at the loss positions (in tensor[loss_mask] order) over the draft vocabulary
    (S = vocab without a subset). The LM head, most of a small draft's step, runs only where the loss reads it,
    and with a subset only on the subset's rows, as at inference; `rows` ([S, hidden]) are those rows gathered
    once beforehand (a frozen head, see frozen_rows)."""
    hidden = student.model(**inputs).last_hidden_state[loss_mask]  # [num_masked, hidden]
    if rows is None:
        rows = student.lm_head.weight if subset is None else student.lm_head.weight[subset]  # [S, hidden]
    return torch.nn.functional.linear(hidden, rows)


def frozen_rows(student, subset: torch.Tensor | None, bf16: bool) -> torch.Tensor | None:
    """[S, hidden] a frozen LM head's rows (its subset's), gathered once rather than every step, and under
    --bf16 cast once too (autocast would cast a tensor outside autograd again at every step); else None."""
    weight = student.lm_head.weight  # [vocab, hidden]
    if weight.requires_grad or (subset is None and not bf16):
        return None
    rows = weight.detach() if subset is None else weight[subset].detach()
    return rows.bfloat16() if bf16 else rows


def _forward(student, teacher, batch: D.Batch, device, ce_weight: float, subset, rows=None) -> StepStats:
    inputs = model_inputs(batch, device)
    mask, labels = _loss_tensors(batch, device)  # [batch, seq_len] each
    with torch.no_grad(), teacher_precision(device):
        teacher_logits = teacher(**inputs).logits  # [batch, seq_len, vocab]
    logits = student_logits(student, inputs, mask, subset, rows)  # [num_masked, S]
    return distill_loss(logits, teacher_logits, mask, labels, ce_weight, subset)


def _cached_forward(student, cache: TeacherCache, batch: D.Batch, device, ce_weight: float, subset, rows) -> StepStats:
    mask, labels = _loss_tensors(batch, device)  # [batch, seq_len] each
    teacher = cache.topk(batch.window_ids).to(device)  # [num_masked] top-k rows, in tensor[mask] order
    logits = student_logits(student, model_inputs(batch, device), mask, subset, rows)  # [num_masked, S]
    return topk_distill_loss(logits, teacher, mask, labels, ce_weight, subset)


def draft_subset(size: int | None, samples: D.Samples, target_json: dict) -> torch.Tensor | None:
    """[S] sorted token ids of --draft-vocab S: the most frequent response tokens, end-of-turn ids always in (a
    draft that can never propose the end of its answer wastes the last step of every request). `distill cache
    --draft-vocab` picks the same subset from the same data."""
    return None if size is None else frequent_tokens(samples.responses(), size, always=eos_ids(target_json))


def evaluate(student, teacher, samples: D.Samples, windows: np.ndarray, cfg: DistillConfig, device, subset) -> dict:
    """Held-out token accuracy and KL, weighted by masked positions."""
    student.eval()
    hits = kl = total = 0.0
    with torch.no_grad():
        for batch in D.eval_batches(samples, windows[: cfg.eval_max_windows], cfg.seq_len, cfg.batch_size):
            s = _forward(student, teacher, batch, device, 0.0, subset)
            hits, kl, total = hits + s.accuracy * s.num_tokens, kl + s.kl * s.num_tokens, total + s.num_tokens
    student.train()
    return {"accuracy": hits / max(total, 1), "kl": kl / max(total, 1), "tokens": int(total)}


def _manifest(cfg, target_dir, draft_cfg, student, totals, losses, accs, eval_stats) -> dict:
    tail = slice(-LOG_WINDOW, None)
    return {
        "command": cfg.command,
        "target": cfg.target,
        "target_dir": str(target_dir),
        "data": [str(Path(p).resolve()) for p in cfg.data],
        "eval_data": str(Path(cfg.eval_data).resolve()) if cfg.eval_data else None,
        "teacher_cache": str(Path(cfg.teacher_cache).resolve()) if cfg.teacher_cache else None,
        "steps": cfg.steps,
        "batch_size": cfg.batch_size,
        "seq_len": cfg.seq_len,
        "lr": cfg.lr,
        "ce_weight": cfg.ce_weight,
        "seed": cfg.seed,
        "tokens_seen": int(totals["tokens"]),
        "loss_tokens_seen": int(totals["loss_tokens"]),
        "train_seconds": round(totals.get("seconds", 0.0), 3),
        "final_loss": float(np.mean(losses[tail])) if losses else None,
        "final_accuracy": float(np.mean(accs[tail])) if accs else None,
        "eval": eval_stats,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "parameters": sum(p.numel() for p in student.parameters()),
        "trainable_parameters": sum(p.numel() for p in student.parameters() if p.requires_grad),
        "init_from_target": cfg.draft.init_from_target,
        "init_draft": str(resolve_model_dir(cfg.init_draft)) if cfg.init_draft else None,
        "freeze_embeddings": cfg.draft.freeze_embeddings,
        "draft_vocab": cfg.draft.vocab_subset,
        "bf16": cfg.bf16,
        "pack": cfg.pack,
        "draft_config": summary(draft_cfg),
    }


def distill(cfg: DistillConfig) -> DistillResult:
    """Validate everything, train, and write the draft directory to cfg.out."""
    out = check_output(cfg)
    device = training_device(cfg.device)
    if cfg.head is not None:
        if cfg.overwrite and out.exists():
            shutil.rmtree(out)
        return train_heads(cfg, out, device)
    target_dir = resolve_model_dir(cfg.target)
    target_json = json.loads((target_dir / "config.json").read_text())
    draft_cfg = build_draft_config(target_json, cfg.draft)
    samples = D.load_samples(cfg.data, draft_cfg.vocab_size)
    windows = D.window_starts(samples, cfg.seq_len)
    held_out = D.load_samples([cfg.eval_data], draft_cfg.vocab_size) if cfg.eval_data else None
    subset = draft_subset(cfg.draft.vocab_subset, samples, target_json)  # [S] or None
    cache = None
    if cfg.teacher_cache:
        args = (cfg.teacher_cache, cfg.target, target_dir, cfg.data, cfg.seq_len, windows)
        cache = open_for_training(*args, subset=subset)

    # with a cache the target is loaded only to copy weights from (--init-from-target) or score --eval-data
    needs_teacher = cache is None or cfg.draft.init_from_target or held_out is not None
    teacher = _load_teacher(target_dir, device) if needs_teacher else None
    student = _build_student(cfg, draft_cfg, teacher, device)
    if cache is not None and held_out is None:
        teacher = None  # its weights were only needed to initialise the student
    subset = None if subset is None else subset.to(device)
    params = [p for p in student.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, cfg.warmup, cfg.steps))
    totals = {"tokens": 0, "loss_tokens": 0}
    start = 0
    if cfg.resume:
        start, totals = load_checkpoint(out, student, optimizer, scheduler)
    elif out.exists():  # --overwrite, now that every input has been checked
        shutil.rmtree(out)

    rows = frozen_rows(student, subset, cfg.bf16)  # [S, hidden] or None

    def forward(batch: D.Batch) -> StepStats:
        if cache is None:
            return _forward(student, teacher, batch, device, cfg.ce_weight, subset, rows)
        return _cached_forward(student, cache, batch, device, cfg.ce_weight, subset, rows)

    losses, accs = run_steps(
        cfg, student, forward, samples, windows, optimizer, scheduler, start, totals, "distill", pack=cfg.pack
    )
    eval_stats = None
    if held_out is not None:
        windows = D.window_starts(held_out, cfg.seq_len)
        eval_stats = evaluate(student, teacher, held_out, windows, cfg, device, subset)
    manifest = _manifest(cfg, target_dir, draft_cfg, student, totals, losses, accs, eval_stats)
    write_draft_dir(out, student, target_dir, manifest, None if subset is None else subset.cpu().numpy())
    return DistillResult(out, losses, accs, manifest)
