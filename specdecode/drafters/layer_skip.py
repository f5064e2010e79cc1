"""Self-speculation by layer skipping (SWIFT-style): the target drafts for itself through a subset of its layers.

No extra parameters. The drafter reads the target's own KV cache for the context (the full model's K/V, as
SWIFT does) and writes its kept layers' K/V for the drafts at positions the verify forward overwrites anyway,
so it needs no cache of its own and no prefill. Which layers to keep is chosen by layer_select.py.
An optional vocabulary subset makes the draft's LM head cheap (the head is ~21% of SmolLM2-135M); drafts then
stay inside the subset and q is 0 outside it, which keeps verification lossless.
"""

from __future__ import annotations

import torch

from specdecode.drafters.base import DrafterBase, Proposal
from specdecode.drafters.draft_model import draft_confidence
from specdecode.drafters.subset_head import SubsetHead
from specdecode.kv import KVCache
from specdecode.models.llama import AttentionMetadata, LlamaModel
from specdecode.step.sequence import Sequence
from specdecode.verify.sampling import PAD_TOKEN_ID, SamplingTensors, draft_probs
from specdecode.verify.streams import Purpose, sample


class LayerSkipDrafter(DrafterBase):
    def __init__(self, target: LlamaModel, layer_ids: list[int], vocab_subset: torch.Tensor | None = None) -> None:
        self.target = target
        self.layer_ids = list(layer_ids)
        self.cache: KVCache | None = None
        self.head = None if vocab_subset is None else SubsetHead(target, vocab_subset)

    def bind_target_cache(self, cache: KVCache) -> None:
        self.cache = cache

    def _logits(
        self, tokens: torch.Tensor, starts: list[int], slots: list[int], live: list[int] | None = None
    ) -> torch.Tensor:
        """Draft logits [num_seqs, 1, vocab] for tokens [num_seqs, 1] at positions `starts`. Rows with live 0 have
        drafted enough (a row near the context limit may have no room left): their K/V go to the scratch column."""
        device = tokens.device
        assert self.cache is not None, "the engine binds its cache before the first step"
        meta = AttentionMetadata.build(slots, starts, 1, device, num_new=live, max_len=self.cache.max_len)
        if self.head is None:
            return self.target(tokens, meta, self.cache, layer_ids=self.layer_ids)
        none = torch.zeros((len(slots), 0), dtype=torch.long, device=device)  # skip the full LM head
        _, hidden = self.target(tokens, meta, self.cache, none, return_hidden=True, layer_ids=self.layer_ids)
        return self.head.logits(hidden)  # [num_seqs, 1, vocab], -inf outside the subset

    @torch.inference_mode()
    def propose(self, seqs: list[Sequence], num_tokens: list[int], st: SamplingTensors) -> Proposal:
        assert self.cache is not None, "the engine binds its cache before the first step"
        k = max(num_tokens, default=0)
        device = self.target.device
        if k == 0:
            return Proposal.from_lists([[] for _ in seqs], 0, device)
        slots = [s.slot for s in seqs]
        tok = torch.tensor([[s.token_ids[-1]] for s in seqs], dtype=torch.long, device=device)  # [num_seqs, 1]
        tokens, probs, confidence = [], [], []
        for j in range(k):
            live = [int(j < n) for n in num_tokens]
            logits = self._logits(tok, [s.num_cached + j for s in seqs], slots, live)  # [num_seqs, 1, vocab]
            q = draft_probs(logits, tokens, st)  # [num_seqs, vocab], penalties etc. as the target's
            nxt = q.argmax(-1) if st.all_greedy else sample(q, st, Purpose.DRAFT, j)  # [num_seqs]
            tokens.append(nxt)
            probs.append(q)
            confidence.append(draft_confidence(logits[:, 0], q, st))
            tok = nxt[:, None]
        token_ids = torch.stack(tokens, dim=1)  # [num_seqs, k]
        num = torch.tensor(num_tokens, dtype=torch.long, device=device)  # [num_seqs]
        token_ids = token_ids.masked_fill(torch.arange(k, device=device)[None] >= num[:, None], PAD_TOKEN_ID)
        q_all = None if st.all_greedy else torch.stack(probs, dim=1)  # [num_seqs, k, vocab]
        return Proposal(token_ids, num, q_all, torch.stack(confidence, dim=1))
