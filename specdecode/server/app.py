"""The OpenAI-compatible HTTP API over one `AsyncEngine`.

Every request is fully validated (schema, model name, context length, token ids) before it reaches the engine,
so a streaming response only starts once the request is known to be servable; after that, errors arrive as an
`error` event in the stream.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Protocol, TypeVar

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from specdecode.config import ConfigError, SamplingParams
from specdecode.grammar import check_schema
from specdecode.server.async_engine import AsyncEngine, Output, RequestStream
from specdecode.server.logprobs import LogprobFormats
from specdecode.server.metrics import ServerMetrics
from specdecode.server.middleware import BodyLimit, CountRequests
from specdecode.server.protocol import ChatCompletionRequest, CompletionRequest, OpenAIError, _Common

T = TypeVar("T")

COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions; chat defaults to the context left


@dataclass(frozen=True)
class ServerConfig:
    model_name: str
    api_key: str | None = None
    max_waiting: int = 64
    request_timeout_s: float = 600.0
    max_body_bytes: int = 4 * 1024 * 1024
    # What one request may ask for; past any of these it gets a 400. This is the one place they are set.
    max_stop_strings: int = 4  # OpenAI's limit
    max_stop_chars: int = 256  # per stop string: each step looks for every one in the text's tail
    max_logit_bias: int = 300  # entries; OpenAI's limit
    max_messages: int = 2048  # per chat request; the chat template walks them all
    # JSON schemas (response_format), checked before compiling: compile time and memory grow with each.
    max_schema_bytes: int = 64 * 1024
    max_schema_depth: int = 32
    max_schema_enum: int = 1024  # values of one enum
    max_schema_repeat: int = 256  # a string's min/maxLength (a regex of that many characters) and a pattern's {n,m}
    grammar_timeout_s: float = 10.0  # a schema that has not compiled by then is refused (it compiles ~20-50 ms)
    grammar_workers: int = 2  # schemas compiling at once, each in its own thread, off the event loop

    def __post_init__(self) -> None:
        if self.max_waiting < 0:
            raise ConfigError(f"max_waiting must be >= 0, got {self.max_waiting}")
        if self.request_timeout_s <= 0:
            raise ConfigError(f"request timeout must be > 0, got {self.request_timeout_s}")
        if self.max_body_bytes < 1024:
            raise ConfigError(f"max body size must be >= 1024 bytes, got {self.max_body_bytes}")
        for name in (
            "max_stop_strings",
            "max_stop_chars",
            "max_logit_bias",
            "max_messages",
            "max_schema_bytes",
            "max_schema_depth",
            "max_schema_enum",
            "max_schema_repeat",
            "grammar_workers",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.grammar_timeout_s <= 0:
            raise ConfigError(f"grammar timeout must be > 0, got {self.grammar_timeout_s}")


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
        # Tokenizing and the chat template run here, off the event loop, so a long prompt stalls no stream and no
        # /health. One thread: a Hugging Face tokenizer is not safe to use from several at once.
        self.tokenizer_thread = ThreadPoolExecutor(1, thread_name_prefix="specdecode-tokenizer")
        self._compiling = asyncio.Semaphore(config.grammar_workers)

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

    def check_limits(self, req: _Common) -> None:
        """The bounds of ServerConfig on what one request may ask for; 400 past any."""
        c = self.config
        stops = [req.stop] if isinstance(req.stop, str) else req.stop or []
        if len(stops) > c.max_stop_strings:
            raise OpenAIError(400, f"at most {c.max_stop_strings} stop sequences", param="stop")
        if any(len(stop) > c.max_stop_chars for stop in stops):
            raise OpenAIError(400, f"a stop sequence may have at most {c.max_stop_chars} characters", param="stop")
        if req.logit_bias and len(req.logit_bias) > c.max_logit_bias:
            raise OpenAIError(400, f"logit_bias may have at most {c.max_logit_bias} entries", param="logit_bias")
        if isinstance(req, ChatCompletionRequest):
            if len(req.messages) > c.max_messages:
                raise OpenAIError(400, f"at most {c.max_messages} messages per request", param="messages")
            so = req.structured()
            if so is not None and so.json is not None:
                try:
                    check_schema(
                        so.json, c.max_schema_bytes, c.max_schema_depth, c.max_schema_enum, c.max_schema_repeat
                    )
                except ConfigError as e:
                    raise OpenAIError(400, str(e), param="response_format") from e

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

    async def in_tokenizer_thread(self, fn: Callable[..., T], *args) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.tokenizer_thread, fn, *args)

    async def encode(self, text: str) -> list[int]:
        try:
            return await self.in_tokenizer_thread(self.llm.encode, text)
        except ConfigError as e:
            raise OpenAIError(400, str(e), param="prompt") from e

    async def check_request(self, ids: list[int], params: SamplingParams) -> None:
        """What the engine would refuse, refused here as a 400 before any stream. A schema compiles in a thread
        of its own (a slow one must not stall the event loop), bounded in time: `compile_bounded`."""
        try:
            if params.structured_outputs is None:
                self.llm.check_request(ids, params)
            else:
                await self.compile_bounded(ids, params)
        except ConfigError as e:
            raise OpenAIError(400, str(e)) from e

    async def compile_bounded(self, ids: list[int], params: SamplingParams) -> None:
        """llm.check_request, which compiles the schema, in a daemon thread: at most grammar_workers at once, and
        refused once grammar_timeout_s have passed. A thread cannot be stopped; one that outlives its request
        finishes on its own (its grammar is cached) and holds its place among the workers until then."""
        loop, timeout = asyncio.get_running_loop(), self.config.grammar_timeout_s
        deadline = loop.time() + timeout
        try:
            await asyncio.wait_for(self._compiling.acquire(), timeout)
        except TimeoutError:
            raise OpenAIError(
                429, "every schema compiler is busy; retry shortly", "rate_limit_error", headers={"Retry-After": "1"}
            ) from None
        done: asyncio.Future = loop.create_future()

        def finish(error: BaseException | None) -> None:  # on the event loop
            self._compiling.release()
            if done.done():  # the request timed out or went away
                return
            if error is None:
                done.set_result(None)
            else:
                done.set_exception(error)

        def compile_() -> None:
            error = None
            try:
                self.llm.check_request(ids, params)
            except BaseException as e:  # noqa: BLE001 - handed to the request, which raises it
                error = e
            try:
                loop.call_soon_threadsafe(finish, error)
            except RuntimeError:  # the event loop has closed: nobody waits
                pass

        threading.Thread(target=compile_, name="specdecode-grammar", daemon=True).start()
        try:
            await asyncio.wait_for(asyncio.shield(done), max(0.0, deadline - loop.time()))
        except TimeoutError:
            done.cancel()
            raise OpenAIError(
                400, f"the JSON schema did not compile within {timeout:g} s; simplify it", param="response_format"
            ) from None

    # ---- endpoints ------------------------------------------------------------------------------------
    async def completions(self, req: CompletionRequest, request: Request):
        req.check_supported()
        self.check_model(req)
        self.check_limits(req)
        prompt = req.single_prompt()
        ids = prompt if isinstance(prompt, list) else await self.encode(prompt)
        self.check_tokens(ids)
        n = self.max_tokens(req.max_tokens, len(ids), COMPLETION_DEFAULT_MAX_TOKENS)
        return await self.respond(req, request, ids, n, chat=False)

    async def chat(self, req: ChatCompletionRequest, request: Request):
        req.check_supported()
        self.check_model(req)
        self.check_limits(req)
        try:
            text = await self.in_tokenizer_thread(
                self.llm.apply_chat_template, [m.as_template_dict() for m in req.messages]
            )
        except ConfigError as e:
            raise OpenAIError(400, str(e), param="messages") from e
        except Exception as e:  # noqa: BLE001 - a template may reject a conversation in its own words
            raise OpenAIError(400, f"chat template failed: {e}", param="messages") from e
        ids = await self.encode(text)
        n = self.max_tokens(req.requested_max_tokens, len(ids), None)
        return await self.respond(req, request, ids, n, chat=True)

    async def respond(self, req: _Common, request: Request, ids: list[int], max_tokens: int, chat: bool):
        params = req.sampling(max_tokens)
        await self.check_request(ids, params)  # a bad schema or bias key is a 400, before any stream
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
                out = await asyncio.wait_for(stream.queue.get(), timeout=min(left, 1.0))
            except TimeoutError:
                out = None
            # Once a second, whether or not tokens are flowing: a non-streamed request whose client left while
            # it decoded was otherwise run to its end (the check ran only when no output came for a second).
            now = time.monotonic()
            if out is None or now - stream.checked_at >= 1.0:
                stream.checked_at = now
                if await request.is_disconnected():
                    self.engine.abort(stream.request_id)
                    raise ClientGone() from None
            if out is not None:
                return out

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
        failure = self.engine.last_step_failure  # a whole batch failed once; the engine serves on
        return {"status": "ok"} if failure is None else {"status": "ok", "last_step_failure": failure}

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
