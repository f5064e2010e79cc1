"""Lossless verification of a token tree: the longest accepted root-to-leaf path, then one more token.

Walking down from the root, the children of the current node are tried in order (SpecInfer's multi-candidate
rule): child x, drawn from q_x (one-hot for deterministic candidates), is accepted with probability
min(1, p(x) / q_x(x)); on rejection p becomes normalize(max(0, p - q_x)) before the next sibling is tried.
Each round is exact speculative sampling of the current p, so the token emitted below a node is distributed
exactly as the target's p there, provided each child was drawn independently of its siblings' fates
(i.i.d. samples of q, or candidates fixed before verification, such as top-k). When a node's children are all
rejected, the recovered token comes from the last residual; below an accepted leaf the bonus comes from p.
Greedy rows have one-hot p, which reduces the rule to following the target's argmax.
"""

from __future__ import annotations

import torch

from specdecode.sampling import (
    PAD_TOKEN_ID,
    SamplingTensors,
    check_finite,
    draw_uniform,
    process_logits,
    sample_from_probs,
)
from specdecode.verify import VerifyResult


def _residual(p_cur: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """normalize(max(0, p - q)) per row; p itself where nothing is left (p == q). All [num_seqs, vocab]."""
    res = (p_cur - q).clamp(min=0)
    total = res.sum(-1, keepdim=True)
    return torch.where(total > 0, res / total.clamp(min=1e-30), p_cur)


def verify_tree(
    target_logits: torch.Tensor,  # [num_seqs, N + 1, vocab] raw logits at tree positions (root, nodes 1..N)
    draft_token_ids: torch.Tensor,  # [num_seqs, N] int64, PAD past num_nodes
    parents: torch.Tensor,  # [num_seqs, N] int64 tree position of each node's parent (see specdecode/tree.py)
    num_nodes: torch.Tensor,  # [num_seqs] int64
    draft_probs: torch.Tensor | None,  # [num_seqs, N, vocab] q each node was drawn from; None = one-hot
    st: SamplingTensors,
) -> VerifyResult:
    check_finite(target_logits)
    num_seqs, width, vocab = target_logits.shape
    n = width - 1
    device = target_logits.device
    p = process_logits(target_logits, st)  # [num_seqs, N + 1, vocab]
    drafts = draft_token_ids.clamp(min=0)  # [num_seqs, N]
    valid = torch.arange(n, device=device)[None] < num_nodes[:, None]  # [num_seqs, N]
    u = torch.zeros((num_seqs, n), device=device) if st.all_greedy or not n else draw_uniform(st.generators, n, device)
    rows = torch.arange(num_seqs, device=device)
    cur = torch.zeros(num_seqs, dtype=torch.long, device=device)  # tree position of the deepest accepted node
    depth = torch.zeros(num_seqs, dtype=torch.long, device=device)  # accepted nodes so far
    p_cur = p[:, 0]  # [num_seqs, vocab] the (residual) target distribution below `cur`
    path = torch.full((num_seqs, n + 1), PAD_TOKEN_ID, dtype=torch.long, device=device)  # one spare column
    for j in range(n):  # topological order: a node's children all come after it, siblings in proposal order
        x = drafts[:, j]  # [num_seqs]
        live = valid[:, j] & (parents[:, j] == cur)  # [num_seqs] node j is a child of the current node
        q_j = (
            torch.zeros_like(p_cur).scatter_(-1, x[:, None], 1.0) if draft_probs is None else draft_probs[:, j]
        )  # [num_seqs, vocab]
        accept = live & (u[:, j] * q_j.gather(-1, x[:, None])[:, 0] < p_cur.gather(-1, x[:, None])[:, 0])
        reject = live & ~accept
        p_cur = torch.where(reject[:, None], _residual(p_cur, q_j), p_cur)
        p_cur = torch.where(accept[:, None], p[:, j + 1], p_cur)
        path[rows, depth] = torch.where(accept, j, path[rows, depth])
        depth = depth + accept.long()
        cur = torch.where(accept, j + 1, cur)
    final = p_cur.argmax(-1) if st.all_greedy else sample_from_probs(p_cur, st.generators)  # [num_seqs]
    path = path[:, :n]  # [num_seqs, N]
    out = torch.where(path >= 0, drafts.gather(1, path.clamp(min=0)), PAD_TOKEN_ID)  # [num_seqs, N]
    out = torch.cat([out, torch.full((num_seqs, 1), PAD_TOKEN_ID, device=device, dtype=torch.long)], 1)
    out.scatter_(1, depth[:, None], final[:, None])  # [num_seqs, N + 1]
    return VerifyResult(out, depth, path)
