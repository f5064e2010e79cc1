"""One request's state as the engine sees it: tokens, sampling, cache slot and speculative counters."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from specdecode.config import SamplingParams


@dataclass(frozen=True)
class TokenLogprob:
    """An emitted token's log-probability and the most likely alternatives, as (token id, log-probability)."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]]


class Status(Enum):
    WAITING = "waiting"
    PREFILLING = "prefilling"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class SeqMetrics:
    num_drafted: int = 0  # drafts verified: tokens of a chain, nodes of a tree
    num_accepted: int = 0
    trees: bool = False  # the drafts were token trees (see node_acceptance_rate)
    num_target_forwards: int = 0
    num_generated: int = 0
    start_time: float = field(default_factory=time.perf_counter)
    first_token_time: float | None = None
    end_time: float | None = None

    def as_dict(self) -> dict[str, float | int]:
        """The public metrics; these key names are used by other tools."""
        elapsed = (self.end_time or time.perf_counter()) - self.start_time
        forwards = max(self.num_target_forwards, 1)
        return {
            "num_drafted": self.num_drafted,
            "num_accepted": self.num_accepted,
            # A tree offers siblings of which one at most is accepted, so its accepted / drafted is a per-node
            # rate, not comparable with a chain's per-draft acceptance: it goes by its own name.
            "node_acceptance_rate" if self.trees else "acceptance_rate": (
                self.num_accepted / self.num_drafted if self.num_drafted else 0.0
            ),
            # Each target forward yields its accepted drafts plus one recovered or bonus token.
            "mean_accepted_tokens": (self.num_accepted + self.num_target_forwards) / forwards,
            "num_target_forwards": self.num_target_forwards,
            "num_generated": self.num_generated,
            "elapsed_s": elapsed,
            "tokens_per_s": self.num_generated / elapsed if elapsed > 0 else 0.0,
            # Once the prompt's forward has made the first token: the prompt's share of elapsed_s.
            **({"time_to_first_token_s": self.first_token_time - self.start_time} if self.first_token_time else {}),
        }


@dataclass
class Sequence:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    max_len: int  # prompt + output may not exceed this (the cache's length)
    token_ids: list[int] = field(default_factory=list)  # prompt + output; the last one is pending (not cached)
    slot: int = -1
    num_prefilled: int = 0  # prompt tokens whose K/V are in the target cache
    status: Status = Status.WAITING
    finish_reason: str | None = None
    text: str = ""
    metrics: SeqMetrics = field(default_factory=SeqMetrics)
    group: str = ""  # the request this sequence is one sample of (SamplingParams.n); its own id when n = 1
    index: int = 0  # which sample of its request
    parent: Sequence | None = None  # sample 0 of the request, whose prompt K/V this one copies (n > 1)
    grammar: Any = None  # a structured output's grammar state (specdecode/grammar.py), advanced at commit
    logprobs: list[TokenLogprob] | None = None  # per output token, when params.logprobs is set
    error: str | None = None  # why this request failed alone (finish_reason "error"); the others went on

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.prompt_ids)
        self.group = self.group or self.request_id
        if self.params.logprobs is not None and self.logprobs is None:
            self.logprobs = []

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[len(self.prompt_ids) :]

    @property
    def num_cached(self) -> int:
        """Target-cache length while decoding: every token but the pending one."""
        return len(self.token_ids) - 1

    @property
    def room(self) -> int:
        """Draft tokens that still fit: the step writes K + 1 tokens after the cached ones."""
        return self.max_len - len(self.token_ids)


def mean_context(seqs: list[Sequence]) -> float:
    """The rows' mean cached tokens (np.mean's value for a few ints, without its ~20 us in the engine)."""
    return sum(s.num_cached for s in seqs) / len(seqs)
