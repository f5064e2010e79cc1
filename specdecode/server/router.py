"""Which engine replica gets the next request: the one with the least outstanding work.

Pure bookkeeping, no Ray: `LoadBook` records the work the ingress has sent to each replica and not yet seen
finish, and `rank_replicas` orders replicas by it. `server/ray_router.py` plugs both into Ray Serve.

Work is counted in tokens, not requests: a replica holding two 1,000-token requests is busier than one holding
three 20-token requests, and a request-count router (Ray's default) would send the next one to the former.
A request's work is its prompt plus its token budget (`max_tokens`): what the replica still has to prefill
and decode for it, as far as the ingress can know when it routes. The book learns that a request finished
(early at an EOS, or at its budget) only when its stream ends, so a request near its end still counts fully;
the error is at most one request's budget per replica and shrinks as requests finish.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class ReplicaLoad:
    requests: int = 0  # requests sent to the replica and not yet finished
    tokens: int = 0  # their outstanding work: prompt + max_tokens each


def request_work(num_prompt_tokens: int, max_tokens: int) -> int:
    """Tokens a replica still has to compute for a new request: prefill its prompt, decode its budget."""
    return num_prompt_tokens + max_tokens


def rank_replicas(loads: Mapping[str, ReplicaLoad], rng: random.Random | None = None) -> list[str]:
    """Replica ids from least to most outstanding work (tokens, then requests).

    Ties are broken at random (with `rng`): among idle replicas, always taking the first would load one replica
    with every request that arrives alone.
    """
    ids = list(loads)
    (rng or random).shuffle(ids)  # list.sort is stable: the shuffle decides ties
    return sorted(ids, key=lambda r: (loads[r].tokens, loads[r].requests))


class LoadBook:
    """The outstanding work of each replica, as the ingress sent it: request id -> (replica, tokens).

    Exact and immediate for the requests of this ingress: a burst of 64 requests is spread as it is routed,
    where loads polled from the replicas would still show the state before the burst and herd it all onto
    the replica that looked idle.
    """

    def __init__(self) -> None:
        self._requests: dict[str, tuple[str, int]] = {}

    def assign(self, request_id: str, replica_id: str, tokens: int) -> None:
        """Count `request_id` on `replica_id` (moving it, if it was counted elsewhere: a retried request)."""
        self._requests[request_id] = (replica_id, tokens)

    def release(self, request_id: str, replica_id: str | None = None) -> None:
        """The request ended (on `replica_id`: a stale end from a replica it has since left changes nothing)."""
        entry = self._requests.get(request_id)
        if entry is not None and replica_id in (None, entry[0]):
            del self._requests[request_id]

    def loads(self, replica_ids: Iterable[str]) -> dict[str, ReplicaLoad]:
        """The load of each of `replica_ids` (zero for one the book has sent nothing to)."""
        requests = {r: 0 for r in replica_ids}
        tokens = dict(requests)
        for replica, work in self._requests.values():
            if replica in requests:
                requests[replica] += 1
                tokens[replica] += work
        return {r: ReplicaLoad(requests[r], tokens[r]) for r in requests}
