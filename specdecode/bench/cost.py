"""`specdecode bench cost`: the target's step-cost curve, ms per forward by batch x new tokens per row.

Each arm is a worker process holding one model: this checkout's compiled step (AOTInductor packages), with
`--jit` the same step under torch.compile in the process, its eager step (`--enforce-eager`), and with
`--baseline DIR` another commit's checkout (e.g. a git worktree of the previous commit), eager or with
`--baseline-step compiled` its compiled step. The arms take turns forward by forward, so the noise of this
machine hits them alike, and each timed forward follows an untimed one of the same shape in its own process, as
a decoding step follows the last: timed right after another arm's forward, a one-token step read 25.4 ms
against 18.7 (2-core AMD EPYC, 2026-11-25; the cause was not isolated: threads waking, or caches and TLBs
holding the other process's data), and the ratios between cells moved with it. The worker uses only the model
API every version has (load_llama, new_cache, AttentionMetadata.build(slots, starts, T, device), forward), plus
models.compiled in the compiled arms. With `--llama-cpp-native`, native llama.cpp's own `llama-bench` times each
batch-1 cell on the target's GGUF right after our arms (bench/llama_cpp_cost.py): its curve sits beside ours in
the table, the JSON and the plot, which also draws each batch's compute floor.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table
from tqdm import tqdm

from specdecode.bench import llama_cpp_native
from specdecode.bench.floor import forward_gflop, peak_gflops
from specdecode.bench.lib import provenance, write_result
from specdecode.bench.llama_cpp_cost import llama_bench_ms
from specdecode.llm_args import configs_from_args
from specdecode.models.llama import LlamaConfig
from specdecode.models.loader import resolve_model_dir

NATIVE = "llama.cpp native"  # the llama-bench arm's name
WORKER = r"""
import json, os, sys, time
import torch
from specdecode.models.llama import AttentionMetadata, load_llama
from specdecode.models.loader import resolve_model_dir
torch.set_num_threads(os.cpu_count() or 1)
try:  # a GGUF on the CPU keeps its blocks unless the weights setting (argv[5], resolved) says fp32
    from specdecode.models.gguf_quantized import quantized_source
    gguf = quantized_source(sys.argv[1], "cpu", "float32", sys.argv[5])
except ImportError:  # a --baseline checkout from before quantized weights
    gguf = None
model_dir = resolve_model_dir(sys.argv[1], progress=False, **({"weights": False} if gguf else {}))
if sys.argv[4] in ("compiled", "jit", "fast"):
    from specdecode.models.compiled import load_target
    aot = sys.argv[4] != "jit"
    quantized = {"gguf": gguf, "arithmetic": "fast" if sys.argv[4] == "fast" else "exact"} if gguf else {}
    model = load_target(model_dir, "cpu", torch.float32, False, False, aot, **quantized)
elif gguf:
    from specdecode.models.compiled import load_target
    model = load_target(model_dir, "cpu", torch.float32, True, False, gguf=gguf)
else:
    model = load_llama(model_dir)
cache = model.new_cache(int(sys.argv[2]), int(sys.argv[3]))
print("ready", flush=True)
for line in sys.stdin:
    b, t, ctx = json.loads(line)
    with torch.inference_mode():
        for i in range(2):  # the first, untimed, pays for the switch from the other arms
            tokens = torch.randint(0, model.cfg.vocab_size, (b, t))
            meta = AttentionMetadata.build(list(range(b)), [ctx] * b, t, "cpu")
            t0 = time.perf_counter()
            model(tokens, meta, cache)
    print(json.dumps(1e3 * (time.perf_counter() - t0)), flush=True)
"""


@dataclass
class Worker:
    name: str
    proc: subprocess.Popen

    @classmethod
    def start(cls, name: str, checkout: Path, target: str, slots: int, max_len: int, step: str, weights: str) -> Worker:
        env = {**os.environ, "PYTHONPATH": str(checkout)}
        proc = subprocess.Popen(
            [sys.executable, "-c", WORKER, target, str(slots), str(max_len), step, weights],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=checkout,
        )
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"cost worker for {name} ({checkout}) failed to start")
        return cls(name, proc)

    def time_ms(self, batch: int, tokens: int, context: int) -> float:
        """One forward's ms, after an untimed one of the same shape."""
        self.proc.stdin.write(json.dumps([batch, tokens, context]) + "\n")
        self.proc.stdin.flush()
        return float(self.proc.stdout.readline())

    def stop(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def cells(a: argparse.Namespace) -> list[tuple[int, int, int]]:
    """(context, batch, new tokens) of every cell, in the order the tables list them."""
    return [(c, b, t) for c in a.contexts for b in a.batches for t in a.new_tokens]


def measure(a: argparse.Namespace, arms: list[Worker], native: Path | None = None) -> dict[str, dict[str, float]]:
    """{arm: {"batch x tokens @ context": median ms}} with the arms interleaved forward by forward: this
    machine's load drifts within seconds, and arms timed a cell apart measured the drift, not the step. With
    `native` (the target's GGUF), llama-bench times each batch-1 cell right after our arms (llama_cpp_cost)."""
    out: dict[str, dict[str, float]] = {w.name: {} for w in arms}
    if native is not None:
        out[NATIVE] = {}
    for c, b, t in tqdm(cells(a), desc="step-cost cells"):
        times: dict[str, list[float]] = {w.name: [] for w in arms}
        for _ in range(a.repeats):
            for w in arms:
                times[w.name].append(w.time_ms(b, t, c))
        for name, ms in times.items():
            out[name][f"{b}x{t}@{c}"] = statistics.median(ms)
        if native is not None and b == 1:  # llama-bench runs one sequence
            out[NATIVE][f"{b}x{t}@{c}"] = llama_bench_ms(native, t, c, a.repeats)
    return out


def render(a: argparse.Namespace, ms: dict[str, dict[str, float]], console: Console) -> str:
    names = list(ms)
    md = []
    for c in a.contexts:
        title = f"ms per target forward at context {c}"
        if len(names) > 1:
            title += f" ({names[0]}; {', '.join(names[1:])} in brackets)"
        table = Table(title=title)
        table.add_column("batch")
        head = ["batch"] + [f"{t} tok" for t in a.new_tokens]
        for t in a.new_tokens:
            table.add_column(f"{t} tok", justify="right")
        md += [f"### {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for b in a.batches:
            cells = [str(b)]
            for t in a.new_tokens:
                key = f"{b}x{t}@{c}"
                cell = f"{ms[names[0]][key]:.1f}"
                if len(names) > 1:
                    cell += " (" + ", ".join(_ms(ms[n], key) for n in names[1:]) + ")"
                cells.append(cell)
            table.add_row(*cells)
            md.append("| " + " | ".join(cells) + " |")
        md.append("")
        console.print(table)
    return "\n".join(md)


def _ms(cells: dict[str, float], key: str) -> str:
    """A cell's ms, or '-' where the arm has no such cell (llama.cpp: batch 1 only)."""
    return f"{cells[key]:.1f}" if key in cells else "-"


def floor_ms(a: argparse.Namespace, cfg, peak: float) -> dict[str, float]:
    """{"batch x tokens @ context": ms} the cell's fp32 work would take at the machine's peak GEMM rate."""
    return {f"{b}x{t}@{c}": 1e3 * forward_gflop(cfg, b, t, c) / peak for c, b, t in cells(a)}


def render_floor(a: argparse.Namespace, floor: dict[str, float], peak: float, console: Console) -> str:
    title = f"compute floor, ms: the cell's fp32 work at this machine's best GEMM rate ({peak:.0f} GFLOP/s)"
    head = ["batch @ context"] + [f"{t} tok" for t in a.new_tokens]
    table = Table(title=title)
    for h in head:
        table.add_column(h, justify="right")
    md = [f"### {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in a.contexts:
        for b in a.batches:
            cells = [f"{b} @ {c}"] + [f"{floor[f'{b}x{t}@{c}']:.1f}" for t in a.new_tokens]
            table.add_row(*cells)
            md.append("| " + " | ".join(cells) + " |")
    console.print(table)
    return "\n".join([*md, ""])


def ratios(a: argparse.Namespace, ms: dict[str, float], floor: dict[str, float] | None = None) -> dict[str, float]:
    """The issue's targets, as ratios to the one-token batch-1 step at the first context; none without that cell
    (a run over other batch sizes or token counts). With `floor`, also each cell's compute floor over the same
    measured one-token step: the best ratio an exact fp32 step of that cell could reach beside it."""
    c = a.contexts[0]
    one = ms.get(f"1x1@{c}")
    if one is None:
        return {}
    out = {"1x1_ms": one}
    for key in (f"1x9@{c}", f"1x17@{c}", f"8x9@{c}"):
        name = key.split("@")[0]
        if key in ms:
            out[f"{name}_over_1x1"] = ms[key] / one
        if floor is not None and key in floor:
            out[f"{name}_floor_over_1x1"] = floor[key] / one
    return out


def target_config(spec: str) -> LlamaConfig:
    return LlamaConfig.from_hf(json.loads((resolve_model_dir(spec, progress=False) / "config.json").read_text()))


def plot(
    path: Path, a: argparse.Namespace, ms: dict[str, dict[str, float]], floor: dict[str, float] | None = None
) -> None:
    """ms per forward against new tokens, one line per arm and batch, and with `floor` each batch's compute floor."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(a.contexts), figsize=(6 * len(a.contexts), 4.5), squeeze=False)
    for ax, c in zip(axes[0], a.contexts, strict=True):
        for i, b in enumerate(a.batches):
            for name, style in zip(ms, ("-", "--", ":", "-.", (0, (5, 1))), strict=False):
                if f"{b}x{a.new_tokens[0]}@{c}" not in ms[name]:
                    continue  # llama.cpp: batch 1 only
                ys = [ms[name][f"{b}x{t}@{c}"] for t in a.new_tokens]
                ax.plot(a.new_tokens, ys, style, color=f"C{i}", marker="o", label=f"batch {b} ({name})")
            if floor is not None:
                ys = [floor[f"{b}x{t}@{c}"] for t in a.new_tokens]
                ax.plot(a.new_tokens, ys, color=f"C{i}", lw=0.8, alpha=0.5, label=f"batch {b} (compute floor)")
        ax.set(xlabel="new tokens per row", ylabel="ms per forward", title=f"context {c}", yscale="log")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def run_from_args(a: argparse.Namespace) -> None:
    here = Path(__file__).resolve().parents[2]
    native = llama_cpp_native.require(a.target) if a.llama_cpp_native else None  # before any worker loads
    _, config = configs_from_args(a)  # weights and arithmetic: the flags, else the environment, else the defaults
    shape = (a.target, max(a.batches), max(a.contexts) + max(a.new_tokens) + 1)
    arms = [Worker.start("compiled", here, *shape, "compiled", config.weights)]
    if a.jit:
        arms.append(Worker.start("torch.compile", here, *shape, "jit", config.weights))
    if config.arithmetic == "fast":  # the int8 arithmetic on the compiled step, beside the exact one
        arms.append(Worker.start("compiled fast", here, *shape, "fast", config.weights))
    arms.append(Worker.start("eager", here, *shape, "eager", config.weights))
    if a.baseline:
        name = f"baseline {a.baseline_step}"
        arms.append(Worker.start(name, Path(a.baseline).resolve(), *shape, a.baseline_step, config.weights))
    try:
        ms = measure(a, arms, native)
    finally:
        for w in arms:
            w.stop()
    console = Console()
    md = render(a, ms, console)
    peak = peak_gflops()
    floor = floor_ms(a, target_config(a.target), peak)
    md += "\n" + render_floor(a, floor, peak, console)
    targets = {name: ratios(a, cells, floor) for name, cells in ms.items()}
    result = {**provenance(), "ms": ms, "peak_gflops": peak, "floor_ms": floor, "targets": targets}
    console.print(result["targets"])
    out = write_result(a.output, result)
    out.with_suffix(".md").write_text(md)
    plot(out.with_suffix(".png"), a, ms, floor)
