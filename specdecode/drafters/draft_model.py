"""An independent draft model sharing the target's vocabulary, drafting autoregressively on its own cache."""

from __future__ import annotations

import torch

from specdecode.drafters.base import Proposal
from specdecode.engine.runner import forward_ragged, prefill
from specdecode.engine.sequence import Sequence
from specdecode.models.llama import LlamaModel
from specdecode.sampling import PAD_TOKEN_ID, SamplingTensors, process_logits
from specdecode.streams import Purpose, sample


def draft_confidence(logits: torch.Tensor, q: torch.Tensor, st: SamplingTensors) -> torch.Tensor:
    """[num_seqs] the draft's top probability for the next token, before it is drawn.

    For greedy rows that is the proposed token's probability under the raw softmax (q itself is one-hot). For
    sampled rows it is max q, not q(drawn token): a cut that looked at the drawn token would bias which drafts
    reach verification and break losslessness; one decided from q alone does not.
    logits: [num_seqs, vocab], q: [num_seqs, vocab] processed.
    """
    top_raw = logits.float().softmax(-1).amax(-1)  # [num_seqs]
    return top_raw if st.all_greedy else torch.where(st.temperature == 0.0, top_raw, q.amax(-1))


class DraftModelDrafter:
    """Proposes k tokens by sampling the draft's processed distribution q (argmax for greedy rows)."""

    def __init__(self, model: LlamaModel, max_num_seqs: int, max_len: int, prefill_chunk: int = 512) -> None:
        self.model = model
        self.cache = model.new_cache(max_num_seqs, max_len)
        self.prefill_chunk = prefill_chunk
        self.slots: dict[str, int] = {}

    def add_sequence(self, seq: Sequence) -> None:
        slot = self.cache.allocate()
        self.slots[seq.request_id] = slot
        # All but the last prompt token, so the first propose always has a token to feed.
        if len(seq.prompt_ids) > 1:
            with torch.inference_mode():
                prefill(self.model, self.cache, slot, seq.prompt_ids[:-1], self.prefill_chunk)

    def remove_sequence(self, seq: Sequence) -> None:
        slot = self.slots.pop(seq.request_id, None)
        if slot is not None:
            self.cache.free(slot)

    def commit(self, seqs: list[Sequence]) -> None:
        # The draft cached pending + its own drafts; only those the target kept stay valid.
        for s in seqs:
            slot = self.slots[s.request_id]
            self.cache.set_length(slot, min(self.cache.lengths[slot], s.num_cached))

    @torch.inference_mode()
    def propose(self, seqs: list[Sequence], num_tokens: list[int], st: SamplingTensors) -> Proposal:
        k = max(num_tokens, default=0)
        device = self.model.embed.weight.device
        if k == 0:
            return Proposal.from_lists([[] for _ in seqs], 0, device)
        slots = [self.slots[s.request_id] for s in seqs]
        # Catch up on tokens the draft has not seen (the pending token, and the bonus token after a full accept).
        feed = [s.token_ids[self.cache.lengths[slot] :] for s, slot in zip(seqs, slots, strict=True)]
        logits = forward_ragged(self.model, self.cache, slots, feed, last_only=True)  # [num_seqs, 1, vocab]
        for slot, f in zip(slots, feed, strict=True):
            self.cache.set_length(slot, self.cache.lengths[slot] + len(f))
        tokens, probs, confidence = [], [], []
        for j in range(k):
            q = process_logits(logits, st)[:, 0]  # [num_seqs, vocab]
            tok = q.argmax(-1) if st.all_greedy else sample(q, st, Purpose.DRAFT, j)  # [num_seqs]
            tokens.append(tok)
            probs.append(q)
            confidence.append(draft_confidence(logits[:, 0], q, st))
            if j + 1 < k:
                logits = forward_ragged(self.model, self.cache, slots, [[t] for t in tok.tolist()], last_only=True)
                for slot in slots:
                    self.cache.set_length(slot, self.cache.lengths[slot] + 1)
        token_ids = torch.stack(tokens, dim=1)  # [num_seqs, k]
        num = torch.tensor(num_tokens, dtype=torch.long, device=device)  # [num_seqs]
        token_ids = token_ids.masked_fill(torch.arange(k, device=device)[None] >= num[:, None], PAD_TOKEN_ID)
        q_all = None if st.all_greedy else torch.stack(probs, dim=1)  # [num_seqs, k, vocab]
        return Proposal(token_ids, num, q_all, torch.stack(confidence, dim=1))  # confidence [num_seqs, k]
