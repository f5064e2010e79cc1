"""Token trees: the shape of a tree proposal and the attention it needs.

A proposal of N draft nodes per row sits at tree positions 1..N behind the root (position 0, the pending
token). `parents[b, j]` is the tree position of draft j's parent, always < j + 1, so nodes come in
topological order and a chain is simply parents = [0, 1, ..., N - 1]. Padded nodes (j >= num_nodes[b]) hang
off the root and are never accepted.
"""

from __future__ import annotations

import torch


def chain_parents(num_seqs: int, k: int, device: torch.device | str) -> torch.Tensor:
    """[num_seqs, k] int64 the parents of a chain: draft j follows tree position j."""
    return torch.arange(k, device=device).expand(num_seqs, k).clone()


def check_parents(parents: torch.Tensor, num_nodes: torch.Tensor) -> None:
    """Every real node's parent precedes it (0 <= parents[b, j] <= j: a topological order), so one pass over the
    nodes walks the tree. A drafter's malformed tree is a clear error here, not a silently wrong walk.
    parents: [num_seqs, N] int64, num_nodes: [num_seqs] int64 in 0..N."""
    k = parents.shape[1]
    pos = torch.arange(k, device=parents.device)[None]  # draft j is at tree position j + 1
    bad = ((parents < 0) | (parents > pos)) & (pos < num_nodes[:, None])  # [num_seqs, N]
    bad_count = (num_nodes < 0) | (num_nodes > k)  # [num_seqs]
    if bool(bad.any() | bad_count.any()):  # one host sync
        if bool(bad_count.any()):
            raise ValueError(f"malformed draft tree: node counts {num_nodes.tolist()} outside 0..{k}")
        b, j = bad.nonzero()[0].tolist()
        raise ValueError(
            f"malformed draft tree: row {b}, node {j} has parent {int(parents[b, j])}; "
            "a node's parent must be the root (0) or an earlier node (<= j)"
        )


def node_depths(parents: torch.Tensor, num_nodes: torch.Tensor) -> torch.Tensor:
    """[num_seqs, N + 1] int64 depth of each tree position (root 0; padded nodes hang off the root: 1).
    parents: [num_seqs, N] int64, num_nodes: [num_seqs] int64."""
    num_seqs, k = parents.shape
    valid = torch.arange(k, device=parents.device)[None] < num_nodes[:, None]  # [num_seqs, N]
    par = torch.where(valid, parents, 0)  # [num_seqs, N]
    rows = torch.arange(num_seqs, device=parents.device)
    depth = torch.zeros((num_seqs, k + 1), dtype=torch.long, device=parents.device)
    for j in range(k):  # parents come first, so their depths are final when a child reads them
        depth[:, j + 1] = depth[rows, par[:, j]] + 1
    return depth


def tree_layout(parents: torch.Tensor, num_nodes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Depths [num_seqs, N + 1] int64 (root 0) and the ancestor-or-self mask [num_seqs, N + 1, N + 1] bool.

    mask[b, i, j] says tree position i may attend to position j: the target scores every node in one
    forward, each seeing only its own root-to-node path. Padded nodes see the root and themselves.
    parents: [num_seqs, N] int64, num_nodes: [num_seqs] int64.
    """
    num_seqs, k = parents.shape
    device = parents.device
    valid = torch.arange(k, device=device)[None] < num_nodes[:, None]  # [num_seqs, N]
    par = torch.where(valid, parents, 0)  # [num_seqs, N]
    rows = torch.arange(num_seqs, device=device)
    mask = torch.eye(k + 1, dtype=torch.bool, device=device).repeat(num_seqs, 1, 1)  # [num_seqs, N + 1, N + 1]
    for j in range(k):  # parents come first, so their rows are final when a child copies them
        mask[:, j + 1] |= mask[rows, par[:, j]]
    return node_depths(parents, num_nodes), mask
