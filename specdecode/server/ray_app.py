"""`specdecode serve --replicas N`: the OpenAI API as a Ray Serve application over N engine replicas.

Two deployments. `EngineReplica` (N of them, or min..max under Ray's autoscaler) each load their own `LLM`
and run their own `AsyncEngine` loop, so each goodput controller sees only its replica's batch: K falls on
a busy replica and rises on an idle one. `Ingress` (one) is the same FastAPI app as `specdecode serve`
(same validation, same error bodies) with a `RemoteEngine` in place of the local engine: a request is
validated and tokenized at the ingress, routed by `LeastWorkRouter` (server/ray_router.py) to the replica
with the least outstanding tokens, and streamed back chunk by chunk. `/health` and `/metrics` ask every
replica (`broadcast`); metrics carry a `replica` label.

A replica that dies fails its in-flight requests with 503 (an error event if the stream had started), never a
hang; Ray starts a replacement and the router stops choosing the dead one.

The local cluster (no --ray-address) is this machine's alone: its processes (GCS, raylet, agents, workers)
listen on loopback, and Ray's token authentication is on. The API key never travels in the job's environment.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
import ray._private.ray_constants
import torch
from ray import serve
from ray._raylet import AuthenticationTokenLoader, Config
from ray.serve.config import RequestRouterConfig
from ray.serve.handle import DeploymentHandle

import specdecode
from specdecode.config import ConfigError
from specdecode.llm import LLM
from specdecode.models import packed_linear
from specdecode.server.app import ServerConfig, serve_app
from specdecode.server.async_engine import AsyncEngine, Output
from specdecode.server.ingress import Job, ModelCard, RemoteEngine, ReplicatedServer
from specdecode.server.metrics import ServerMetrics
from specdecode.server.protocol import OpenAIError
from specdecode.server.ray_router import LeastWorkRouter

APP_NAME = "specdecode"
SECRETS = frozenset({"SPECDECODE_API_KEY"})  # settings that stay in this process (the ingress gets its config)


@dataclass(frozen=True)
class ScaleConfig:
    """How many engine replicas: `replicas` fixed, or autoscaled between `min_replicas` and `max_replicas`."""

    replicas: int = 1
    min_replicas: int | None = None
    max_replicas: int | None = None
    cpus_per_replica: float = 1.0  # Ray CPUs each replica reserves; its torch threads are this, rounded
    # Ray Serve's autoscaler: how long the queue must stay deep (shallow) before a replica is added (removed),
    # and the window the queue depth is averaged over. Ray's defaults; shorter ones react faster but flap.
    upscale_delay_s: float = 30.0
    downscale_delay_s: float = 600.0
    look_back_s: float = 30.0

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ConfigError(f"--replicas must be >= 1, got {self.replicas}")
        if not 1 <= self.low <= self.replicas <= self.high:
            raise ConfigError(
                f"need 1 <= --min-replicas <= --replicas <= --max-replicas; got {self.low}, {self.replicas}, "
                f"{self.high}"
            )
        if self.cpus_per_replica <= 0:
            raise ConfigError(f"CPUs per replica must be > 0, got {self.cpus_per_replica}")
        if min(self.upscale_delay_s, self.downscale_delay_s) < 0 or self.look_back_s <= 0:
            raise ConfigError(
                "autoscaling delays must be >= 0 and the look-back window > 0, got "
                f"{self.upscale_delay_s:g}, {self.downscale_delay_s:g} and {self.look_back_s:g} s"
            )

    @property
    def low(self) -> int:
        return self.replicas if self.min_replicas is None else self.min_replicas

    @property
    def high(self) -> int:
        return self.replicas if self.max_replicas is None else self.max_replicas

    @property
    def threads(self) -> int:
        return max(1, round(self.cpus_per_replica))

    def replica_options(self, slots: int) -> dict[str, Any]:
        """Ray Serve's options for the replica count: fixed, or its autoscaler on queue depth, which adds a
        replica once requests wait behind the batch slots (more than `slots` in flight per replica)."""
        if self.low == self.high:
            return {"num_replicas": self.replicas}
        limits = {"min_replicas": self.low, "max_replicas": self.high, "initial_replicas": self.replicas}
        timing = {
            "upscale_delay_s": self.upscale_delay_s,
            "downscale_delay_s": self.downscale_delay_s,
            "look_back_period_s": self.look_back_s,
            "metrics_interval_s": min(10.0, self.look_back_s / 2),  # Ray's default, or inside the window
        }
        return {"autoscaling_config": limits | timing | {"target_ongoing_requests": slots}}


def worker_env() -> dict[str, str]:
    """Environment variables the replicas need: the `specdecode` this process imported, its SPECDECODE_* settings.

    Ray starts workers in their own directory, where `import specdecode` finds the installed package; from a
    source checkout (or a git worktree beside an editable install) that is another copy. PYTHONPATH puts the
    checkout first; an installed package (under site-packages) needs nothing.
    """
    env = {k: v for k, v in os.environ.items() if k.startswith("SPECDECODE_") and k not in SECRETS}
    root = Path(specdecode.__file__).resolve().parent.parent
    if root.name not in ("site-packages", "dist-packages"):
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)
    return env


class EngineReplica:
    """One `LLM` and the `AsyncEngine` loop that serves it: its own model, batch and speculation controller."""

    def __init__(self, llm_kwargs: dict, max_waiting: int, threads: int) -> None:
        torch.set_num_threads(threads)
        self.llm = LLM(**llm_kwargs)
        torch.set_num_threads(threads)  # LLM takes every core; replicas on one machine share them
        self.metrics = ServerMetrics()
        self.engine = AsyncEngine(self.llm.engine, max_waiting, self.metrics)
        self.engine.start()
        replica = serve.get_replica_context().replica_id
        self.replica_id, self.actor_name = replica.unique_id, replica.to_full_id_str()

    def card(self) -> ModelCard:
        eos = tuple(sorted(self.llm.engine.eos_token_ids))
        return ModelCard(self.llm.tokenizer, self.llm.vocab_size, self.llm.max_model_len, eos)

    async def generate(self, job: Job) -> AsyncIterator[Output]:
        """The request's outputs as the engine produces them; cancelling the stream aborts the request."""
        try:
            stream = self.engine.submit(job.request_id, job.prompt_ids, job.params)
        except OpenAIError as e:  # at capacity: a 429 for the client, as from one server
            yield Output(error=e)
            return
        final = False
        try:
            while not final:
                out = await stream.queue.get()
                final = out.done
                yield out
        finally:
            if not final:  # the ingress cancelled: its client left, or timed out
                self.engine.abort(job.request_id)

    def health(self) -> dict:
        engine = self.llm.engine
        return {
            "replica": self.replica_id,
            "actor": self.actor_name,  # in Ray's "serve" namespace
            "status": "ok" if self.engine.alive else "engine stopped",
            "running": len(engine.running),
            "waiting": len(engine.waiting),
            "threads": torch.get_num_threads(),
        }

    def metrics_text(self) -> tuple[str, bytes]:
        return self.replica_id, self.metrics.render()

    def check_health(self) -> None:
        """Ray's periodic probe: a replica whose engine loop has stopped is replaced."""
        if not self.engine.alive:
            raise RuntimeError("engine loop stopped")

    def __del__(self) -> None:
        self.engine.shutdown()


class Ingress:
    """The FastAPI app of `specdecode serve`, forwarding to the engine replicas; built once a replica is up."""

    def __init__(self, engines: DeploymentHandle, config: ServerConfig, capacity: int) -> None:
        self.engines, self.config, self.capacity = engines, config, capacity

    async def __serve_build_asgi_app__(self):
        card = await self.engines.card.remote()  # waits for the first replica to load its model
        server = ReplicatedServer(card, self.config, ServerMetrics(), RemoteEngine(self.engines, self.capacity))
        asgi, _ = serve_app(server)
        return asgi


def build_application(llm_kwargs: dict, config: ServerConfig, scale: ScaleConfig) -> serve.Application:
    """The Ray Serve application: `Ingress` in front of `EngineReplica` x N, each with its own LLM.

    Both run in the job's environment (`connect`), so they import the same `specdecode` as this process.
    """
    slots = llm_kwargs.get("max_num_seqs", 8)
    per_replica = slots + config.max_waiting  # what one AsyncEngine holds before it would answer 429
    gpus = 1 if str(llm_kwargs.get("device", "cpu")).startswith("cuda") else 0
    engines = serve.deployment(EngineReplica).options(
        name="engine",
        ray_actor_options={"num_cpus": scale.cpus_per_replica, "num_gpus": gpus},
        max_ongoing_requests=per_replica,
        request_router_config=RequestRouterConfig(request_router_class=LeastWorkRouter),
        health_check_period_s=2.0,
        max_constructor_retry_count=3,  # a replica that cannot load its model fails the deploy, not 20 retries
        **scale.replica_options(slots),
    )
    ingress = serve.deployment(serve.ingress()(Ingress)).options(
        name="ingress",
        ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=per_replica * scale.high + 16,  # room for /health and /metrics beside the requests
    )
    capacity = per_replica * scale.high
    return ingress.bind(engines.bind(llm_kwargs, config.max_waiting, scale.threads), config, capacity)


def deploy(
    llm_kwargs: dict, config: ServerConfig, scale: ScaleConfig, host: str, port: int, log_level: str = "warning"
) -> str:
    """Run the application on the connected Ray cluster (Serve's proxy on host:port) once every replica is up;
    returns its URL. `log_level` is the replicas' (Serve logs each call at info)."""
    serve.start(http_options={"host": host, "port": port})
    app = build_application(llm_kwargs, config, scale)
    serve.run(app, name=APP_NAME, route_prefix="/", logging_config={"log_level": log_level.upper()})
    return f"http://{host}:{port}"


def check_fits(scale: ScaleConfig) -> None:
    """A replica that no node has CPUs for waits forever; refuse that up front (for a cluster without an
    autoscaler of its own, such as the local one)."""
    cpus = ray.cluster_resources().get("CPU", 0.0)
    if scale.low * scale.cpus_per_replica > cpus:
        raise ConfigError(
            f"{scale.low} replicas x {scale.cpus_per_replica:g} CPUs need more than the cluster's {cpus:g} CPUs: "
            "lower --cpus-per-replica or --replicas"
        )


def connect(address: str | None, num_cpus: int | None = None) -> None:
    """Join the Ray cluster at `address` (its workers get `worker_env()` as the job's runtime_env), or start a
    local one, whose workers inherit this process's environment.

    Inheriting is cheaper: Ray starts runtime_env workers afresh (two actors took ~7 s longer that way on the
    loaded 2-core machine). Replicas on this machine also take this process's packed-linear choice rather than
    each timing the kinds again on cores the others are busy with.
    """
    env = worker_env()
    if address:
        ray.init(address=address, runtime_env={"env_vars": env})
        return
    env.setdefault(packed_linear.ENV, packed_linear.choice())
    os.environ.update(env)
    _private_cluster()
    ray.init(num_cpus=num_cpus, include_dashboard=False, _node_ip_address="127.0.0.1")


def _private_cluster() -> None:
    """Settings for a local cluster that only this machine's user can reach, set before `ray.init` starts it.

    Loopback: Ray's processes bind to all interfaces unless the node's address is 127.0.0.1, and on Linux
    `ray.init` turns 127.0.0.1 into the machine's address unless its multi-node switch is off (as it is by
    default on macOS and Windows); that switch is read when ray is imported, so it is set here too. Token
    authentication: every RPC carries a token, the user's own if set (RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH),
    else a fresh one for this cluster; Ray reads its mode and token at import, hence the reloads.
    """
    os.environ[ray._private.ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR] = "0"
    ray._private.ray_constants.ENABLE_RAY_CLUSTER = False
    os.environ["RAY_AUTH_MODE"] = "token"
    if not (os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH")):
        os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def disconnect(joined: bool) -> None:
    """Leave the cluster: remove this application from a joined one, or stop the local one altogether."""
    if joined:
        serve.delete(APP_NAME)
    ray.shutdown()
