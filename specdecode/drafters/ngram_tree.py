"""N-gram lookup as a tree: every earlier continuation of the suffix, merged into a trie (suffix-tree style).

The chain lookup (ngram.py) bets on the latest occurrence only. Here all (up to `max_hits`) earlier
occurrences of the longest matching suffix vote: their continuations form a trie, each node counting the
occurrences that pass through it, and the `budget` most-travelled nodes are proposed. Counts never grow
down a path, so that selection is a tree. No model, no training; drafts are deterministic (q one-hot).
"""

from __future__ import annotations

import numpy as np
import torch

from specdecode.drafters.base import DrafterBase, Proposal
from specdecode.drafters.ngram import suffix_occurrences
from specdecode.step.sequence import Sequence
from specdecode.verify.sampling import PAD_TOKEN_ID, SamplingTensors


def suffix_hits(tokens: np.ndarray, n_min: int, n_max: int, max_hits: int) -> tuple[np.ndarray, int]:
    """Where the longest suffix n-gram (n_max down to n_min) occurred before, latest first; (starts of what
    followed each occurrence, n). Empty when no suffix recurs."""
    hits, n = suffix_occurrences(tokens, n_min, n_max)
    return (hits + n)[::-1][:max_hits], n


def continuation_trie(tokens: np.ndarray, starts: np.ndarray, depth: int) -> list[tuple[int, int, int, int]]:
    """Trie nodes (token, parent node index or -1, depth, count) of the continuations, in discovery order."""
    nodes: list[list[int]] = []
    children: dict[tuple[int, int], int] = {}
    for s in starts:  # latest first, so ties in count keep the most recent continuation ahead
        parent = -1
        for d, tok in enumerate(tokens[s : s + depth].tolist()):
            key = (parent, tok)
            if key not in children:
                children[key] = len(nodes)
                nodes.append([tok, parent, d + 1, 0])
            parent = children[key]
            nodes[parent][3] += 1
    return [tuple(n) for n in nodes]


def best_subtree(nodes: list[tuple[int, int, int, int]], budget: int) -> list[int]:
    """The `budget` most-travelled nodes, parents first (count never grows with depth; ties go shallower)."""
    order = sorted(range(len(nodes)), key=lambda i: (-nodes[i][3], nodes[i][2], i))
    return order[:budget]


class NgramTreeDrafter(DrafterBase):
    retryable_propose = True  # drafts depend on committed state only (drafters/base.py)

    def __init__(self, n_min: int = 1, n_max: int = 4, device: str = "cpu", max_hits: int = 32) -> None:
        self.n_min, self.n_max, self.device, self.max_hits = n_min, n_max, device, max_hits

    def _row(self, seq: Sequence, budget: int) -> tuple[list[int], list[int], list[float]]:
        """(tokens, parents as tree positions, confidence = share of occurrences through the node)."""
        tokens = np.asarray(seq.token_ids, dtype=np.int64)
        starts, _ = suffix_hits(tokens, self.n_min, self.n_max, self.max_hits)
        if not budget or not starts.size:
            return [], [], []
        nodes = continuation_trie(tokens, starts, budget)
        kept = best_subtree(nodes, budget)
        position = {-1: 0} | {node: j + 1 for j, node in enumerate(kept)}
        return (
            [nodes[i][0] for i in kept],
            [position[nodes[i][1]] for i in kept],
            [nodes[i][3] / len(starts) for i in kept],
        )

    def propose(self, seqs: list[Sequence], num_tokens: list[int], st: SamplingTensors) -> Proposal:
        rows = [self._row(s, k) for s, k in zip(seqs, num_tokens, strict=True)]
        width = max((len(r[0]) for r in rows), default=0)  # pad only to the largest tree found
        ids = torch.full((len(seqs), width), PAD_TOKEN_ID, dtype=torch.long)
        parents = torch.zeros((len(seqs), width), dtype=torch.long)
        conf = torch.zeros((len(seqs), width), dtype=torch.float32)
        for b, (toks, par, c) in enumerate(rows):
            ids[b, : len(toks)] = torch.tensor(toks, dtype=torch.long)
            parents[b, : len(par)] = torch.tensor(par, dtype=torch.long)
            conf[b, : len(c)] = torch.tensor(c, dtype=torch.float32)
        num = torch.tensor([len(r[0]) for r in rows], dtype=torch.long)
        dev = self.device
        return Proposal(ids.to(dev), num.to(dev), None, conf.to(dev), parents.to(dev))
