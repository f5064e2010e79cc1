"""What draft heads minimise, teacher-forced on the target's own features and distributions.

Positions: the target's feature at i (post-norm) and its logits at j (which predict token j + 1). Medusa head d
and MTP depth d guess token i + d + 2 from position i, so they learn the target's distribution at i + d + 1.
EAGLE reads (f_i, token i + 1) and learns f_{i + 1} (smooth L1) and the distribution at i + 1 (KL, weight 0.1
as in the EAGLE paper); with eagle_steps > 1 it also learns from its own guesses, as it drafts deeper levels.
KL is forward, KL(p_target || q_head): acceptance is sum_x min(p, q).
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
EAGLE_STEP_DECAY = 0.8  # unrolled level s weighs 0.8 ** (s - 1), as HASS and EAGLE-3 weigh later levels less


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


def eagle_unrolled(
    head: nn.Module, features: torch.Tensor, input_ids: torch.Tensor, embed: nn.Embedding, steps: int
) -> list[torch.Tensor]:
    """The head's guesses [B, T - 1, H] at each of `steps` levels; level s's row i guesses f_{i+s}.

    Level 1 reads the target's features (f_i, t_{i+1}). Level s > 1 reads level s - 1's guess with the true token
    t_{i+s}, at RoPE position i + s - 1, and attends to level 1's keys up to i and its own ancestors' (the levels
    before it at row i): exactly what a depth-(s - 1) draft node sees behind a committed context ending at i
    (EAGLE-3's training-time test). Rows past T - s only pad; no real row attends to them.
    """
    b, n = input_ids.shape[0], input_ids.shape[1] - 1
    device = features.device
    cache = head.new_cache(b, n)
    meta = AttentionMetadata.build(list(range(b)), [0] * b, n, device)
    guesses = [head(features[:, :n], input_ids[:, 1:], embed, meta, cache)]  # [B, n, H] guesses of f_{i+1}
    rows = torch.arange(n, device=device)  # [n]
    for s in range(2, steps + 1):
        tokens = torch.zeros_like(input_ids[:, 1:])  # [B, n] t_{i+s}, zero-padded past the window
        tokens[:, : n - s + 1] = input_ids[:, s:]
        cache = _grown(head, cache, b, (s - 1) * n, s * n)
        start = torch.full((b,), (s - 1) * n, dtype=torch.long, device=device)
        meta = AttentionMetadata(
            slots=torch.arange(b, device=device),
            start=start,
            positions=(rows + s - 1).expand(b, n),
            kv_len=s * n,
            write_pos=(start[:, None] + rows).contiguous(),
        )
        attend = _unrolled_mask(n, s, device).expand(b, 1, n, s * n)
        guesses.append(head(guesses[-1], tokens, embed, meta, cache, attend=attend))
    return guesses


def _grown(head: nn.Module, cache, b: int, kept: int, max_len: int):
    """A new cache of `max_len` holding the first `kept` positions of `cache`, copied out of place: the earlier
    levels' attention saved views of the old one for backward, so it must never be written again."""
    grown = head.new_cache(b, max_len)
    grown.k[..., :kept, :] = cache.k[..., :kept, :]
    grown.v[..., :kept, :] = cache.v[..., :kept, :]
    return grown


def _unrolled_mask(n: int, s: int, device: torch.device) -> torch.Tensor:
    """[1, 1, n, s * n] bool: row i of level s sees level 1's keys 0..i and row i of levels 2..s."""
    i = torch.arange(n, device=device)[:, None]  # [n, 1]
    key = torch.arange(s * n, device=device)[None]  # [1, s * n] level (key // n) + 1, row key % n
    return torch.where(key < n, key % n <= i, key % n == i)[None, None]  # [1, 1, n, s * n]


def eagle_loss(head: nn.Module, t: Teacher, lm_head: torch.Tensor, embed: nn.Embedding, steps: int = 1) -> HeadStats:
    """Per level: smooth L1 to the target's feature plus 0.1 x KL, level s weighted EAGLE_STEP_DECAY ** (s - 1)."""
    losses, accs, first = [], [], 0
    for s, pred in enumerate(eagle_unrolled(head, t.features, t.input_ids, embed, steps), start=1):
        m = t.mask[:, s:]  # [B, T - s]: row i's guess of f_{i+s} is scored where t_{i+s+1} is a response token
        count = int(m.sum())
        if count == 0:  # a window shorter than the level: nothing to score
            accs.append(0.0)
            continue
        guess = pred[:, : m.shape[1]][m]  # [count, H]
        kl, acc = _kl_at(guess, t.log_p[:, s:][m], lm_head)
        reg = F.smooth_l1_loss(guess.float(), t.features[:, s:][m].float())
        losses.append(EAGLE_STEP_DECAY ** (s - 1) * (reg + EAGLE_KL_WEIGHT * kl))
        accs.append(acc)
        first = first or count
    return HeadStats(torch.stack(losses).sum(), accs, first)


def head_loss(
    kind: str, heads: nn.Module, t: Teacher, lm_head: torch.Tensor, embed: nn.Embedding, eagle_steps: int = 1
) -> HeadStats:
    if kind == "medusa":
        return medusa_loss(heads, t, lm_head)
    if kind == "mtp":
        return mtp_loss(heads, t, lm_head, embed)
    return eagle_loss(heads, t, lm_head, embed, eagle_steps)
