"""The drafter Protocol: every way of proposing tokens (draft model, n-gram lookup, heads) implements it."""

from __future__ import annotations

from typing import Protocol

from specdecode.kv import KVCache
from specdecode.step.proposal import Proposal
from specdecode.step.sequence import Sequence
from specdecode.verify.sampling import SamplingTensors


class Drafter(Protocol):
    """Proposes up to k tokens per sequence. Lossless verification only needs the drafts and their q.

    A drafter whose `propose` depends only on committed state (calling it again before `commit`, on any subset of
    the rows, proposes what it would have) sets `retryable_propose = True`: when a batch's proposal raises, the
    engine then finds the rows it raises for by proposing for each row alone, and fails those rows only. Other
    drafters (EAGLE consumes the features it is handed) leave a raising proposal to fail the step.
    """

    retryable_propose: bool = False
    needs_features: bool = False  # reads the target's hidden states through observe_features() (EAGLE, heads)

    def bind_target_cache(self, cache: KVCache) -> None:
        """The engine hands over the target's KV cache (drafters that read the target's own K/V: layer_skip)."""

    def add_sequence(self, seq: Sequence) -> None:
        """A sequence joined (its prompt is known); build any per-sequence state."""

    def propose(self, seqs: list[Sequence], num_tokens: list[int], st: SamplingTensors) -> Proposal:
        """Drafts continuing each sequence's token_ids (which end with the pending token)."""

    def commit(self, seqs: list[Sequence]) -> None:
        """Verification finished; seq.token_ids now holds what was kept. Roll back any speculative state."""

    def remove_sequence(self, seq: Sequence) -> None:
        """The sequence left the batch; free its state."""

    def live_request_ids(self) -> set[str]:
        """Request ids this drafter holds state for (tests check that only live requests are here)."""


class DrafterBase:
    """The Protocol's optional hooks, each doing nothing: a drafter inherits this and writes only `propose` and
    the hooks it needs, and the engine calls every hook without asking whether it exists."""

    retryable_propose: bool = False
    needs_features: bool = False

    def bind_target_cache(self, cache: KVCache) -> None:
        pass

    def add_sequence(self, seq: Sequence) -> None:
        pass

    def propose(self, seqs: list[Sequence], num_tokens: list[int], st: SamplingTensors) -> Proposal:
        raise NotImplementedError

    def commit(self, seqs: list[Sequence]) -> None:
        pass

    def remove_sequence(self, seq: Sequence) -> None:
        pass

    def live_request_ids(self) -> set[str]:
        return set()

    def unread(self, seq: Sequence) -> int:
        """Tokens of `seq` this drafter must still read before it can draft for it (a lookup reads nothing)."""
        return 0
