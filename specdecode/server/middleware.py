"""Plain ASGI middleware: a request-body size limit (413) and HTTP request counting for /metrics.

Pure ASGI rather than BaseHTTPMiddleware so streaming responses and client-disconnect detection pass through
untouched.
"""

from __future__ import annotations

import json

from specdecode.server.metrics import ServerMetrics

KNOWN_ENDPOINTS = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics")


async def send_error(send, status: int, message: str, type_: str) -> None:
    body = json.dumps({"error": {"message": message, "type": type_, "param": None, "code": None}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class BodyLimit:
    """Read the whole body first (it is small for this API) and refuse it past `max_bytes` with a 413."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await send_error(send, 413, f"request body over {self.max_bytes} bytes", "invalid_request_error")
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left before sending its body
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                return await send_error(send, 413, f"request body over {self.max_bytes} bytes", "invalid_request_error")
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay():
            # The body once, then the real channel: streaming handlers need it to notice a disconnect.
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


class CountRequests:
    """specdecode_http_requests{endpoint, status}; unknown paths share one label to bound cardinality."""

    def __init__(self, app, metrics: ServerMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        endpoint = path if path in KNOWN_ENDPOINTS else "other"

        async def counting_send(message):
            if message["type"] == "http.response.start":
                self.metrics.requests.labels(endpoint, str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, counting_send)
