"""The OpenAI-compatible HTTP API over one `AsyncEngine`.

Every request is fully validated (schema, model name, context length, token ids) before it reaches the engine,
so a streaming response only starts once the request is known to be servable; after that, errors arrive as an
`error` event in the stream.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Protocol

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from specdecode.config import ConfigError, SamplingParams
from specdecode.server.async_engine import AsyncEngine, Output, RequestStream
from specdecode.server.logprobs import LogprobFormats
from specdecode.server.metrics import ServerMetrics
from specdecode.server.middleware import BodyLimit, CountRequests
from specdecode.server.protocol import ChatCompletionRequest, CompletionRequest, OpenAIError, _Common

COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions; chat defaults to the context left


@dataclass(frozen=True)
class ServerConfig:
    model_name: str
    api_key: str | None = None
    max_waiting: int = 64
    request_timeout_s: float = 600.0
    max_body_bytes: int = 4 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.max_waiting < 0:
            raise ConfigError(f"max_waiting must be >= 0, got {self.max_waiting}")
        if self.request_timeout_s <= 0:
            raise ConfigError(f"request timeout must be > 0, got {self.request_timeout_s}")
        if self.max_body_bytes < 1024:
            raise ConfigError(f"max body size must be >= 1024 bytes, got {self.max_body_bytes}")


class EngineClient(Protocol):
    """What the handlers need of an engine: `AsyncEngine` in this process, `ingress.RemoteEngine` over replicas."""

    @property
    def alive(self) -> bool: ...

    def submit(self, request_id: str, prompt_ids: list[int], params: SamplingParams) -> RequestStream: ...

    def abort(self, request_id: str) -> None: ...

    def start(self) -> None: ...

    def shutdown(self) -> None: ...


class ClientGone(Exception):
    """The HTTP client disconnected; its request has been aborted."""


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body")
        parts.append(f"{loc}: {err.get('msg')}" if loc else str(err.get("msg")))
    return "invalid request: " + "; ".join(parts)


class Server:
    """Handlers and the validation they share; `build_app` wires them into FastAPI."""

    def __init__(self, llm, config: ServerConfig, metrics: ServerMetrics, engine: EngineClient | None = None) -> None:
        """`llm` is used for its tokenizer and limits (encode, apply_chat_template, vocab_size, max_model_len);
        `engine` defaults to an `AsyncEngine` over `llm.engine` (`ingress.py` passes one that forwards to replicas).
        """
        self.llm = llm
        self.config = config
        self.metrics = metrics
        self.engine = engine if engine is not None else AsyncEngine(llm.engine, config.max_waiting, metrics)
        self.formats = LogprobFormats(llm.tokenizer)
        self.created = int(time.time())

    # ---- checks ---------------------------------------------------------------------------------------
    def check_auth(self, request: Request) -> None:
        if self.config.api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        # Bytes: compare_digest refuses str with non-ASCII characters (a TypeError, so a 500, not a 401).
        given, expected = token.strip().encode(), self.config.api_key.encode()
        if scheme.lower() != "bearer" or not secrets.compare_digest(given, expected):
            raise OpenAIError(401, "invalid or missing API key", "invalid_request_error", code="invalid_api_key")

    def check_model(self, req: _Common) -> None:
        if req.model != self.config.model_name:
            raise OpenAIError(
                404,
                f"The model `{req.model}` does not exist; this server serves `{self.config.model_name}`",
                "invalid_request_error",
                param="model",
                code="model_not_found",
            )

    def check_tokens(self, ids: list[int]) -> None:
        vocab = self.llm.vocab_size
        if any(not 0 <= t < vocab for t in ids):
            raise OpenAIError(400, f"prompt token ids must be in 0..{vocab - 1}", param="prompt")

    def max_tokens(self, requested: int | None, num_prompt: int, default: int | None) -> int:
        limit = self.llm.max_model_len
        if num_prompt >= limit:
            raise OpenAIError(
                400,
                f"This model's maximum context length is {limit} tokens; the prompt has {num_prompt} tokens",
                param="prompt",
                code="context_length_exceeded",
            )
        left = limit - num_prompt
        if requested is None:
            return min(default, left) if default else left
        if requested > left:
            raise OpenAIError(
                400,
                f"This model's maximum context length is {limit} tokens; you requested "
                f"{num_prompt + requested} ({num_prompt} in the prompt, {requested} for the completion)",
                param="max_tokens",
                code="context_length_exceeded",
            )
        return requested

    def encode(self, text: str) -> list[int]:
        try:
            return self.llm.encode(text)
        except ConfigError as e:
            raise OpenAIError(400, str(e), param="prompt") from e

    # ---- endpoints ------------------------------------------------------------------------------------
    async def completions(self, req: CompletionRequest, request: Request):
        req.check_supported()
        self.check_model(req)
        prompt = req.single_prompt()
        ids = prompt if isinstance(prompt, list) else self.encode(prompt)
        self.check_tokens(ids)
        n = self.max_tokens(req.max_tokens, len(ids), COMPLETION_DEFAULT_MAX_TOKENS)
        return await self.respond(req, request, ids, n, chat=False)

    async def chat(self, req: ChatCompletionRequest, request: Request):
        req.check_supported()
        self.check_model(req)
        try:
            text = self.llm.apply_chat_template([m.as_template_dict() for m in req.messages])
        except ConfigError as e:
            raise OpenAIError(400, str(e), param="messages") from e
        except Exception as e:  # noqa: BLE001 - a template may reject a conversation in its own words
            raise OpenAIError(400, f"chat template failed: {e}", param="messages") from e
        ids = self.encode(text)
        n = self.max_tokens(req.requested_max_tokens, len(ids), None)
        return await self.respond(req, request, ids, n, chat=True)

    async def respond(self, req: _Common, request: Request, ids: list[int], max_tokens: int, chat: bool):
        params = req.sampling(max_tokens)
        try:
            self.llm.check_request(ids, params)  # a bad schema or bias key is a 400, before any stream
        except ConfigError as e:
            raise OpenAIError(400, str(e)) from e
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        stream = self.engine.submit(rid, ids, params)
        deadline = time.monotonic() + self.config.request_timeout_s
        wants_logprobs = params.logprobs is not None
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            events = self.sse(stream, request, deadline, chat, req.model, include_usage, params.n, wants_logprobs)
            return StreamingResponse(events, media_type="text/event-stream")
        texts, logprobs, finish = [""] * params.n, [[] for _ in range(params.n)], [None] * params.n
        usage = None
        try:
            while None in finish:
                out = await self.next_output(stream, request, deadline)
                if out.error is not None:
                    raise out.error
                texts[out.index] += out.text
                logprobs[out.index] += out.logprobs or []
                finish[out.index] = out.finish_reason
                usage = out.usage or usage
        except ClientGone:
            return Response(status_code=499)
        render = self.formats.chat_logprobs if chat else self.formats.completion_logprobs
        choices = []
        for i in range(params.n):
            choice = {
                "index": i,
                "logprobs": render(logprobs[i]) if wants_logprobs else None,
                "finish_reason": finish[i],
            }
            choice |= {"message": {"role": "assistant", "content": texts[i]}} if chat else {"text": texts[i]}
            choices.append(choice)
        body = self.envelope(rid, "chat.completion" if chat else "text_completion", req.model, choices)
        return JSONResponse(body | {"usage": usage})

    async def next_output(self, stream: RequestStream, request: Request, deadline: float) -> Output:
        """The request's next output; aborts it on timeout (504) or when the client has gone."""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self.engine.abort(stream.request_id)
                raise OpenAIError(504, f"request timed out after {self.config.request_timeout_s:g} s", "timeout_error")
            try:
                return await asyncio.wait_for(stream.queue.get(), timeout=min(left, 1.0))
            except TimeoutError:
                if await request.is_disconnected():
                    self.engine.abort(stream.request_id)
                    raise ClientGone() from None

    async def sse(
        self,
        stream: RequestStream,
        request: Request,
        deadline: float,
        chat: bool,
        model: str,
        include_usage: bool,
        n: int = 1,
        wants_logprobs: bool = False,
    ) -> AsyncIterator[str]:
        rid = stream.request_id
        kind = "chat.completion.chunk" if chat else "text_completion"
        done = False
        render = self.formats.chat_logprobs if chat else self.formats.completion_logprobs
        left = n  # samples still streaming

        def chunk(out: Output | None, index: int = 0, role: bool = False) -> str:
            text, finish = (out.text, out.finish_reason) if out is not None else (None, None)
            lp = render(out.logprobs or []) if wants_logprobs and out is not None else None
            if chat:
                delta = {"role": "assistant", "content": ""} if role else ({"content": text} if text else {})
                choice = {"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish}
            else:
                choice = {"index": index, "text": text or "", "logprobs": lp, "finish_reason": finish}
            body = self.envelope(rid, kind, model, [choice])
            return f"data: {json.dumps(body | ({'usage': None} if include_usage else {}))}\n\n"

        try:
            if chat:
                for i in range(n):
                    yield chunk(None, i, role=True)
            while True:
                try:
                    out = await self.next_output(stream, request, deadline)
                except OpenAIError as e:
                    out = Output(error=e)
                except ClientGone:
                    done = True
                    return
                if out.error is not None:
                    yield f"data: {json.dumps(out.error.body())}\n\n"
                    break
                if out.text or out.final:
                    yield chunk(out, out.index)
                left -= out.final
                if not left:
                    if include_usage:
                        usage = self.envelope(rid, kind, model, []) | {"usage": out.usage}
                        yield f"data: {json.dumps(usage)}\n\n"
                    break
            done = True
            yield "data: [DONE]\n\n"
        finally:
            if not done:  # cancelled mid-stream: the client disconnected
                self.engine.abort(rid)

    def envelope(self, rid: str, kind: str, model: str, choices: list[dict]) -> dict:
        return {"id": rid, "object": kind, "created": int(time.time()), "model": model, "choices": choices}

    def models(self) -> dict:
        card = {
            "id": self.config.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "specdecode",
            "max_model_len": self.llm.max_model_len,
        }
        return {"object": "list", "data": [card]}

    async def health(self) -> dict | JSONResponse:
        if not self.engine.alive:
            return JSONResponse({"status": "engine stopped"}, status_code=503)
        return {"status": "ok"}

    async def prometheus(self) -> bytes:
        return self.metrics.render()


def build_app(llm, config: ServerConfig, engine_thread: bool = True):
    """The ASGI app: FastAPI routes inside the request-counting and body-limit middleware.

    With `engine_thread` the app's lifespan runs the engine loop in a thread; without, the caller runs
    `app.state.server.engine.run()` itself (`specdecode serve` does, in the main thread).
    """
    return serve_app(Server(llm, config, ServerMetrics()), engine_thread)


def serve_app(server: Server, engine_thread: bool = True):
    """`build_app` for a given `Server`: the Ray ingress passes one whose engine and probes span replicas."""
    config, metrics = server.config, server.metrics

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        if engine_thread:
            server.engine.start()
        yield
        if engine_thread:
            server.engine.shutdown()

    app = FastAPI(title="specdecode", version="0.1.0", lifespan=lifespan)
    app.state.server = server
    auth = [Depends(server.check_auth)]

    @app.post("/v1/completions", dependencies=auth)
    async def completions(req: CompletionRequest, request: Request):
        return await server.completions(req, request)

    @app.post("/v1/chat/completions", dependencies=auth)
    async def chat_completions(req: ChatCompletionRequest, request: Request):
        return await server.chat(req, request)

    @app.get("/v1/models", dependencies=auth)
    async def models():
        return server.models()

    @app.get("/health")
    async def health():
        return await server.health()

    @app.get("/metrics")
    async def prometheus():
        return Response(await server.prometheus(), media_type=CONTENT_TYPE_LATEST)

    add_error_handlers(app)
    return CountRequests(BodyLimit(app, config.max_body_bytes), metrics), app


def add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(OpenAIError)
    async def openai_error(_: Request, exc: OpenAIError):
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError):
        return JSONResponse(OpenAIError(400, _validation_message(exc)).body(), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException):
        return JSONResponse(OpenAIError(exc.status_code, str(exc.detail)).body(), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def internal(_: Request, exc: Exception):
        err = OpenAIError(500, f"internal error: {type(exc).__name__}: {exc}", "server_error")
        return JSONResponse(err.body(), status_code=500)
