"""`specdecode bench startup`: how long a process takes from start to its first answer, eager and compiled.

Each run is a fresh process that builds an `LLM` and generates one greedy request. The compiled step's first
run on a machine compiles AOTInductor packages (models/aot_package.py); every later run loads them. Arms, in
order: eager; compiled with an empty package cache (a first run: a fresh cache directory, so inductor's kernel
cache is cold too); compiled again on that cache (later runs, `--repeats` times); eager again. The target is
converted once beforehand and handed to every run as a directory, so no run pays for the GGUF conversion.
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
llm = LLM(target=sys.argv[1], method="none", max_num_seqs=1, enforce_eager=sys.argv[2] == "eager")
t1 = time.perf_counter()
out = llm.generate(["Write a haiku about the sea."], SamplingParams(temperature=0.0, max_tokens=int(sys.argv[3])))
t2 = time.perf_counter()
print(json.dumps({"ready_s": t1 - t0, "request_s": t2 - t1, "tokens": len(out[0].token_ids)}))
"""


def run_once(model_dir: Path, step: str, cache: Path, max_tokens: int) -> dict[str, float]:
    """One fresh process: seconds until the LLM is ready, and for its one request."""
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_CACHE_DIR", "SPECDECODE_ENFORCE_EAGER")}
    env["SPECDECODE_CACHE"] = str(cache)
    done = subprocess.run(
        [sys.executable, "-c", RUN, str(model_dir), step, str(max_tokens)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"startup run ({step}) failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(model_dir: Path, repeats: int, max_tokens: int) -> dict[str, list[dict[str, float]]]:
    """{arm: [one dict per run]}, the arms in the order the module docstring gives."""
    out: dict[str, list[dict[str, float]]] = {"eager": [], "compiled, first run": [], "compiled, later runs": []}
    with tempfile.TemporaryDirectory(prefix="specdecode-startup-") as tmp:
        cache = Path(tmp)
        plan = [("eager", "eager"), ("compiled, first run", "compiled")]
        plan += [("compiled, later runs", "compiled")] * repeats + [("eager", "eager")]
        for arm, step in tqdm(plan, desc="startup runs"):
            out[arm].append(run_once(model_dir, step, cache, max_tokens))
    return out


def render(runs: dict[str, list[dict[str, float]]], console: Console) -> tuple[str, dict[str, dict[str, float]]]:
    table = Table(title="seconds from process start (median over runs)")
    head = ["arm", "runs", "LLM ready (s)", "first request (s)", "start to answer (s)"]
    for h in head:
        table.add_column(h)
    md = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    summary = {}
    for arm, rs in runs.items():
        ready = statistics.median(r["ready_s"] for r in rs)
        request = statistics.median(r["request_s"] for r in rs)
        summary[arm] = {"ready_s": ready, "request_s": request, "total_s": ready + request}
        cells = [arm, str(len(rs)), f"{ready:.1f}", f"{request:.1f}", f"{ready + request:.1f}"]
        table.add_row(*cells)
        md.append("| " + " | ".join(cells) + " |")
    console.print(table)
    return "\n".join(md) + "\n", summary


def run_from_args(a: argparse.Namespace) -> None:
    from specdecode.models.loader import resolve_model_dir

    model_dir = resolve_model_dir(a.target)
    runs = measure(model_dir, a.repeats, a.max_tokens)
    console = Console()
    md, summary = render(runs, console)
    result = {**provenance(), "max_tokens": a.max_tokens, "summary": summary, "runs": runs}
    out = write_result(a.output, result)
    out.with_suffix(".md").write_text(md)
