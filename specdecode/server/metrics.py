"""Prometheus metrics of the server: speculation (drafted/accepted, per position, chosen K), latency, load.

Each app owns its registry, so two servers in one process (tests) never share counters.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from specdecode.control.base import StepStats
from specdecode.step.sequence import Sequence

LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 2, 5, 10, 30, 60, 120)
K_BUCKETS = tuple(range(0, 17)) + (24, 32, 48, 64)
MAX_POSITION_LABEL = 16  # positions past this share one label, so label cardinality stays bounded


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.drafted = Counter("specdecode_draft_tokens", "Draft tokens proposed and verified", registry=r)
        self.accepted = Counter("specdecode_accepted_tokens", "Draft tokens the target accepted", registry=r)
        self.drafted_at = Counter(
            "specdecode_draft_position_tokens", "Drafts proposed at each position", ["position"], registry=r
        )
        self.accepted_at = Counter(
            "specdecode_accepted_position_tokens", "Drafts accepted at each position", ["position"], registry=r
        )
        self.prompt_tokens = Counter("specdecode_prompt_tokens", "Prompt tokens of finished requests", registry=r)
        self.generation_tokens = Counter("specdecode_generation_tokens", "Tokens generated", registry=r)
        self.target_forwards = Counter("specdecode_target_forwards", "Target verification rows", registry=r)
        self.accepted_len = Histogram(
            "specdecode_accepted_length", "Accepted drafts per request per step", buckets=K_BUCKETS, registry=r
        )
        self.chosen_k = Histogram(
            "specdecode_speculative_k", "Draft tokens proposed per request per step", buckets=K_BUCKETS, registry=r
        )
        self.ttft = Histogram(
            "specdecode_time_to_first_token_seconds", "Time to first token", buckets=LATENCY_BUCKETS, registry=r
        )
        self.tpot = Histogram(
            "specdecode_time_per_output_token_seconds",
            "Mean time per output token after the first, per request",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "specdecode_e2e_request_latency_seconds", "End-to-end latency", buckets=LATENCY_BUCKETS, registry=r
        )
        self.step_time = Histogram("specdecode_step_seconds", "Decode step time", buckets=LATENCY_BUCKETS, registry=r)
        self.running = Gauge("specdecode_num_requests_running", "Requests in the batch", registry=r)
        self.waiting = Gauge("specdecode_num_requests_waiting", "Requests queued for a slot", registry=r)
        self.batch_tokens = Gauge("specdecode_batch_tokens", "Tokens scored by the last target forward", registry=r)
        self.requests = Counter(
            "specdecode_http_requests", "HTTP requests by endpoint and status", ["endpoint", "status"], registry=r
        )
        self.request_failures = Counter(
            "specdecode_request_failures", "Requests that failed alone; the others of their step went on", registry=r
        )
        self.aborts = Counter(
            "specdecode_request_aborts", "Requests aborted before they finished (client gone, timeout)", registry=r
        )
        self.step_failures = Counter(
            "specdecode_step_failures", "Engine steps that failed as a whole (every request of the batch)", registry=r
        )

    def observe_step(self, stats: StepStats) -> None:
        for k, a in zip(stats.num_proposed, stats.num_accepted, strict=True):
            self.drafted.inc(k)
            self.accepted.inc(a)
            self.accepted_len.observe(a)
            self.chosen_k.observe(k)
            for pos in range(1, k + 1):
                label = str(min(pos, MAX_POSITION_LABEL))
                self.drafted_at.labels(label).inc()
                if pos <= a:
                    self.accepted_at.labels(label).inc()
        self.target_forwards.inc(len(stats.seqs))
        self.step_time.observe(stats.step_time_s)
        self.batch_tokens.set(stats.num_verified_tokens)

    def observe_first_token(self, seq: Sequence) -> None:
        if seq.metrics.first_token_time is not None:
            self.ttft.observe(seq.metrics.first_token_time - seq.metrics.start_time)

    def observe_finished(self, seq: Sequence) -> None:
        m = seq.metrics
        self.prompt_tokens.inc(len(seq.prompt_ids))
        self.generation_tokens.inc(m.num_generated)
        if m.end_time is not None:
            self.e2e.observe(m.end_time - m.start_time)
            if m.first_token_time is not None and m.num_generated > 1:
                self.tpot.observe((m.end_time - m.first_token_time) / (m.num_generated - 1))

    def render(self) -> bytes:
        return generate_latest(self.registry)
