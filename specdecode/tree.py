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


def check_parents(parents: torch.Tensor) -> None:
    """Every parent precedes its child (a topological order), so one pass over the nodes walks the tree."""
    k = parents.shape[1]
    pos = torch.arange(k, device=parents.device)[None]  # draft j is at tree position j + 1
    if bool(((parents < 0) | (parents > pos)).any()):
        raise ValueError("tree parents must satisfy 0 <= parents[:, j] <= j (topological order)")


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
    depth = torch.zeros((num_seqs, k + 1), dtype=torch.long, device=device)
    mask = torch.eye(k + 1, dtype=torch.bool, device=device).repeat(num_seqs, 1, 1)  # [num_seqs, N + 1, N + 1]
    for j in range(k):  # parents come first, so their rows are final when a child copies them
        depth[:, j + 1] = depth[rows, par[:, j]] + 1
        mask[:, j + 1] |= mask[rows, par[:, j]]
    return depth, mask
