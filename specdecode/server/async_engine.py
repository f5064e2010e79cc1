"""The engine loop; HTTP handlers talk to it through a command inbox and per-request queues.

One loop owns the `Engine`: requests join at step boundaries, leave when finished or aborted, and an exception
inside a step fails the requests of that batch (500) but never the loop. torch releases the GIL during the
forward, so the asyncio event loop keeps accepting and streaming while the engine computes.

`specdecode serve` runs this loop in the main thread and the HTTP server in another: on CPU, PyTorch's OpenMP
team is fast only for the thread that created it (a decode step of SmolLM2 took 30 ms in the main thread and
51 ms in a second thread on the 2-core machine). `start()` runs it in a thread instead, for in-process use.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from dataclasses import dataclass, field

from specdecode.config import ConfigError, SamplingParams
from specdecode.engine.engine import Engine, SeqUpdate
from specdecode.free_memory import release_free_memory
from specdecode.server.metrics import ServerMetrics
from specdecode.server.protocol import OpenAIError
from specdecode.step.sequence import SeqMetrics, Sequence, Status, TokenLogprob

log = logging.getLogger("specdecode.server")


@dataclass
class Output:
    """One message to a request's stream: new text of sample `index`, and on its last one the finish reason. The
    request's very last message (its last sample's final one) carries the usage; an error ends the stream."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict | None = None
    error: OpenAIError | None = None
    index: int = 0
    logprobs: list[TokenLogprob] | None = None  # one per new token, when the request asked
    ends_request: bool = False  # set on the request's last message (that of its last sample, or an error)

    @property
    def final(self) -> bool:
        """The last message of this sample (or an error, which ends the whole request)."""
        return self.finish_reason is not None or self.error is not None

    @property
    def done(self) -> bool:
        """Nothing follows this message on the request's stream."""
        return self.ends_request or self.error is not None


class RequestStream:
    """The asyncio side of one request; the engine thread puts into it thread-safely."""

    def __init__(self, request_id: str, loop: asyncio.AbstractEventLoop) -> None:
        self.request_id = request_id
        self.loop = loop
        self.queue: asyncio.Queue[Output] = asyncio.Queue()
        self.checked_at = 0.0  # when the HTTP side last asked whether the client is still there (monotonic)

    def put(self, out: Output) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, out)


def usage_of(seqs: Sequence | list[Sequence]) -> dict:
    """OpenAI usage plus the speculative counters (also as accepted/rejected prediction tokens); the samples of
    one request (n > 1) share the prompt and add up the rest."""
    seqs = seqs if isinstance(seqs, list) else [seqs]
    total = SeqMetrics(start_time=seqs[0].metrics.start_time)
    for s in seqs:
        for name in ("num_drafted", "num_accepted", "num_target_forwards", "num_generated"):
            setattr(total, name, getattr(total, name) + getattr(s.metrics, name))
        total.trees |= s.metrics.trees
    m = total.as_dict()
    rate = "node_acceptance_rate" if total.trees else "acceptance_rate"  # per node for token trees
    n_prompt, n_out = len(seqs[0].prompt_ids), total.num_generated
    return {
        "prompt_tokens": n_prompt,
        "completion_tokens": n_out,
        "total_tokens": n_prompt + n_out,
        "completion_tokens_details": {
            "accepted_prediction_tokens": m["num_accepted"],
            "rejected_prediction_tokens": m["num_drafted"] - m["num_accepted"],
        },
        "speculative": {
            "drafted_tokens": m["num_drafted"],
            "accepted_tokens": m["num_accepted"],
            rate: m[rate],
            "mean_accepted_tokens": m["mean_accepted_tokens"],
            "target_forwards": m["num_target_forwards"],
        },
    }


def at_capacity(capacity: int) -> OpenAIError:
    """The 429 for a server whose running + queued requests are at capacity (here, or over all replicas)."""
    return OpenAIError(
        429,
        f"server is at capacity ({capacity} requests running or queued); retry shortly",
        "rate_limit_error",
        headers={"Retry-After": "1"},
    )


class AsyncEngine:
    def __init__(self, engine: Engine, max_waiting: int, metrics: ServerMetrics) -> None:
        self.engine = engine
        self.capacity = engine.config.max_num_seqs + max_waiting  # running + queued requests
        self.metrics = metrics
        self._lock = threading.Lock()
        self._inbox: deque[tuple] = deque()
        self._streams: dict[str, RequestStream] = {}
        self._seqs: dict[str, list[Sequence]] = {}  # a request's samples, by request id
        self._unfinished: dict[str, int] = {}  # samples of a request still to send their final message
        self._wake = threading.Event()
        self._stopping = False
        self._running = False
        self._stepped = False  # a step ran since the loop was last idle
        self._thread: threading.Thread | None = None
        self.last_step_failure: str | None = None  # the last whole-batch failure, shown by /health

    # ---- the HTTP side --------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the loop (again, after a shutdown: an ASGI host may run the lifespan more than once)."""
        if self.alive:
            return
        self._stopping = False
        self._thread = threading.Thread(target=self.run, name="specdecode-engine", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    @property
    def alive(self) -> bool:
        return self._running

    def submit(self, request_id: str, prompt_ids: list[int], params: SamplingParams) -> RequestStream:
        """Queue a request; 429 when running + queued requests are at capacity."""
        stream = RequestStream(request_id, asyncio.get_running_loop())
        with self._lock:
            if len(self._streams) >= self.capacity:
                raise at_capacity(self.capacity)
            self._streams[request_id] = stream
            self._inbox.append(("add", request_id, prompt_ids, params))
        self._wake.set()
        return stream

    def abort(self, request_id: str) -> None:
        """Cancel a request (client gone, timeout); its slot is free by the next step."""
        with self._lock:
            if self._streams.pop(request_id, None) is None:
                return
            self._inbox.append(("abort", request_id))
        self._wake.set()

    @property
    def num_outstanding(self) -> int:
        return len(self._streams)

    # ---- the engine thread ----------------------------------------------------------------------------
    def run(self) -> None:
        """The loop itself, in the calling thread, until `shutdown()`."""
        self._running = True
        try:
            self._loop()
        finally:
            self._running = False

    def _loop(self) -> None:
        while not self._stopping:
            self._wake.clear()
            self._drain_inbox()
            idle = not self.engine.has_work()
            if idle and self._stepped:  # before the gauges say idle: idle memory is measured after it
                release_free_memory()
                self._stepped = False
            self.metrics.running.set(len(self.engine.running))
            self.metrics.waiting.set(len(self.engine.waiting))
            if idle:
                self._wake.wait(timeout=0.5)
                continue
            self._stepped = True
            try:
                updates = self.engine.step()
            except Exception as e:  # noqa: BLE001 - one failing batch must not stop the server
                log.exception("engine step failed")
                self._fail_all(e)
                continue
            self._publish(updates)

    def _drain_inbox(self) -> None:
        while True:
            with self._lock:
                if not self._inbox:
                    return
                cmd = self._inbox.popleft()
            if cmd[0] == "add":
                self._add(*cmd[1:])
            else:
                self.engine.abort(cmd[1])
                if self._seqs.pop(cmd[1], None) is not None:  # it was still queued or running: now released
                    self.metrics.aborts.inc()
                self._unfinished.pop(cmd[1], None)

    def _add(self, request_id: str, prompt_ids: list[int], params: SamplingParams) -> None:
        try:
            self._seqs[request_id] = self.engine.add_samples(request_id, prompt_ids, params)
        except ConfigError as e:
            self._end(request_id, Output(error=OpenAIError(400, str(e))))
        except Exception as e:  # noqa: BLE001 - a request the checks missed fails alone, the loop goes on
            log.exception("add_request failed")
            self._end(request_id, Output(error=OpenAIError(500, f"internal error: {e}", "server_error")))

    def _publish(self, updates: list[SeqUpdate]) -> None:
        stats, self.engine.last_step = self.engine.last_step, None
        if stats is not None:
            self.metrics.observe_step(stats)
        for u in updates:
            rid = u.seq.group
            if u.seq.error is not None:  # this request failed alone: its other samples stop, the others go on
                self._fail_request(rid, u.seq.error)
                continue
            first = u.seq.metrics.num_generated == len(u.new_token_ids)
            if first:
                self.metrics.observe_first_token(u.seq)
            out = Output(u.new_text, u.new_token_ids, index=u.seq.index, logprobs=u.new_logprobs)
            if u.finished:
                self.metrics.observe_finished(u.seq)
                out.finish_reason = u.seq.finish_reason
                samples = self._seqs.get(rid, [u.seq])
                self._unfinished[rid] = self._unfinished.get(rid, len(samples)) - 1
                if not self._unfinished[rid]:  # the request's last message (samples may end in one step)
                    del self._unfinished[rid]
                    self._seqs.pop(rid, None)
                    out.usage = usage_of(samples)
                    self._end(rid, out)
                    continue
            stream = self._streams.get(rid)
            if stream is not None:
                stream.put(out)

    def _end(self, request_id: str, out: Output) -> None:
        out.ends_request = True
        with self._lock:
            stream = self._streams.pop(request_id, None)
        if stream is not None:
            stream.put(out)

    def _fail_request(self, request_id: str, error: str) -> None:
        """One request's own failure: an OpenAI error body (or an error event in its stream) for it alone."""
        if request_id not in self._seqs:
            return  # already ended (another of its samples failed first)
        self._seqs.pop(request_id)
        self._unfinished.pop(request_id, None)
        self.engine.abort(request_id)
        self.metrics.request_failures.inc()
        self._end(request_id, Output(error=OpenAIError(500, f"request failed: {error}", "server_error")))

    def _fail_all(self, exc: Exception) -> None:
        """Abort the requests of the failed batch with a 500; queued ones and new ones are served as usual."""
        err = OpenAIError(500, f"internal error while decoding: {type(exc).__name__}: {exc}", "server_error")
        self.metrics.step_failures.inc()
        self.last_step_failure = f"{type(exc).__name__}: {exc}"
        for rid, samples in list(self._seqs.items()):
            if all(s.status is Status.WAITING for s in samples):
                continue
            self._seqs.pop(rid)
            self._unfinished.pop(rid, None)
            try:
                self.engine.abort(rid)
            except Exception:  # noqa: BLE001 - keep failing the others
                log.exception("abort after a failed step")
            self._end(rid, Output(error=err))
        self.engine.last_step = None
