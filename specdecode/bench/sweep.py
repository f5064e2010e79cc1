"""Closed-loop load sweep: tokens/s and per-token latency of fixed and dynamic speculation lengths by concurrency.

Usage:
    specdecode bench sweep --prompts ../shared/data/specbench_question.jsonl --method ngram \\
        --concurrency 1,2,4,8,16,32 --arms none,fixed:2,fixed:5,heuristic,goodput --output results/sweep.json

At each concurrency C every arm keeps C requests in its engine: as soon as one finishes the next prompt joins
(closed loop), until `--requests-per-level` requests are done: one round. A level runs as many rounds as
it takes for every arm to finish `--min-requests` requests (the cheap low levels run several), the arms taking
turns round by round, each round on the next prompts. All arms share one loaded target (and draft); each round
gets its own engine (cache, drafter, controller), freed after it, so memory holds one arm's cache at a time.
The arms' order rotates from round to round and level to level, so slow drift of a noisy machine does not
always hit the same arm. This machine does more than drift: it moves between speeds ~1.5x apart for seconds to
minutes at a time (experiments/machine_modes.py), so besides each arm's figure pooled over its rounds the report
gives a dynamic arm's ratio to the best fixed arm as the median of the rounds' paired ratios (more rounds, from
--min-requests, make it steadier).

Steady state, the figure the targets read, is the stretch of a round after its first request finished and
before the loop stops replacing them (the drain): the start-up burst, every prompt of the level prefilled at
once with no token out yet, is a transient that continuous traffic never shows, and it grows with C.

The first C requests of a round are staggered: the i-th of them asks for ceil(max_tokens * i / C) tokens, the
rest for max_tokens, so requests finish, and their replacements prefill, a few at a time, as under continuous
traffic. Started all alike, plain decoding kept them in lockstep: at C = 8 a round was two waves, and its
steady stretch was the second wave's eight prefills at once and one wave's decoding (63.9 tokens/s against
133.6 over the whole round). `--no-stagger` starts them all alike.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from itertools import cycle, islice
from pathlib import Path

from tqdm import tqdm

from specdecode.bench.sweep_config import ArmSpec, LevelRun, SweepConfig, parse_arms
from specdecode.config import ConfigError, SamplingParams
from specdecode.control import Controller, StepStats
from specdecode.drafters import DrafterContext, make_drafter
from specdecode.engine.engine import Engine
from specdecode.prompts import Prompt
from specdecode.step.proposal import Proposal
from specdecode.step.sequence import Sequence

WARMUP_TOKENS = 8


class RecordingController:
    """An arm's controller that also keeps its last choice: the drafter may propose fewer (no n-gram match),
    and the engine clamps K near max_tokens, so `num_proposed` alone would hide what the controller wanted."""

    def __init__(self, inner: Controller) -> None:
        self.inner = inner
        self.last: list[int] = []

    def choose(self, seqs: list[Sequence], k_max: int) -> list[int]:
        self.last = self.inner.choose(seqs, k_max)
        return self.last

    def observe(self, stats: StepStats) -> None:
        self.inner.observe(stats)

    def truncate(self, seqs: list[Sequence], proposal: Proposal) -> Proposal:
        return self.inner.truncate(seqs, proposal)

    def forget(self, seq: Sequence) -> None:
        self.inner.forget(seq)

    def live_request_ids(self) -> set[str]:
        return self.inner.live_request_ids()

    def bind_drafter(self, drafter) -> None:
        self.inner.bind_drafter(drafter)


def build_engine(base, arm: ArmSpec, num_seqs: int, max_len: int) -> Engine:
    """An engine for `arm` on the target (and draft) that `base` (an LLM) already loaded: no weights reloaded."""
    method = base.spec.method if arm.k > 0 else "none"
    spec = replace(base.spec, method=method, num_speculative_tokens=arm.k, controller=arm.controller)
    config = replace(base.engine_config, max_num_seqs=num_seqs, max_model_len=max_len)
    ctx = DrafterContext(base.target, base.draft_model, spec, config, max_len)
    return Engine(
        base.target,
        base.tokenizer,
        make_drafter(ctx),
        RecordingController(base.new_controller(arm.controller)),
        config,
        spec.k,
        max_len,
        base.engine.eos_token_ids,
    )


def staggered(max_tokens: int, i: int, concurrency: int) -> int:
    """Tokens asked of the i-th (from 0) of a round's first `concurrency` requests: their finishes spread
    evenly over one request's length, as if the loop had been running for ever."""
    return max(1, -(-max_tokens * (i + 1) // concurrency))


def closed_loop(
    engine: Engine,
    prompts: Iterator[list[int]],
    concurrency: int,
    num_requests: int,
    params: SamplingParams,
    bar,
    stagger: bool = False,
    on_step: Callable[[bool, float, list, StepStats | None], None] | None = None,
) -> LevelRun:
    """Keep `concurrency` requests in the engine until `num_requests` are done; time and trace every step.

    stagger: the first `concurrency` requests ask for 1/C, 2/C, ... of params.max_tokens (see `staggered`).
    on_step: called after every step with whether it was steady, its seconds, its updates and its StepStats (None
    for a step that decoded nothing): what experiments/sweep_steady_window.py logs."""
    recorder = engine.controller
    assert isinstance(recorder, RecordingController), "build engines with build_engine"
    seqs: list[Sequence] = []
    first: dict[str, float] = {}
    run = LevelRun(0.0, 0, num_requests, [], [])

    full = min(concurrency, num_requests)

    def submit() -> None:
        prompt = next(prompts)
        run.prompt_tokens += len(prompt)
        i = len(seqs)
        own = replace(params, max_tokens=staggered(params.max_tokens, i, full)) if stagger and i < full else params
        seqs.append(engine.add_request(f"sweep-{i}", prompt, own))

    t0 = time.perf_counter()
    for _ in range(full):
        submit()
    replacing = False  # a request has finished and been replaced: the start-up burst is over
    while engine.has_work():
        before = engine.last_step
        steady = replacing and len(engine.running) + len(engine.waiting) == full
        s0 = time.perf_counter()
        updates = engine.step()
        now = time.perf_counter()
        run.step_s.append(now - s0)
        if steady:
            run.steady_seconds += now - s0
            run.steady_tokens += sum(len(u.new_token_ids) for u in updates)
        if on_step is not None:
            on_step(steady, now - s0, updates, engine.last_step if engine.last_step is not before else None)
        if engine.last_step is not before:  # a decode step ran (prefill-only steps propose nothing)
            ks = engine.last_step.num_proposed
            run.k_max.append(max(ks))
            run.k_mean.append(sum(ks) / len(ks))
            run.rows.append(len(ks))
            run.k_chosen.append(sum(recorder.last) / len(recorder.last))
        for u in updates:
            first.setdefault(u.seq.request_id, now)
            if u.finished:
                n = u.seq.metrics.num_generated
                if n > 1:
                    run.tpot_s.append((now - first[u.seq.request_id]) / (n - 1))
                bar.update(1)
                if len(seqs) < num_requests:
                    submit()
                    replacing = True
    run.seconds = time.perf_counter() - t0
    for s in seqs:
        run.tokens += s.metrics.num_generated
        run.drafted += s.metrics.num_drafted
        run.trees |= s.metrics.trees
        run.accepted += s.metrics.num_accepted
        run.forwards += s.metrics.num_target_forwards
    run.round_tps = [run.tokens_per_s()]
    return run


def max_len_for(prompts: list[list[int]], max_tokens: int, k_max: int, limit: int) -> int:
    """The shortest context that fits every prompt, its output and one step's drafts; caches are sized by it."""
    longest = max(len(p) for p in prompts)
    if longest >= limit:
        raise ConfigError(f"a prompt has {longest} tokens but the context is {limit}; raise --max-model-len")
    return min(longest + max_tokens + k_max + 1, limit)


def run_sweep(base, arms: list[ArmSpec], prompts: list[list[int]], cfg: SweepConfig) -> dict[str, dict[int, LevelRun]]:
    """Every arm at every level; prompts (token ids) cycle. Returns runs[arm name][concurrency]."""
    max_len = max_len_for(prompts, cfg.max_tokens, max(a.k for a in arms), base.max_model_len)
    params = SamplingParams(temperature=0.0, max_tokens=cfg.max_tokens)
    warm = SamplingParams(temperature=0.0, max_tokens=min(cfg.max_tokens, WARMUP_TOKENS))
    runs: dict[str, dict[int, LevelRun]] = {a.name: {} for a in arms}
    total = sum(cfg.total_requests(c) for c in cfg.concurrency) * len(arms)
    turn = 0
    with tqdm(total=total, desc="sweep", unit="req") as bar:
        for c in cfg.concurrency:
            n = cfg.num_requests(c)
            for r in range(cfg.rounds(c)):
                order = arms[turn % len(arms) :] + arms[: turn % len(arms)]
                turn += 1
                for arm in order:
                    bar.set_postfix_str(f"C={c} {arm.name} round {r + 1}/{cfg.rounds(c)}")
                    engine = build_engine(base, arm, c, max_len)
                    if cfg.warmup:
                        closed_loop(engine, cycle(prompts), c, cfg.warmup, warm, NullBar())
                    # Every arm sees the same prompts in the same order in a round; each round the next ones.
                    todo = islice(cycle(prompts), r * n, None)
                    run = closed_loop(engine, todo, c, n, params, bar, cfg.stagger)
                    runs[arm.name][c] = runs[arm.name][c].merge(run) if r else run
                    del engine  # frees its cache before the next arm allocates one
    return runs


class NullBar:
    def update(self, n: int) -> None:
        pass


def interleave(prompts: list[Prompt]) -> list[Prompt]:
    """Round robin over categories (each in file order), so that every level's first requests mix them alike.

    Spec-Bench lists its prompts by category, and a level runs the first max(4, 2C) of them: in file order the
    small levels saw only short writing prompts and C = 32 the first long extraction ones, so levels differed
    in their prompts more than in their load.
    """
    by_category: dict[str, list[Prompt]] = {}
    for p in prompts:
        by_category.setdefault(p.category, []).append(p)
    columns = [iter(ps) for ps in by_category.values()]
    out: list[Prompt] = []
    while len(out) < len(prompts):
        out += [p for p in (next(c, None) for c in columns) if p is not None]
    return out


def encode_prompts(llm, a: argparse.Namespace) -> tuple[list[list[int]], list[str]]:
    """Spec-Bench prompts through the chat template (as specbench does), categories interleaved: token ids and
    texts (for peers)."""
    from specdecode.prompts import load_jsonl

    texts = [p.text for p in interleave(load_jsonl(a.prompts))]
    if a.chat:
        texts = [llm.apply_chat_template([{"role": "user", "content": t}]) for t in texts]
    return [llm.encode(t) for t in texts], texts


def run_from_args(a: argparse.Namespace) -> None:
    from rich.console import Console

    from specdecode.bench.args import DEFAULT_ARMS
    from specdecode.bench.lib import provenance
    from specdecode.bench.sweep_peers import run_peers
    from specdecode.bench.sweep_report import report
    from specdecode.llm_args import llm_from_args
    from specdecode.prompts import load_jsonl

    load_jsonl(a.prompts)  # a bad prompts file fails before any model loads
    if a.method == "none":
        raise ConfigError("the sweep compares speculation lengths: give a drafter with --method (ngram, draft, self)")
    arms = parse_arms(a.arms, a.num_speculative_tokens, DEFAULT_ARMS)
    cfg = SweepConfig(a.concurrency, a.max_tokens, a.requests_per_level, a.warmup, a.min_requests, a.stagger)
    # The base LLM holds the weights for every arm's engine; its own engine gets one slot as it is not timed.
    # Its context is the model's whole (as in specbench) so that long RAG prompts fit; caches are sized later.
    k_max = max(arm.k for arm in arms)
    base = llm_from_args(a, num_speculative_tokens=k_max, max_num_seqs=1, max_model_len=a.max_model_len or 8192)
    prompt_ids, texts = encode_prompts(base, a)
    runs = run_sweep(base, arms, prompt_ids, cfg)
    peer_texts = [texts[i % len(texts)] for i in range(cfg.total_requests(1))]  # the prompts C = 1 saw
    peers = run_peers(a, base, peer_texts, cfg) if a.peers and 1 in cfg.concurrency else {}
    meta = {
        **provenance(model=base.target),
        "target": a.target,
        "method": a.method,
        "draft": a.draft,
        "num_speculative_tokens": a.num_speculative_tokens,
        "prompts": a.prompts,
    }
    report(Path(a.output), meta, arms, cfg, runs, peers, Console(file=sys.stdout))
