"""`specdecode serve`: flags follow vLLM's where they exist (--host, --port, --api-key, --max-num-seqs, ...)."""

from __future__ import annotations

import argparse
import os


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
    from specdecode.server.app import ServerConfig, build_app

    if not 0 < a.port < 65536:
        from specdecode.config import ConfigError

        raise ConfigError(f"--port must be in 1..65535, got {a.port}")
    config = ServerConfig(a.served_model_name or a.target, a.api_key, a.max_queue, a.request_timeout, a.max_body_bytes)
    llm = llm_from_args(a)
    asgi, _ = build_app(llm, config)
    uvicorn.run(asgi, host=a.host, port=a.port, log_level=a.log_level, lifespan="on")
