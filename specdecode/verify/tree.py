"""Lossless verification of a token tree: the longest accepted root-to-leaf path, then one more token.

Walking down from the root, the children of the current node are tried in order (SpecInfer's multi-candidate
rule). Each round is exact speculative sampling of the current target distribution, so the token emitted
below a node is distributed exactly as the target's p there, provided each child was drawn independently of
its siblings' fates (i.i.d. samples of q, or candidates fixed before verification, such as top-k).

- Deterministic children (q one-hot, every drafter's trees today) use the exponential race of verify.py: the
  target's own sample y below the current node (keyed by its absolute position, so shared by all nodes of a
  depth) accepts the first child equal to y, or is emitted when none is. That is SpecInfer's rule for one-hot
  candidates (try x1 with p(x1), then x2 with p(x2) / (1 - p(x1)), ...), and a seeded request gets the tokens
  of plain sampling whatever the tree.
- Sampled children (q a distribution): child x, drawn from q_x, is accepted with probability
  min(1, p(x) / q_x(x)); on rejection p becomes normalize(max(0, p - q_x)) before the next sibling is tried.
  When a node's children are all rejected, the recovered token comes from the last residual; below an
  accepted leaf the bonus comes from p.

Greedy rows have one-hot p, which reduces both rules to following the target's argmax.
"""

from __future__ import annotations

import torch

from specdecode.verify.chain import VerifyResult, residual
from specdecode.verify.sampling import PAD_TOKEN_ID, SamplingTensors, check_finite, process_logits
from specdecode.verify.streams import Purpose, exponentials, race, sample, uniforms
from specdecode.verify.tree_layout import node_depths


class _Race:
    """Deterministic children: a child is accepted iff it is the target's own sample below the current node."""

    def __init__(self, p: torch.Tensor, parents: torch.Tensor, num_nodes: torch.Tensor, st: SamplingTensors) -> None:
        vocab = p.shape[-1]
        if st.all_greedy:
            self.below = p.argmax(-1)  # [num_seqs, N + 1]
        else:
            depth = node_depths(parents, num_nodes)  # [num_seqs, N + 1]; a node's children sit at depth + 1
            # One host sync (the tree's depth): noise per depth, not per node, keeps the draw small for wide trees.
            noise = exponentials(st, Purpose.TARGET, range(int(depth.max()) + 1), vocab)  # [num_seqs, levels, vocab]
            self.below = race(p, noise.gather(1, depth[..., None].expand(-1, -1, vocab)))  # [num_seqs, N + 1]
        self.rows = torch.arange(p.shape[0], device=p.device)

    def try_child(self, j: int, x: torch.Tensor, live: torch.Tensor, cur: torch.Tensor) -> torch.Tensor:
        return live & (x == self.below[self.rows, cur])

    def final(self, cur: torch.Tensor) -> torch.Tensor:
        return self.below[self.rows, cur]


class _Rejection:
    """Sampled children: accept with min(1, p / q), move p to the normalised residual on each rejection."""

    def __init__(self, p: torch.Tensor, draft_probs: torch.Tensor, st: SamplingTensors) -> None:
        self.p, self.q, self.st = p, draft_probs, st
        self.u = uniforms(st, Purpose.ACCEPT, range(draft_probs.shape[1]))[..., 0]  # [num_seqs, N]
        self.p_cur = p[:, 0]  # [num_seqs, vocab] the (residual) target distribution below the current node

    def try_child(self, j: int, x: torch.Tensor, live: torch.Tensor, cur: torch.Tensor) -> torch.Tensor:
        q_j = self.q[:, j]  # [num_seqs, vocab]
        accept = live & (self.u[:, j] * q_j.gather(-1, x[:, None])[:, 0] < self.p_cur.gather(-1, x[:, None])[:, 0])
        reject = live & ~accept
        self.p_cur = torch.where(reject[:, None], residual(self.p_cur, q_j), self.p_cur)
        self.p_cur = torch.where(accept[:, None], self.p[:, j + 1], self.p_cur)
        return accept

    def final(self, cur: torch.Tensor) -> torch.Tensor:
        return sample(self.p_cur, self.st, Purpose.RECOVER)


def verify_tree(
    target_logits: torch.Tensor,  # [num_seqs, N + 1, vocab] raw logits at tree positions (root, nodes 1..N)
    draft_token_ids: torch.Tensor,  # [num_seqs, N] int64, PAD past num_nodes
    parents: torch.Tensor,  # [num_seqs, N] int64 parent positions, valid per tree.check_parents (Proposal checks)
    num_nodes: torch.Tensor,  # [num_seqs] int64
    draft_probs: torch.Tensor | None,  # [num_seqs, N, vocab] q each node was drawn from; None = one-hot
    st: SamplingTensors,
) -> VerifyResult:
    check_finite(target_logits)
    num_seqs, width, _ = target_logits.shape
    n = width - 1
    device = target_logits.device
    p = process_logits(target_logits, st)  # [num_seqs, N + 1, vocab]
    drafts = draft_token_ids.clamp(min=0)  # [num_seqs, N]
    valid = torch.arange(n, device=device)[None] < num_nodes[:, None]  # [num_seqs, N]
    one_hot = draft_probs is None or st.all_greedy or n == 0
    rule = _Race(p, parents, num_nodes, st) if one_hot else _Rejection(p, draft_probs, st)
    rows = torch.arange(num_seqs, device=device)
    cur = torch.zeros(num_seqs, dtype=torch.long, device=device)  # tree position of the deepest accepted node
    depth = torch.zeros(num_seqs, dtype=torch.long, device=device)  # accepted nodes so far
    path = torch.full((num_seqs, n + 1), PAD_TOKEN_ID, dtype=torch.long, device=device)  # one spare column
    for j in range(n):  # topological order: a node's children all come after it, siblings in proposal order
        live = valid[:, j] & (parents[:, j] == cur)  # [num_seqs] node j is a child of the current node
        accept = rule.try_child(j, drafts[:, j], live, cur)  # [num_seqs]
        path[rows, depth] = torch.where(accept, j, path[rows, depth])
        depth = depth + accept.long()
        cur = torch.where(accept, j + 1, cur)
    final = rule.final(cur)  # [num_seqs]
    path = path[:, :n]  # [num_seqs, N]
    out = torch.where(path >= 0, drafts.gather(1, path.clamp(min=0)), PAD_TOKEN_ID)  # [num_seqs, N]
    out = torch.cat([out, torch.full((num_seqs, 1), PAD_TOKEN_ID, device=device, dtype=torch.long)], 1)
    out.scatter_(1, depth[:, None], final[:, None])  # [num_seqs, N + 1]
    return VerifyResult(out, depth, path)
