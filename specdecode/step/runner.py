"""Ragged forwards: pad per-row token lists into one call of a model on its own cache."""

from __future__ import annotations

import torch

from specdecode.kv import KVCache
from specdecode.models.llama import AttentionMetadata, LlamaModel

PAD_SLACK = 16  # tokens of padding a prefill row may carry before it gets a forward of its own


def forward_ragged(
    model: LlamaModel,
    cache: KVCache,
    slots: list[int],
    tokens: list[list[int]],
    last_only: bool,
    return_hidden: bool = False,
    shift: list[int] | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Feed tokens[b] after the cached tokens of slots[b]; logits [num_seqs, 1 or T, vocab].

    With return_hidden, also the final hidden states [num_seqs, T, hidden]. shift: per row, its tokens' positions
    less their cache indices (AttentionMetadata.build; a windowed draft's cache).
    Rows are right-padded to the longest; padding writes into the cache's scratch column, which nothing reads.
    Cache lengths are not changed here: the caller commits them.
    """
    device = model.device
    width = max(len(t) for t in tokens)
    padded = torch.tensor([t + [0] * (width - len(t)) for t in tokens], dtype=torch.long, device=device)
    starts = [cache.lengths[s] for s in slots]
    lengths = [len(t) for t in tokens]
    meta = AttentionMetadata.build(slots, starts, width, device, num_new=lengths, max_len=cache.max_len, shift=shift)
    index = None
    if last_only:
        index = torch.tensor([[len(t) - 1] for t in tokens], dtype=torch.long, device=device)  # [num_seqs, 1]
    return model(padded, meta, cache, index, return_hidden=return_hidden)


def prefill(model: LlamaModel, cache: KVCache, slot: int, tokens: list[int], chunk: int) -> torch.Tensor:
    """Cache `tokens` for one slot in chunks of at most `chunk`; logits of the last token [1, 1, vocab]."""
    logits = None
    for i in range(0, len(tokens), chunk):
        part = tokens[i : i + chunk]
        logits = forward_ragged(model, cache, [slot], [part], last_only=True)
        cache.set_length(slot, cache.lengths[slot] + len(part))
    assert logits is not None, "prefill needs at least one token"
    return logits
