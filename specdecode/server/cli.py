"""`specdecode serve`: flags follow vLLM's where they exist (--host, --port, --api-key, --max-num-seqs, ...)."""

from __future__ import annotations

import argparse
import os
import signal
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from specdecode.server.app import ServerConfig


def add_serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--api-key", default=os.environ.get("SPECDECODE_API_KEY"), help="require 'Authorization: Bearer KEY' on /v1"
    )
    p.add_argument("--served-model-name", default=None, help="model name clients send (default: --target)")
    p.add_argument("--max-queue", type=int, default=64, help="requests queued beyond --max-num-seqs before 429")
    p.add_argument("--request-timeout", type=float, default=600.0, help="seconds before a request is aborted (504)")
    p.add_argument("--max-body-bytes", type=int, default=4 * 1024 * 1024, help="larger bodies get 413")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    ray = p.add_argument_group("replicas on Ray Serve (pip install -e '.[ray]')")
    ray.add_argument("--replicas", type=int, default=None, help="serve N engine replicas behind one ingress")
    ray.add_argument("--ray-address", default=None, help="join this Ray cluster (default: start a local one)")
    ray.add_argument("--min-replicas", type=int, default=None, help="autoscale on queue depth down to this")
    ray.add_argument("--max-replicas", type=int, default=None, help="autoscale on queue depth up to this")
    ray.add_argument("--upscale-delay", type=float, default=30.0, help="seconds of deep queue before adding a replica")
    ray.add_argument("--downscale-delay", type=float, default=600.0, help="seconds of idle before one is removed")
    ray.add_argument("--cpus-per-replica", type=float, default=1.0, help="Ray CPUs (and torch threads) per replica")


def serve(a: argparse.Namespace) -> None:
    import uvicorn

    from specdecode.config import ConfigError
    from specdecode.llm_args import llm_from_args
    from specdecode.server.app import ServerConfig, build_app

    if not 0 < a.port < 65536:
        raise ConfigError(f"--port must be in 1..65535, got {a.port}")
    config = ServerConfig(a.served_model_name or a.target, a.api_key, a.max_queue, a.request_timeout, a.max_body_bytes)
    if a.replicas is not None:
        return serve_replicas(a, config)
    for flag in ("ray_address", "min_replicas", "max_replicas"):
        if getattr(a, flag) is not None:
            raise ConfigError(f"--{flag.replace('_', '-')} needs --replicas")
    llm = llm_from_args(a)
    llm.warm_up()  # here: the main thread runs the steps (below)
    asgi, app = build_app(llm, config, engine_thread=False)
    http = uvicorn.Server(uvicorn.Config(asgi, host=a.host, port=a.port, log_level=a.log_level, lifespan="on"))
    engine = app.state.server.engine

    # The engine loop keeps the main thread (see server/async_engine.py); HTTP runs beside it. When the HTTP
    # server stops (it failed to bind, say), the loop stops too; SIGTERM and Ctrl-C stop both.
    def run_http() -> None:
        try:
            http.run()
        finally:
            engine.shutdown()

    web = threading.Thread(target=run_http, name="http", daemon=True)
    signal.signal(signal.SIGTERM, lambda *_: engine.shutdown())
    web.start()
    try:
        engine.run()
    except KeyboardInterrupt:
        pass
    finally:
        http.should_exit = True
        web.join(timeout=10)
    if not http.started:
        raise ConfigError(f"could not serve on {a.host}:{a.port} (see the log above)")


def serve_replicas(a: argparse.Namespace, config: ServerConfig) -> None:
    """`serve --replicas N`: the application on Ray Serve until SIGTERM or Ctrl-C (see server/ray_app.py)."""
    from specdecode.config import ConfigError
    from specdecode.llm_args import configs_from_args, llm_kwargs
    from specdecode.models.gguf_quantized import quantized_source
    from specdecode.models.loader import resolve_model_dir

    try:
        from specdecode.server import ray_app
    except ImportError as e:
        raise ConfigError(f"--replicas needs Ray Serve ({e}): pip install -e '.[ray]'") from None
    scale = ray_app.ScaleConfig(
        a.replicas, a.min_replicas, a.max_replicas, a.cpus_per_replica, a.upscale_delay, a.downscale_delay
    )
    # A missing model fails here, once, not in every replica (converted once, too: without its weights when the
    # replicas load them from the GGUF itself).
    _, c = configs_from_args(a)
    quantized = c.tensor_parallel_size == 1 and quantized_source(a.target, c.device, c.dtype, c.weights) is not None
    resolve_model_dir(a.target, weights=not quantized)
    ray_app.connect(a.ray_address)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        if a.ray_address is None:
            ray_app.check_fits(scale)
        settings = llm_kwargs(a, weights=c.weights, arithmetic=c.arithmetic)  # resolved here: every replica alike
        url = ray_app.deploy(settings, config, scale, a.host, a.port, a.log_level)
        print(f"specdecode: {scale.replicas} replicas serving at {url}", flush=True)
        while not stop.wait(1.0):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        ray_app.disconnect(a.ray_address is not None)
