"""Lossless verification of drafted tokens: greedy and sampled rows in one vectorised path.

For draft x at position j, accept with probability min(1, p_j(x) / q_j(x)); at the first rejection emit a
*recovered* token from normalize(max(0, p_j - q_j)); if every draft is accepted emit a *bonus* token from
p_k. Greedy rows have one-hot p, which reduces the rule to exact argmax matching.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdecode.sampling import (
    PAD_TOKEN_ID,
    SamplingTensors,
    check_finite,
    draw_uniform,
    process_logits,
    sample_from_probs,
)


@dataclass
class VerifyResult:
    output_token_ids: torch.Tensor  # [num_seqs, k + 1] accepted drafts, one recovered/bonus token, then PAD
    num_accepted: torch.Tensor  # [num_seqs] accepted drafts; emitted tokens = num_accepted + 1
    # [num_seqs, depth] draft index of each accepted node along a tree's path, PAD past num_accepted; None for
    # chains, whose accepted drafts are simply the first num_accepted.
    path: torch.Tensor | None = None


def verify(
    target_logits: torch.Tensor,  # [num_seqs, k + 1, vocab] raw logits at (pending, d_1..d_k)
    draft_token_ids: torch.Tensor,  # [num_seqs, k] int64, PAD past num_draft_tokens
    num_draft_tokens: torch.Tensor,  # [num_seqs] int64
    draft_probs: torch.Tensor | None,  # [num_seqs, k, vocab] processed q; None = one-hot on the drafts
    st: SamplingTensors,
) -> VerifyResult:
    check_finite(target_logits)
    num_seqs, width, vocab = target_logits.shape
    k = width - 1
    p = process_logits(target_logits, st)  # [num_seqs, k + 1, vocab]
    drafts = draft_token_ids.clamp(min=0)  # [num_seqs, k]
    valid = torch.arange(k, device=p.device)[None] < num_draft_tokens[:, None]  # [num_seqs, k]
    p_x = p[:, :k].gather(-1, drafts[..., None])[..., 0]  # [num_seqs, k]
    q_x = torch.ones_like(p_x) if draft_probs is None else draft_probs.gather(-1, drafts[..., None])[..., 0]
    # Greedy p is one-hot, so u plays no part: skip drawing it (and the noise below) when every row is greedy.
    u = torch.zeros_like(p_x) if st.all_greedy or not k else draw_uniform(st.generators, k, p.device)  # [num_seqs, k]
    accept = (u * q_x < p_x) & valid  # accept iff u < p/q, without dividing
    num_accepted = accept.long().cumprod(-1).sum(-1)  # [num_seqs] length of the accepted prefix
    # The final token: from the residual at the first rejection, or the bonus from p at num_draft.
    p_last = p.gather(1, num_accepted[:, None, None].expand(-1, 1, vocab))[:, 0]  # [num_seqs, vocab]
    rejected = num_accepted < num_draft_tokens  # [num_seqs]
    if k:
        idx = num_accepted.clamp(max=k - 1)[:, None, None].expand(-1, 1, vocab)
        q_last = (
            torch.zeros_like(p_last).scatter_(-1, drafts.gather(1, idx[:, :, 0])[:, :1], 1.0)
            if draft_probs is None
            else draft_probs.gather(1, idx)[:, 0]
        )  # [num_seqs, vocab]
        residual = (p_last - q_last).clamp(min=0)
        residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_last)  # p == q: sample p
        p_last = torch.where(rejected[:, None], residual, p_last)
    final = p_last.argmax(-1) if st.all_greedy else sample_from_probs(p_last, st.generators)  # [num_seqs]
    out = torch.where(accept.long().cumprod(-1).bool(), drafts, PAD_TOKEN_ID)  # [num_seqs, k]
    out = torch.cat([out, torch.full((num_seqs, 1), PAD_TOKEN_ID, device=p.device, dtype=torch.long)], 1)
    out.scatter_(1, num_accepted[:, None], final[:, None])
    return VerifyResult(out, num_accepted)
