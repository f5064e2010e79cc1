"""`specdecode bench serve`: open-loop Poisson arrivals against a live server, one server per arm.

Each arm (`none`, `fixed:K`, `goodput`, ...) gets its own `specdecode serve` process with that speculation
setting; requests arrive at each rate as a Poisson process whatever the server's state (open loop), stream
their tokens over HTTP, and we record time to first token (TTFT), time per output token after the first
(TPOT), end-to-end latency and throughput. Arrival times are drawn once per rate from a fixed seed, so every
arm sees the same schedule and the same prompts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import numpy as np
from rich.console import Console
from rich.table import Table
from tqdm import tqdm

from specdecode.bench.lib import provenance, write_result
from specdecode.config import ConfigError
from specdecode.prompts import load_jsonl
from specdecode.server.process import LiveServer

DEFAULT_RATES = (0.25, 0.5, 1.0, 2.0)
SERVED_NAME = "bench"


@dataclass
class RequestTiming:
    start: float  # arrival, seconds since the level began
    ttft: float
    tpot: float  # mean seconds per output token after the first (nan for one-token answers)
    e2e: float
    tokens: int
    status: int


def expand_arms(arms: list[str], replicas: list[int] | None) -> list[str]:
    """Each arm once, or with `bench serve --replicas 1,2` once per replica count: 'goodput x2'."""
    return [f"{arm} x{n}" for arm in arms for n in replicas] if replicas else arms


def arm_flags(arm: str, a: argparse.Namespace) -> list[str]:
    """`specdecode serve` flags of an arm; 'ARM xN' serves N replicas on Ray Serve."""
    name, _, replicas = arm.partition(" x")
    # The later flags win in argparse, so the arm's --method none overrides the model's method.
    flags = model_flags(a) + parse_arm(name, a.num_speculative_tokens)
    return flags + (["--replicas", replicas] if replicas else [])


def parse_arm(arm: str, k_max: int) -> list[str]:
    """'none' | 'fixed:3' | 'goodput' | 'goodput:8' -> `specdecode serve` flags."""
    name, _, k = arm.partition(":")
    if name == "none":
        return ["--method", "none", "--num-speculative-tokens", "0"]
    if k and not k.isdigit():
        raise ConfigError(f"arm {arm!r}: K must be an integer")
    return ["--controller", name, "--num-speculative-tokens", k or str(k_max)]


async def one_request(client: httpx.AsyncClient, url: str, prompt: str, max_tokens: int, t0: float) -> RequestTiming:
    body = {
        "model": SERVED_NAME,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    first = last = None
    tokens = 0
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            await r.aread()
            return RequestTiming(start - t0, float("nan"), float("nan"), float("nan"), 0, r.status_code)
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
            elif event.get("choices") and event["choices"][0]["delta"].get("content"):
                last = time.perf_counter()
                first = first or last
    end = time.perf_counter()
    first = first or end
    tpot = ((last or end) - first) / (tokens - 1) if tokens > 1 else float("nan")
    return RequestTiming(start - t0, first - start, tpot, end - start, tokens, 200)


async def run_level(url: str, prompts: list[str], arrivals: np.ndarray, max_tokens: int) -> list[RequestTiming]:
    """Fire request i at arrivals[i] seconds, regardless of the others (open loop)."""
    limits = httpx.Limits(max_connections=len(prompts) + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        t0 = time.perf_counter()

        async def fire(i: int) -> RequestTiming:
            await asyncio.sleep(max(0.0, arrivals[i] - (time.perf_counter() - t0)))
            return await one_request(client, url, prompts[i], max_tokens, t0)

        return await asyncio.gather(*(fire(i) for i in range(len(prompts))))


def summarise(timings: list[RequestTiming]) -> dict[str, float]:
    ok = [t for t in timings if t.status == 200]
    span = max((t.start + t.e2e for t in ok), default=0.0) - min((t.start for t in ok), default=0.0)

    def pct(values: list[float], q: float) -> float:
        values = [v for v in values if v == v]  # drop NaN
        return float(np.percentile(values, q)) if values else float("nan")

    return {
        "requests": len(timings),
        "ok": len(ok),
        "output_tokens": sum(t.tokens for t in ok),
        "throughput_tok_s": sum(t.tokens for t in ok) / span if span > 0 else 0.0,
        "ttft_p50_s": pct([t.ttft for t in ok], 50),
        "ttft_p99_s": pct([t.ttft for t in ok], 99),
        "tpot_p50_s": pct([t.tpot for t in ok], 50),
        "tpot_p99_s": pct([t.tpot for t in ok], 99),
        "e2e_p50_s": pct([t.e2e for t in ok], 50),
    }


def scrape_speculation(url: str) -> dict[str, float]:
    """Drafted/accepted totals and mean chosen K from the server's own /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for s in family.samples:
            if set(s.labels) <= {"replica"}:  # totals, summed over replicas (`serve --replicas`)
                values[s.name] = values.get(s.name, 0.0) + s.value
    k_count = values.get("specdecode_speculative_k_count", 0.0)
    return {
        "drafted": values.get("specdecode_draft_tokens_total", 0.0),
        "accepted": values.get("specdecode_accepted_tokens_total", 0.0),
        "mean_k": values.get("specdecode_speculative_k_sum", 0.0) / k_count if k_count else 0.0,
    }


def model_flags(a: argparse.Namespace) -> list[str]:
    flags = ["--target", a.target, "--method", a.method, "--served-model-name", SERVED_NAME]
    flags += ["--max-num-seqs", str(a.max_num_seqs), "--max-queue", "1024", "--device", a.device, "--dtype", a.dtype]
    flags += ["--ngram-min", str(a.ngram_min), "--ngram-max", str(a.ngram_max)]
    flags += ["--suffix-cache-max-tokens", str(a.suffix_cache_max_tokens)]
    flags += ["--suffix-max-depth", str(a.suffix_max_depth)]
    flags += ["--suffix-spec-factor", str(a.suffix_spec_factor), "--suffix-min-prob", str(a.suffix_min_prob)]
    flags += ["--suffix-request-spec-factor", str(a.suffix_request_spec_factor)]
    for path in a.suffix_corpus or ():
        flags += ["--suffix-corpus", path]
    if a.draft:
        flags += ["--draft", a.draft]
    if a.max_model_len:
        flags += ["--max-model-len", str(a.max_model_len)]
    if a.enforce_eager:  # no compile in each server (or each replica)
        flags += ["--enforce-eager"]
    return flags


def run_arm(arm: str, a: argparse.Namespace, prompts: list[str], schedules: dict[float, np.ndarray], bar, logdir):
    """All rates against one server for this arm; speculation counters are per rate (deltas of /metrics)."""
    levels = {}
    log = Path(logdir) / f"{arm.replace(':', '_').replace(' ', '_')}.log"
    with LiveServer(arm_flags(arm, a), log) as server:
        asyncio.run(run_level(server.url, prompts[: a.warmup or 1], np.zeros(a.warmup or 1), 16))
        for rate, arrivals in schedules.items():
            before = scrape_speculation(server.url)
            timings = asyncio.run(run_level(server.url, prompts[: len(arrivals)], arrivals, a.max_tokens))
            after = scrape_speculation(server.url)
            drafted = after["drafted"] - before["drafted"]
            levels[rate] = summarise(timings) | {
                "acceptance_rate": (after["accepted"] - before["accepted"]) / drafted if drafted else 0.0,
                "timings": [asdict(t) for t in timings],
            }
            bar.update(1)
    return levels


def render(results: dict[str, dict[float, dict]], rates: list[float], console: Console) -> str:
    md = []
    for metric, title, scale in (
        ("tpot_p50_s", "TPOT p50 (ms)", 1e3),
        ("ttft_p50_s", "TTFT p50 (ms)", 1e3),
        ("tpot_p99_s", "TPOT p99 (ms)", 1e3),
        ("throughput_tok_s", "throughput (tok/s)", 1),
    ):
        table = Table(title=title)
        table.add_column("arm")
        for r in rates:
            table.add_column(f"{r:g} req/s", justify="right")
        md += [f"### {title}", "", "| arm | " + " | ".join(f"{r:g} req/s" for r in rates) + " |"]
        md.append("|---" * (len(rates) + 1) + "|")
        for arm, levels in results.items():
            cells = [f"{levels[r][metric] * scale:.1f}" for r in rates]
            table.add_row(arm, *cells)
            md.append(f"| {arm} | " + " | ".join(cells) + " |")
        console.print(table)
        md.append("")
    return "\n".join(md)


def plot(results: dict[str, dict[float, dict]], rates: list[float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for arm, levels in results.items():
        style = dict(marker="o", linewidth=2.5 if not arm.startswith(("none", "fixed")) else 1.2)
        axes[0].plot(rates, [levels[r]["tpot_p50_s"] * 1e3 for r in rates], label=arm, **style)
        axes[1].plot(rates, [levels[r]["ttft_p50_s"] * 1e3 for r in rates], label=arm, **style)
        axes[2].plot(rates, [levels[r]["throughput_tok_s"] for r in rates], label=arm, **style)
    for ax, title in zip(axes, ("TPOT p50 (ms)", "TTFT p50 (ms)", "throughput (tok/s)"), strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("request rate (req/s, Poisson)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_from_args(a: argparse.Namespace) -> None:
    rates = sorted(set(a.rates))
    default_arms = ["goodput"] if a.replicas else ["none", f"fixed:{a.num_speculative_tokens}", "goodput"]
    for arm in a.arms or default_arms:
        parse_arm(arm, a.num_speculative_tokens)  # bad arms fail before any server starts
    arms = expand_arms(a.arms or default_arms, a.replicas)
    picked = load_jsonl(a.prompts)
    if not picked:
        raise ConfigError(f"no prompts in {a.prompts}")
    rng = np.random.default_rng(0)
    order = rng.permutation(len(picked))
    prompts = [picked[i % len(picked)].text for i in np.resize(order, a.requests_per_rate)]
    schedules = {r: np.cumsum(rng.exponential(1.0 / r, a.requests_per_rate)) for r in rates}
    results = {}
    with tempfile.TemporaryDirectory() as logdir, tqdm(total=len(arms) * len(rates), desc="serve bench") as bar:
        for arm in arms:
            results[arm] = run_arm(arm, a, prompts, schedules, bar, logdir)
    console = Console(file=sys.stdout)
    md = render(results, rates, console)
    verdict = scaling(results, rates, a.replicas) if a.replicas else targets(results, rates)
    console.print(verdict)
    out = Path(a.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        **provenance(),
        "rates": rates,
        "requests_per_rate": a.requests_per_rate,
        "max_tokens": a.max_tokens,
        "replicas": a.replicas,
        "arms": {arm: {str(r): v for r, v in levels.items()} for arm, levels in results.items()},
        "targets": verdict,
    }
    write_result(out, payload, indent=1)
    out.with_suffix(".md").write_text(md + "\n" + verdict + "\n")
    plot(results, rates, out.with_name(out.stem + ".png"))
    console.print(f"wrote {out}, {out.with_suffix('.md')} and {out.with_name(out.stem + '.png')}")


def targets(results: dict[str, dict[float, dict]], rates: list[float]) -> str:
    """The issue's targets: goodput TPOT p50 <= the better of none and best fixed K at every rate, and
    >= 1.3x lower than none at the lowest rate."""
    if "goodput" not in results or "none" not in results:
        return "targets: need the 'none' and 'goodput' arms"
    fixed = [arm for arm in results if arm.startswith("fixed")]
    lines = []
    for r in rates:
        g = results["goodput"][r]["tpot_p50_s"]
        best = min([results["none"][r]["tpot_p50_s"]] + [results[f][r]["tpot_p50_s"] for f in fixed])
        lines.append(
            f"{r:g} req/s: goodput TPOT p50 {g * 1e3:.1f} ms vs best other {best * 1e3:.1f} ms "
            f"({'met' if g <= best else 'missed'}, ratio {g / best:.3f})"
        )
    low = rates[0]
    ratio = results["none"][low]["tpot_p50_s"] / results["goodput"][low]["tpot_p50_s"]
    lines.append(
        f"lowest rate: none/goodput TPOT p50 = {ratio:.2f}x ({'met' if ratio >= 1.3 else 'missed'}, need 1.3x)"
    )
    return "\n".join(lines)


def scaling(results: dict[str, dict[float, dict]], rates: list[float], replicas: list[int]) -> str:
    """Throughput and TPOT p50 of each replica count against the fewest, per base arm and rate."""
    base_count = min(replicas)
    lines = []
    for arm in dict.fromkeys(name.partition(" x")[0] for name in results):
        base = results[f"{arm} x{base_count}"]
        for n in replicas:
            if n == base_count:
                continue
            levels = results[f"{arm} x{n}"]
            for r in rates:
                lines.append(
                    f"{arm}, {r:g} req/s: {n} vs {base_count} replicas: throughput "
                    f"{levels[r]['throughput_tok_s'] / base[r]['throughput_tok_s']:.2f}x, TPOT p50 "
                    f"{base[r]['tpot_p50_s'] * 1e3:.1f} -> {levels[r]['tpot_p50_s'] * 1e3:.1f} ms"
                )
    lines.append(
        f"(one CPU and one torch thread per replica; the load generator and every replica share this machine's "
        f"{os.cpu_count()} cores, so on a small machine this shows the mechanism, not the scaling of real nodes)"
    )
    return "\n".join(lines)
