"""EAGLE: one light decoder layer that predicts the target's next feature, drafting a dynamic tree (EAGLE-2).

At position i the head reads (feature f_i, token t_{i+1}) and predicts f_{i+1}; the target's LM head turns
that into a guess for t_{i+2}. Its own one-layer cache holds the pairs of every cached token (fed from the
target's real features); a draft node at depth d is fed (its parent's predicted feature, its token) at RoPE
position m + d - 1, where m is the pending token's position. Each level re-runs only the frontier and its
ancestors, with a tree mask, behind the committed cache; nothing it writes past the committed length is kept.
The head catches up on a prompt's pairs within one prefill chunk per step, as the engine prefills (catch_up.py).
"""

from __future__ import annotations

import torch

from specdecode.drafters.base import DrafterBase, Proposal
from specdecode.drafters.catch_up import share_budget
from specdecode.drafters.features import FeatureStore
from specdecode.drafters.subset_head import SubsetHead
from specdecode.drafters.tree_search import RowTree, TreeShape, grow_trees, to_proposal
from specdecode.models.llama import AttentionMetadata, LlamaModel
from specdecode.step.sequence import Sequence
from specdecode.verify.sampling import SamplingTensors


class EagleDrafter(DrafterBase):
    needs_features = True
    # commit() is the base's no-op: the head's cache only ever grows by real features, in _catch_up

    def __init__(
        self,
        target: LlamaModel,
        head: torch.nn.Module,
        shape: TreeShape,
        max_num_seqs: int,
        max_len: int,
        vocab_subset: torch.Tensor | None = None,  # [S] token ids: candidates only from these (a cheaper head)
        prefill_budget: int = 512,
    ) -> None:
        self.target = target
        self.head = head
        self.subset_head = None if vocab_subset is None else SubsetHead(target, vocab_subset)
        self.shape = shape
        # Past the committed length, room for the largest re-run of a tree level (the beam and its ancestors).
        self.cache = head.new_cache(max_num_seqs, max_len + shape.beam * shape.max_depth)
        self.prefill_budget = prefill_budget
        self.slots: dict[str, int] = {}
        self.features = FeatureStore(keep_last=False)

    def add_sequence(self, seq: Sequence) -> None:
        self.slots[seq.request_id] = self.cache.allocate()

    def observe_features(self, seq: Sequence, start: int, feats: torch.Tensor) -> None:
        self.features.add(seq, start, feats)

    def remove_sequence(self, seq: Sequence) -> None:
        slot = self.slots.pop(seq.request_id, None)
        if slot is not None:
            self.cache.free(slot)
        self.features.drop(seq)

    def live_request_ids(self) -> set[str]:
        return set(self.slots) | self.features.request_ids()

    def _logp(self, feats: torch.Tensor) -> torch.Tensor:
        if self.subset_head is not None:
            return self.subset_head.logits(feats).log_softmax(-1)  # [..., vocab], -inf outside the subset
        return self.target.lm_head(feats).float().log_softmax(-1)  # [..., vocab]

    def _catch_up(self, seqs: list[Sequence], num_tokens: list[int]) -> tuple[torch.Tensor, list[int]]:
        """Feed cached tokens' (feature, next token) pairs the head has not seen, within one prefill chunk.

        Returns f̂_m [num_seqs, hidden], each row's predicted feature of the pending position, and the drafts each
        row may make: none while it is still catching up, or with nothing cached (a one-token prompt's first step).
        """
        slots = [self.slots[s.request_id] for s in seqs]
        starts = [self.cache.lengths[slot] for slot in slots]
        backlogs = [s.num_cached - n for s, n in zip(seqs, starts, strict=True)]
        take = share_budget(backlogs, self.prefill_budget)
        got = [self.features.take(s, n + t) for s, n, t in zip(seqs, starts, take, strict=True)]
        assert all(f.start == n for f, n in zip(got, starts, strict=True)), "head cache and features out of step"
        ready = [k if 0 < t == want else 0 for k, t, want in zip(num_tokens, take, backlogs, strict=True)]
        width = max(take, default=0)
        device, dtype, hidden = self.target.device, self.target.dtype, self.target.cfg.hidden_size
        if width == 0:
            return torch.zeros((len(seqs), hidden), dtype=dtype, device=device), ready
        feats = torch.zeros((len(seqs), width, hidden), dtype=dtype, device=device)  # [num_seqs, T, H]
        tokens = torch.zeros((len(seqs), width), dtype=torch.long, device=device)  # [num_seqs, T]
        for b, (s, f, n) in enumerate(zip(seqs, got, take, strict=True)):
            if n:
                feats[b, :n] = f.rows
            tokens[b, :n] = torch.tensor(s.token_ids[f.start + 1 : f.start + 1 + n], dtype=torch.long)
        meta = AttentionMetadata.build(slots, starts, width, device, num_new=take, max_len=self.cache.max_len)
        out = self.head(feats, tokens, self.target.embed, meta, self.cache)  # [num_seqs, T, hidden]
        for slot, n in zip(slots, take, strict=True):
            self.cache.set_length(slot, self.cache.lengths[slot] + n)
        last = torch.tensor([max(n - 1, 0) for n in take], device=device)
        return out[torch.arange(len(seqs), device=device), last], ready  # [num_seqs, hidden]

    def _expand(self, seqs: list[Sequence], trees: list[RowTree], frontier: list[list[int]]):
        """Run each row's frontier and its ancestors as one small tree; child log-probs and features per row."""
        runs = [_with_ancestors(t, f) for t, f in zip(trees, frontier, strict=True)]
        width = max(len(r) for r in runs)
        slots = [self.slots[s.request_id] for s in seqs]
        starts = [self.cache.lengths[slot] for slot in slots]
        device, dtype, hidden = self.target.device, self.target.dtype, self.target.cfg.hidden_size
        feats = torch.zeros((len(seqs), width, hidden), dtype=dtype, device=device)  # [num_seqs, T, H]
        tokens = torch.zeros((len(seqs), width), dtype=torch.long, device=device)  # [num_seqs, T]
        depth = torch.zeros((len(seqs), width), dtype=torch.long, device=device)  # RoPE offset: depth - 1
        mask = torch.eye(width, dtype=torch.bool, device=device).repeat(len(seqs), 1, 1)  # [num_seqs, T, T]
        for b, (t, run) in enumerate(zip(trees, runs, strict=True)):
            where = {node: j for j, node in enumerate(run)}
            for j, node in enumerate(run):
                n = t.nodes[node]
                feats[b, j], tokens[b, j], depth[b, j] = n.state, n.token, n.depth - 1
                if n.parent >= 0:
                    mask[b, j] |= mask[b, where[n.parent]]
        lengths = [len(r) for r in runs]  # a row without a frontier this level only pads
        meta = AttentionMetadata.build(slots, starts, width, device, depth, mask, lengths, self.cache.max_len)
        out = self.head(feats, tokens, self.target.embed, meta, self.cache)  # [num_seqs, T, hidden]
        results = []
        for b, (run, f) in enumerate(zip(runs, frontier, strict=True)):
            picked = out[b, [run.index(i) for i in f]]  # [n_frontier, hidden]
            results.append((self._logp(picked), picked))
        return results

    @torch.inference_mode()
    def propose(self, seqs: list[Sequence], num_tokens: list[int], st: SamplingTensors) -> Proposal:
        device = self.target.device
        # Every step, drafting or not: the head's cache keeps up and the stored features are consumed.
        root, num_tokens = self._catch_up(seqs, num_tokens)  # [num_seqs, hidden] f̂ of the pending position
        if max(num_tokens, default=0) == 0:
            return Proposal.from_lists([[] for _ in seqs], 0, device)
        trees = grow_trees(
            self._logp(root), num_tokens, self.shape, lambda t, f: self._expand(seqs, t, f), root_state=root
        )
        return to_proposal(trees, device)


def _with_ancestors(tree: RowTree, frontier: list[int]) -> list[int]:
    """The frontier nodes and all their ancestors, in node order (parents first)."""
    keep: set[int] = set()
    for i in frontier:
        while i >= 0 and i not in keep:
            keep.add(i)
            i = tree.nodes[i].parent
    return sorted(keep)
