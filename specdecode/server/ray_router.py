"""`LeastWorkRouter`: Ray Serve's request router for the engine replicas, choosing by outstanding tokens.

Ray runs a deployment handle's router in the caller's process, here the ingress, so the router itself keeps
the `LoadBook`: a request's work is counted on the replica it was routed to the moment it is chosen, and
released when Ray reports the request finished (or rejected, or failed). No replica is asked for its load on
the request path, so routing costs no RPC and a burst is spread as it arrives; the price is that one ingress
sees only its own requests (one ingress replica is what `specdecode serve --replicas` deploys).

Ray then still applies its own admission: a replica already holding `max_ongoing_requests` (its engine's
slots plus queue) is skipped, and if every replica is full the request waits in this router, with backoff.
"""

from __future__ import annotations

import random
from typing import Any

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from specdecode.server.router import LoadBook, rank_replicas


def work_of(request: PendingRequest) -> int:
    """The tokens a request will cost its replica: `EngineReplica.generate` gets a `Job` as its one argument."""
    job = request.args[0] if request.args else None
    return int(getattr(job, "work", 0))  # other calls (the ingress's `card`) cost nothing


class LeastWorkRouter(RequestRouter):
    def initialize_state(self, seed: int | None = None, **_: Any) -> None:
        self.book = LoadBook()
        self.rng = random.Random(seed)
        self.routing: dict[str, PendingRequest] = {}  # chosen for, not yet sent: kept to notice cancellations

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        """One replica: the least loaded of those with a free slot (of all, if none has one)."""
        self._forget_cancelled()
        candidates = self.select_available_replicas(candidate_replicas) or candidate_replicas
        by_id = {r.replica_id.unique_id: r for r in candidates}
        best = by_id[rank_replicas(self.book.loads(by_id), self.rng)[0]]
        if pending_request is not None:
            rid = pending_request.metadata.internal_request_id
            self.book.assign(rid, best.replica_id.unique_id, work_of(pending_request))
            self.routing[rid] = pending_request
            # A single choice per round: if Ray finds it full it must back off before asking again, not spin.
            pending_request.routing_context.should_backoff = True
        return [[best]]

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        self.routing.pop(internal_request_id, None)
        self.book.release(internal_request_id, replica_id.unique_id)

    def _forget_cancelled(self) -> None:
        """Requests cancelled while waiting to be routed never complete: drop their work here instead."""
        for rid, request in list(self.routing.items()):
            if request.future.cancelled():
                self.book.release(rid)
            if request.future.done():
                del self.routing[rid]
