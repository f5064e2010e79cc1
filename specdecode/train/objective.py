"""What the draft minimises: KL(p_target || q_draft) at response positions, plus optional hard-label CE.

Forward KL (not reverse) because speculative acceptance is sum_x min(p, q): the draft must put mass wherever
the target does. Token accuracy (draft argmax == target argmax) is the greedy acceptance rate per position.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specdecode.train.topk import TopKTeacher
from specdecode.train.topk_kl import topk_kl


@dataclass(frozen=True)
class StepStats:
    loss: torch.Tensor  # [] the scalar being minimised
    kl: float
    accuracy: float  # fraction of masked positions where the argmaxes agree
    num_tokens: int  # masked positions in the batch


def distill_loss(
    student_logits: torch.Tensor,  # [num_masked, S] at the masked positions, row-major: S = vocab or the subset's
    teacher_logits: torch.Tensor,  # [batch, seq_len, vocab]
    loss_mask: torch.Tensor,  # [batch, seq_len] bool
    labels: torch.Tensor,  # [batch, seq_len] int64
    ce_weight: float = 0.0,
    subset: torch.Tensor | None = None,  # [S] token ids the student drafts from (sorted), or None: all
) -> StepStats:
    """Mean over masked positions; only those positions are gathered (the student's already are), so the
    vocab-wide ops stay small.

    With a subset the student learns the target's distribution renormalised over it (the mass outside is lost
    to a draft that never proposes those tokens anyway); hard labels outside it are left out of the CE, and
    accuracy still compares with the target's argmax over the whole vocabulary.
    """
    q_log = F.log_softmax(student_logits.float(), dim=-1)  # [num_masked, S]
    teacher = teacher_logits[loss_mask].float()  # [num_masked, vocab]
    target_argmax = teacher.argmax(-1)  # [num_masked]
    if subset is not None:
        teacher = teacher[:, subset]  # [num_masked, S]
    p_log = F.log_softmax(teacher, dim=-1)  # [num_masked, S]
    kl = F.kl_div(q_log, p_log, log_target=True, reduction="batchmean")
    loss = kl
    if ce_weight > 0.0:
        loss = loss + ce_weight * F.nll_loss(q_log, _subset_labels(labels[loss_mask], subset), ignore_index=-100)
    agree = (_drafted(q_log, subset) == target_argmax).float().mean()
    return StepStats(loss, kl.item(), agree.item(), int(loss_mask.sum()))


def topk_distill_loss(
    student_logits: torch.Tensor,  # [num_masked, S] at the masked positions, row-major: S = vocab or the subset's
    teacher: TopKTeacher,  # [num_masked] the cached teacher at the masked positions, over the same S tokens
    loss_mask: torch.Tensor,  # [batch, seq_len] bool
    labels: torch.Tensor,  # [batch, seq_len] int64
    ce_weight: float = 0.0,
    subset: torch.Tensor | None = None,  # [S] token ids the student drafts from (sorted), or None: all
) -> StepStats:
    """distill_loss against a cached top-k teacher: the KL over its k tokens and one rest bucket (see topk.py),
    forward and backward fused (topk_kl.py). With a subset the cache holds the teacher renormalised over it, so
    this is distill_loss's subset objective."""
    kl, drafted = topk_kl(student_logits, teacher)  # [], [num_masked] column indices
    loss = kl
    if ce_weight > 0.0:
        labels = _subset_labels(labels[loss_mask], subset)  # [num_masked]
        loss = loss + ce_weight * F.cross_entropy(student_logits.float(), labels, ignore_index=-100)
    agree = (_token_ids(drafted, subset) == teacher.argmax()).float().mean()
    return StepStats(loss, kl.item(), agree.item(), int(loss_mask.sum()))


def _drafted(q_log: torch.Tensor, subset: torch.Tensor | None) -> torch.Tensor:
    """[n, S] student log-probs -> [n] the token ids it drafts greedily."""
    return _token_ids(q_log.argmax(-1), subset)


def _token_ids(columns: torch.Tensor, subset: torch.Tensor | None) -> torch.Tensor:
    """[n] columns of the draft vocabulary -> [n] token ids."""
    return columns if subset is None else subset[columns]


def _subset_labels(labels: torch.Tensor, subset: torch.Tensor | None) -> torch.Tensor:
    """[n] token ids -> [n] indices into the subset, -100 (ignored) for tokens outside it."""
    if subset is None:
        return labels
    pos = torch.searchsorted(subset, labels).clamp(max=len(subset) - 1)  # subset is sorted
    return torch.where(subset[pos] == labels, pos, torch.full_like(pos, -100))


def lr_factor(step: int, warmup: int, total: int, floor: float = 0.1) -> float:
    """Linear warmup to 1, then cosine decay to `floor` at `total` steps. `step` counts from 0."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
