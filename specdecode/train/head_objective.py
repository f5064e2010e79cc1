"""What draft heads minimise, teacher-forced on the target's own features and distributions.

Positions: the target's feature at i (post-norm) and its logits at j (which predict token j + 1). Medusa head d
and MTP depth d guess token i + d + 2 from position i, so they learn the target's distribution at i + d + 1.
EAGLE reads (f_i, token i + 1) and learns f_{i + 1} (smooth L1) and the distribution at i + 1 (KL, weight 0.1
as in the EAGLE paper). KL is forward, KL(p_target || q_head): acceptance is sum_x min(p, q).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from specdecode.models.llama import AttentionMetadata
from specdecode.train.topk import TopKTeacher
from specdecode.train.topk_kl import topk_kl

EAGLE_KL_WEIGHT = 0.1


@dataclass
class HeadStats:
    loss: torch.Tensor  # [] what is minimised
    accuracy: list[float]  # per head/depth: argmax agreement with the target's argmax
    num_tokens: int  # positions scored by the first head


@dataclass
class Teacher:
    """One batch as the target sees it."""

    features: torch.Tensor  # [B, T, H] post-norm
    log_p: torch.Tensor | TopKTeacher  # [B, T, V] the target's log-probabilities of the next token, or [B, T] top-k
    input_ids: torch.Tensor  # [B, T] int64
    mask: torch.Tensor  # [B, T] bool: the next token is a response token


def _kl_at(
    student: torch.Tensor, log_p: torch.Tensor | TopKTeacher, lm_head: torch.Tensor
) -> tuple[torch.Tensor, float]:
    """student features [N, H] vs target log-probs [N, V] or a cached top-k [N] -> (KL, argmax agreement)."""
    logits = F.linear(student, lm_head)  # [N, V]
    if isinstance(log_p, TopKTeacher):  # from a teacher cache: KL over the top-k and one rest bucket
        kl, drafted = topk_kl(logits, log_p)
        return kl, (drafted == log_p.argmax()).float().mean().item()
    log_q = F.log_softmax(logits.float(), dim=-1)  # [N, V]
    kl = F.kl_div(log_q, log_p, log_target=True, reduction="batchmean")
    return kl, (log_q.argmax(-1) == log_p.argmax(-1)).float().mean().item()


def medusa_loss(heads: nn.Module, t: Teacher, lm_head: torch.Tensor) -> HeadStats:
    out = heads(t.features)  # [B, T, K, H]
    losses, accs, first = [], [], 0
    for d in range(out.shape[2]):
        s = d + 1  # the target's distribution at i + s is what head d predicts from i
        m = t.mask[:, s:]  # [B, T - s]
        kl, acc = _kl_at(out[:, : out.shape[1] - s, d][m], t.log_p[:, s:][m], lm_head)
        losses.append(kl)
        accs.append(acc)
        first = first or int(m.sum())
    return HeadStats(torch.stack(losses).mean(), accs, first)


def mtp_loss(heads: nn.Module, t: Teacher, lm_head: torch.Tensor, embed: nn.Embedding) -> HeadStats:
    state = t.features  # [B, T, H] h_0
    losses, accs, first = [], [], 0
    for d in range(len(heads.modules_by_depth)):
        s = d + 1
        tokens = t.input_ids[:, s:]  # [B, T - s] the token at depth d is i + s
        state = heads.forward_step(d, state[:, : tokens.shape[1]], tokens, embed)  # [B, T - s, H]
        m = t.mask[:, s:]
        kl, acc = _kl_at(state[m], t.log_p[:, s:][m], lm_head)
        losses.append(kl)
        accs.append(acc)
        first = first or int(m.sum())
    return HeadStats(torch.stack(losses).mean(), accs, first)


def eagle_loss(head: nn.Module, t: Teacher, lm_head: torch.Tensor, embed: nn.Embedding) -> HeadStats:
    b, n = t.input_ids.shape[0], t.input_ids.shape[1] - 1
    cache = head.new_cache(b, n)
    meta = AttentionMetadata.build(list(range(b)), [0] * b, n, t.features.device)
    pred = head(t.features[:, :n], t.input_ids[:, 1:], embed, meta, cache)  # [B, T - 1, H] guesses of f_{i+1}
    m = t.mask[:, 1:]  # [B, T - 1]
    kl, acc = _kl_at(pred[m], t.log_p[:, 1:][m], lm_head)
    reg = F.smooth_l1_loss(pred[m].float(), t.features[:, 1:][m].float())
    return HeadStats(reg + EAGLE_KL_WEIGHT * kl, [acc], int(m.sum()))


def head_loss(kind: str, heads: nn.Module, t: Teacher, lm_head: torch.Tensor, embed: nn.Embedding) -> HeadStats:
    if kind == "medusa":
        return medusa_loss(heads, t, lm_head)
    if kind == "mtp":
        return mtp_loss(heads, t, lm_head, embed)
    return eagle_loss(heads, t, lm_head, embed)
