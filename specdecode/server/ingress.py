"""The ingress side of `serve --replicas`: the HTTP handlers of `specdecode serve` over engines in other processes.

`RemoteEngine` stands in for `AsyncEngine`: a request, validated and tokenized here against a `ModelCard`
(the tokenizer and limits of the replicas' model), goes to a replica as a `Job`, and its outputs are pumped
from the replica's stream into the request's queue, so timeouts, client disconnects and SSE work unchanged.
`ReplicatedServer` answers /health and /metrics for all replicas. Deployment: server/ray_app.py.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from ray.exceptions import RayActorError
from ray.serve.exceptions import DeploymentUnavailableError, ReplicaUnavailableError
from ray.serve.handle import DeploymentHandle

from specdecode.config import SamplingParams
from specdecode.engine.engine import check_params
from specdecode.llm import LLM
from specdecode.server.app import Server
from specdecode.server.async_engine import Output, RequestStream, at_capacity
from specdecode.server.protocol import OpenAIError
from specdecode.server.router import request_work

INGRESS_FAMILIES = ("specdecode_http_requests",)  # the ingress counts HTTP; everything else happens in replicas
# /health asks every replica. Unauthenticated probes may come at any rate: all the probes of one
# second share one fan-out (later ones get its answer), and a replica that has not answered in PROBE_TIMEOUT_S is
# reported unavailable, so a probe holds an ingress slot for at most that long and the replicas see at most one
# probe per PROBE_TTL_S, whatever the rate outside.
PROBE_TIMEOUT_S = 3.0
PROBE_TTL_S = 1.0


@dataclass(frozen=True)
class Job:
    """One request as the ingress sends it to a replica; `work` is what the router counts."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams

    @property
    def work(self) -> int:
        return request_work(len(self.prompt_ids), self.params.max_tokens)


@dataclass(frozen=True)
class ModelCard:
    """What the HTTP handlers need of an `LLM` (its tokenizer and limits) without its weights: the ingress's
    model, fetched from a replica so that the ingress tokenizes exactly as the replicas do."""

    tokenizer: Any
    vocab_size: int
    max_model_len: int
    eos_token_ids: tuple[int, ...]  # what a grammar may end on, as in the replicas' engines

    # LLM's own methods; they use only self.tokenizer.
    encode = LLM.encode
    apply_chat_template = LLM.apply_chat_template

    def check_request(self, prompt_ids: list[int], params: SamplingParams) -> None:
        """The checks a replica would make of the sampling parameters, made here so a bad one is a plain 400."""
        grammars = check_params(
            params, self.vocab_size, self.tokenizer, list(self.eos_token_ids), self.__dict__.get("_grammars")
        )
        object.__setattr__(self, "_grammars", grammars)


def replica_lost(e: Exception) -> OpenAIError:
    return OpenAIError(
        503,
        f"the replica serving this request is gone ({type(e).__name__}); retry",
        "server_error",
        code="replica_unavailable",
        headers={"Retry-After": "1"},
    )


class RemoteEngine:
    """`AsyncEngine`'s HTTP side over Ray: each request streams from the replica the router chose.

    A task per request pumps the replica's outputs into the request's queue, so the handlers (timeouts,
    client disconnects, SSE) run unchanged; `abort` cancels the task, which cancels the replica's stream.
    """

    def __init__(self, engines: DeploymentHandle, capacity: int) -> None:
        self.engines = engines
        self.capacity = capacity  # requests running or queued over all replicas before 429
        self._pumps: dict[str, asyncio.Task] = {}
        self._probes: dict[str, tuple[float, asyncio.Future]] = {}  # method -> (when asked, the shared answer)

    @property
    def alive(self) -> bool:
        return True

    def start(self) -> None:
        pass

    def shutdown(self) -> None:
        for task in self._pumps.values():
            task.cancel()

    @property
    def num_outstanding(self) -> int:
        return len(self._pumps)

    def submit(self, request_id: str, prompt_ids: list[int], params: SamplingParams) -> RequestStream:
        if len(self._pumps) >= self.capacity:
            raise at_capacity(self.capacity)
        stream = RequestStream(request_id, asyncio.get_running_loop())
        task = asyncio.create_task(self._pump(stream, Job(request_id, prompt_ids, params)))
        self._pumps[request_id] = task
        task.add_done_callback(lambda _: self._pumps.pop(request_id, None))
        return stream

    def abort(self, request_id: str) -> None:
        task = self._pumps.pop(request_id, None)
        if task is not None:
            task.cancel()

    async def _pump(self, stream: RequestStream, job: Job) -> None:
        response = self.engines.options(stream=True).generate.remote(job)
        try:
            async for out in response:
                stream.queue.put_nowait(out)
                if out.done:  # the request's last message (its last sample's)
                    return
            raise ReplicaUnavailableError("the replica ended the stream before the request finished")
        except asyncio.CancelledError:
            response.cancel()
            raise
        except (RayActorError, ReplicaUnavailableError, DeploymentUnavailableError) as e:
            stream.queue.put_nowait(Output(error=replica_lost(e)))
        except Exception as e:  # noqa: BLE001 - whatever went wrong, the request ends with an error, not a hang
            err = OpenAIError(500, f"internal error: {type(e).__name__}: {e}", "server_error")
            stream.queue.put_nowait(Output(error=err))

    async def ask_all(self, method: str) -> list[Any]:
        """`method` of every live replica: its answer, or the exception it raised. Calls within PROBE_TTL_S of a
        fan-out (or while one is in flight) share its answer."""
        now = time.monotonic()
        asked, answer = self._probes.get(method, (0.0, None))
        if answer is None or (answer.done() and now - asked >= PROBE_TTL_S):
            answer = asyncio.ensure_future(self._broadcast(method))
            self._probes[method] = (now, answer)
        return await asyncio.shield(answer)  # a probe that gives up does not cancel the others' answer

    async def _broadcast(self, method: str) -> list[Any]:
        response = self.engines.broadcast(method)
        return await response.results_async(timeout_s=PROBE_TIMEOUT_S, return_exceptions=True)


class ReplicatedServer(Server):
    """The HTTP handlers over a `RemoteEngine`; health and metrics cover every replica."""

    engine: RemoteEngine

    async def health(self) -> dict | JSONResponse:
        """200 while any replica serves (status "degraded" if some do not), 503 when none does."""
        replicas = [
            r if isinstance(r, dict) else {"status": f"unavailable: {type(r).__name__}"}
            for r in await self.engine.ask_all("health")
        ]
        ok = sum(r["status"] == "ok" for r in replicas)
        status = "unavailable" if not ok else "ok" if ok == len(replicas) else "degraded"
        body = {"status": status, "replicas": replicas}
        return body if ok else JSONResponse(body, status_code=503)

    async def prometheus(self) -> bytes:
        own = self.metrics.render().decode()
        parts = [({}, own, INGRESS_FAMILIES)]
        for r in await self.engine._broadcast("metrics_text"):  # counters are read fresh: scrapes are rare
            if isinstance(r, tuple):  # a replica that did not answer is left out, and /health says so
                parts.append(({"replica": r[0]}, r[1].decode(), None))
        return merge_expositions(parts)


class _Families:
    """A collector of ready-made metric families, so prometheus_client renders merged text."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def merge_expositions(parts: list[tuple[dict[str, str], str, tuple[str, ...] | None]]) -> bytes:
    """One Prometheus exposition from several: (extra labels, text, families to keep or None for all) each.

    A family appears once, with the samples of every part (two replicas' `specdecode_draft_tokens` become one
    family with a `replica="..."` sample each), as the text format requires.
    """
    merged: dict[str, Metric] = {}
    for labels, text, keep in parts:
        for family in text_string_to_metric_families(text):
            if keep is not None and family.name not in keep:
                continue
            into = merged.setdefault(family.name, Metric(family.name, family.documentation, family.type))
            into.samples += [s._replace(labels={**labels, **s.labels}) for s in family.samples]
    registry = CollectorRegistry()
    registry.register(_Families(list(merged.values())))
    return generate_latest(registry)
