"""What a draft model reads of a long context: the first SINK tokens and the last `window` (StreamingLLM's cache).

A draft step reads its weights and its KV cache; on a long context the cache outgrows the weights (the 0.5B
Qwen2.5-Coder draft's fp32 K/V are ~25 KB a token: 400 MB at 16k tokens against 279 MB of weights), and before
its first draft the draft must prefill the whole prompt (16k tokens of the 0.5B is ~40 s on two cores). Drafts
need not be exact, only likely: the target verifies every one. So a windowed draft keeps the first SINK tokens
(attention sinks: softmax mass parks on the first tokens, and dropping them derails a model; Xiao et al.,
StreamingLLM, 2023) and the most recent `window`, at their own positions: its step costs what it costs at
SINK + window tokens, and a long prompt is read as its sink and its last `window` tokens only (MagicDec and
TriForce draft from such a cache for the same reason).

The cache holds token j of the sequence at index j for j < SINK, and at index j - shift past the sink: keys are
stored rotated, so a token keeps its position wherever it sits, and a query at position p attends by the causal
mask over cache indices, which order the kept tokens as the sequence does. `shift` grows in two ways: a row
that has more than `window` tokens left to read skips all but the last `window` (`skip`), and a slot about to
outgrow its capacity moves its last `window` tokens down to the sink (`slide`), which happens once every
SINK + window + a step's feed tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

SINK = 4  # StreamingLLM keeps four initial tokens


@dataclass(frozen=True)
class DraftWindow:
    """The sink-and-window arithmetic of one drafter's cache. window: recent tokens kept besides the sink;
    max_drafts: tokens a row may draft in one step (K_max); budget: tokens of backlog a step reads at most."""

    window: int
    max_drafts: int
    budget: int

    @property
    def capacity(self) -> int:
        """Cache length a slot needs: the sink and the window, plus one step's feed. A step feeds a row at most
        SINK + window tokens of its backlog (`feed_cap`: a longer backlog is skipped down to that), and no more
        than the budget, and its drafts, so a slot slid down to SINK + window before the step has room for it."""
        return 2 * SINK + self.window + min(self.window, self.budget) + self.max_drafts + 1

    def skip(self, length: int, unread: int) -> int:
        """Tokens of a row's backlog to leave unread: all but the last `window`, once the sink is cached.
        length: the slot's cache length; unread: tokens of the sequence past what the cache covers."""
        return max(unread - self.window, 0) if length >= SINK else 0

    def feed_cap(self, length: int, unread: int) -> int:
        """Most tokens of the backlog to read this step: a row still short of its sink, with more than the sink
        and the window left to read, reads only the sink now (the rest is skipped at its next step)."""
        if length < SINK and length + unread > SINK + self.window:
            return SINK - length
        return unread

    def to_read(self, length: int, unread: int) -> int:
        """Tokens the draft will read before it drafts for the row, skips counted (`DrafterBase.unread`)."""
        if length >= SINK:
            return min(unread, self.window)
        return min(unread, SINK - length + self.window)

    def needs_slide(self, length: int, feed: int) -> bool:
        """Whether a slot of `length` must slide before it takes `feed` more tokens."""
        return length + feed > self.capacity and length > SINK + self.window
