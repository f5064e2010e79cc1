"""`specdecode serve`: flags follow vLLM's where they exist (--host, --port, --api-key, --max-num-seqs, ...)."""

from __future__ import annotations

import argparse
import os
import signal
import threading


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


def serve(a: argparse.Namespace) -> None:
    import uvicorn

    from specdecode.cli import llm_from_args
    from specdecode.config import ConfigError
    from specdecode.server.app import ServerConfig, build_app

    if not 0 < a.port < 65536:
        raise ConfigError(f"--port must be in 1..65535, got {a.port}")
    config = ServerConfig(a.served_model_name or a.target, a.api_key, a.max_queue, a.request_timeout, a.max_body_bytes)
    llm = llm_from_args(a)
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
