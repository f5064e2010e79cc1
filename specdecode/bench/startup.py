"""`specdecode bench startup`: how long a process takes from start to its first answer, eager and compiled.

Each run is a fresh process that builds an `LLM` and generates one greedy request. The compiled step's first
run on a machine compiles AOTInductor packages (models/aot_package.py); every later run loads them. Arms, in
order: eager; compiled with an empty package cache (a first run: a fresh cache directory, so inductor's kernel
cache is cold too); compiled again on that cache (later runs, `--repeats` times); eager again. The target is
converted once beforehand and handed to every run as a directory, so no run pays for the GGUF conversion.

`--warm-only` times what a user's second start costs instead: each run loads the model as named (a built-in GGUF
keeps its blocks), with `--draft` and `--arithmetic` as given, in the user's own cache; one untimed run first
makes sure it holds everything (compiled packages, the goodput probe's profile), then `--repeats` timed runs.
Every run also reports its resident memory (VmRSS) once the LLM is ready and after its request, and the bytes
its KV caches allocate (zeroed pages: only those a request wrote are resident).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table
from tqdm import tqdm

from specdecode.bench.lib import provenance, write_result

RUN = r"""
import json, sys, time
t0 = time.perf_counter()
from specdecode import LLM, SamplingParams
from specdecode.bench.startup import kv_mib, rss_mib
llm = LLM(**json.loads(sys.argv[1]))
t1 = time.perf_counter()
ready_rss = rss_mib()
out = llm.generate(["Write a haiku about the sea."], SamplingParams(temperature=0.0, max_tokens=int(sys.argv[2])))
t2 = time.perf_counter()
print(json.dumps({"ready_s": t1 - t0, "request_s": t2 - t1, "tokens": len(out[0].token_ids),
                  "rss_ready_mib": ready_rss, "rss_mib": rss_mib(), "kv_mib": kv_mib(llm)}))
"""


def rss_mib() -> float:
    """This process's resident memory (VmRSS) in MiB; nan where /proc is missing."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return float("nan")
    kib = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), None)
    return float("nan") if kib is None else kib / 1024


def kv_mib(llm) -> float:
    """MiB the LLM's KV caches allocate: the engine's, and its drafter's own (a draft model's)."""
    caches = [llm.engine.cache, getattr(llm.engine.drafter, "cache", None)]
    return sum(c.k.nbytes + c.v.nbytes for c in caches if hasattr(c, "k")) / 2**20


def run_once(settings: dict, cache: Path | None, max_tokens: int) -> dict[str, float]:
    """One fresh process that builds LLM(**settings): seconds until it is ready and for its one request, and its
    memory. cache: the SPECDECODE_CACHE it runs with (None: the user's own)."""
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_CACHE_DIR", "SPECDECODE_ENFORCE_EAGER")}
    if cache is not None:
        env["SPECDECODE_CACHE"] = str(cache)
    done = subprocess.run(
        [sys.executable, "-c", RUN, json.dumps(settings), str(max_tokens)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"startup run ({settings}) failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(model_dir: Path, repeats: int, max_tokens: int) -> dict[str, list[dict[str, float]]]:
    """{arm: [one dict per run]}, the arms in the order the module docstring gives."""
    out: dict[str, list[dict[str, float]]] = {"eager": [], "compiled, first run": [], "compiled, later runs": []}
    with tempfile.TemporaryDirectory(prefix="specdecode-startup-") as tmp:
        cache = Path(tmp)
        plan = [("eager", True), ("compiled, first run", False)]
        plan += [("compiled, later runs", False)] * repeats + [("eager", True)]
        for arm, eager in tqdm(plan, desc="startup runs"):
            settings = {"target": str(model_dir), "method": "none", "max_num_seqs": 1, "enforce_eager": eager}
            out[arm].append(run_once(settings, cache, max_tokens))
    return out


def measure_warm(settings: dict, repeats: int, max_tokens: int) -> dict[str, list[dict[str, float]]]:
    """{"second start": [one dict per timed run]} in the user's cache, after one untimed run."""
    runs = [run_once(settings, None, max_tokens) for _ in tqdm(range(repeats + 1), desc="startup runs")]
    return {"second start": runs[1:]}


def render(runs: dict[str, list[dict[str, float]]], console: Console) -> tuple[str, dict[str, dict[str, float]]]:
    table = Table(title="seconds from process start, resident memory (median over runs)")
    head = ["arm", "runs", "LLM ready (s)", "first request (s)", "start to answer (s)", "RSS ready (MiB)"]
    head += ["RSS after (MiB)", "KV allocated (MiB)"]
    for h in head:
        table.add_column(h)
    md = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    summary = {}
    for arm, rs in runs.items():
        ready = statistics.median(r["ready_s"] for r in rs)
        request = statistics.median(r["request_s"] for r in rs)
        memory = {key: statistics.median(r[key] for r in rs) for key in ("rss_ready_mib", "rss_mib", "kv_mib")}
        summary[arm] = {"ready_s": ready, "request_s": request, "total_s": ready + request, **memory}
        cells = [arm, str(len(rs)), f"{ready:.1f}", f"{request:.1f}", f"{ready + request:.1f}"]
        cells += [f"{memory[key]:.0f}" for key in ("rss_ready_mib", "rss_mib", "kv_mib")]
        table.add_row(*cells)
        md.append("| " + " | ".join(cells) + " |")
    console.print(table)
    return "\n".join(md) + "\n", summary


def run_from_args(a: argparse.Namespace) -> None:
    from specdecode.models.loader import resolve_model_dir

    if a.warm_only:
        settings = {"target": a.target, "max_num_seqs": 1, "arithmetic": a.arithmetic}
        settings |= {"method": "draft", "draft": a.draft} if a.draft else {"method": "none"}
        runs = measure_warm(settings, a.repeats, a.max_tokens)
    else:
        runs = measure(resolve_model_dir(a.target), a.repeats, a.max_tokens)
    console = Console()
    md, summary = render(runs, console)
    result = {**provenance(), "max_tokens": a.max_tokens, "summary": summary, "runs": runs}
    if a.warm_only:
        result["settings"] = settings
    out = write_result(a.output, result)
    out.with_suffix(".md").write_text(md)
