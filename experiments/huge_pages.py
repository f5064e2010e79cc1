"""What huge pages change for a model's linears: the same weights where numpy and torch put them, and moved.

    python -m experiments.huge_pages [--target qwen2.5-coder-1.5b-instruct] [--draft qwen2.5-coder-0.5b-instruct] \\
        [--rounds 9] [--passes 10] [--out results/huge_pages.json]

Each model is loaded twice under the fast arithmetic as the engine loads it (compiled), once with
`move_to_huge_pages` put out of the way: the placement is the only difference (both take their KV caches from
specdecode/kv.py, on huge pages). Per copy: its bytes in tensors of 1 MiB or more, the share of them in mappings that
hold any huge page (/proc/self/smaps' AnonHugePages), the milliseconds of all its quantized linears called once each
in model order at one row (a decode step's weight stream alone; the median of `--passes` passes) and of its whole
one-token step after 256 cached tokens (bench/draft_tradeoff.py's median). The two copies run in turns, the first
alternating, and each figure is the median over `--rounds` turns, with the median of the turns' paired ratios.
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from pathlib import Path
from unittest import mock

import torch

from specdecode.bench.draft_tradeoff import decode_step_ms
from specdecode.bench.lib import provenance, turn_order, write_result
from specdecode.huge_pages import MIN_BYTES
from specdecode.models import compiled
from specdecode.models.loader import BUILTIN_MODELS
from specdecode.models.quant_int8 import Int8QuantLinear


def huge_mappings() -> list[tuple[int, int]]:
    """(start, end) of this process's mappings that hold at least one huge page."""
    found, current = [], None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        m = re.match(r"^([0-9a-f]+)-([0-9a-f]+) ", line)
        if m:
            current = (int(m.group(1), 16), int(m.group(2), 16))
        elif line.startswith("AnonHugePages:") and int(line.split()[1]) > 0:
            found.append(current)
    return found


def placement(model: torch.nn.Module) -> dict[str, float]:
    """MB in the model's tensors of MIN_BYTES or more, and the share of them in mappings with a huge page."""
    spans = huge_mappings()
    tensors = [t for t in [*model.parameters(), *model.buffers()] if t.numel() * t.element_size() >= MIN_BYTES]
    total = sum(t.numel() * t.element_size() for t in tensors)
    huge = sum(t.numel() * t.element_size() for t in tensors if any(a <= t.data_ptr() < b for a, b in spans))
    return {"mb": total / 1e6, "share_in_huge_mappings": huge / total}


def linears_ms(model: torch.nn.Module, passes: int) -> float:
    """Median milliseconds over `passes` of every Int8QuantLinear of the model called once, in model order, on one
    row."""
    linears = [m for m in model.modules() if isinstance(m, Int8QuantLinear)]
    xs = {m.in_features: torch.randn(1, m.in_features) for m in linears}  # [1, in] per width
    times = []
    with torch.inference_mode():
        for _ in range(passes):
            t0 = time.perf_counter()
            for m in linears:
                m(xs[m.in_features])
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def load(name: str, moved: bool, weights: str) -> torch.nn.Module:
    gguf = BUILTIN_MODELS[name].gguf_path(name)
    args = dict(enforce_eager=False, progress=False, gguf=gguf, arithmetic="fast", weights=weights)
    if moved:
        return compiled.load_target(None, "cpu", torch.float32, **args)
    with mock.patch.object(compiled, "move_to_huge_pages", lambda model: 0):
        return compiled.load_target(None, "cpu", torch.float32, **args)


def run(a: argparse.Namespace) -> dict:
    rows = {}
    for name, weights in ((a.target, "file"), (a.draft, a.draft_weights)):
        copies = {"as loaded before": load(name, False, weights), "huge pages": load(name, True, weights)}
        for model in copies.values():
            linears_ms(model, 2)  # warm: the kernel's first calls
        times = {(label, kind): [] for label in copies for kind in ("linears", "step")}
        for turn in range(a.rounds):
            for label, model in turn_order(list(copies.items()), turn):
                times[label, "linears"].append(linears_ms(model, a.passes))
                times[label, "step"].append(decode_step_ms(model))
        rows[name] = {label: placement(model) for label, model in copies.items()}
        for (label, kind), ts in times.items():
            rows[name][label] |= {f"{kind}_ms": statistics.median(ts), f"{kind}_rounds_ms": ts}
        for kind in ("linears", "step"):
            paired = [h / b for h, b in zip(times["huge pages", kind], times["as loaded before", kind], strict=True)]
            rows[name][f"{kind}_ratio"] = statistics.median(paired)
        for label in copies:
            r = rows[name][label]
            print(f"{name} {label}: {r['share_in_huge_mappings']:.0%} in huge mappings, "
                  f"linears {r['linears_ms']:.2f} ms, step {r['step_ms']:.2f} ms")  # fmt: skip
        ratios = f"linears {rows[name]['linears_ratio']:.3f}, step {rows[name]['step_ratio']:.3f}"
        print(f"{name}: huge pages / before, median of the turns' ratios: {ratios}")
        del copies
    return {**provenance(__spec__.name), "rounds": a.rounds, "passes": a.passes, "models": rows}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    p.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    p.add_argument("--draft-weights", default="q4_0", help="the draft's blocks as the engine requantizes them")
    p.add_argument("--rounds", type=int, default=9, help="turns of the two copies")
    p.add_argument("--passes", type=int, default=10, help="passes a turn, its median kept")
    p.add_argument("--out", default=None, help="also write the result here (JSON)")
    a = p.parse_args(argv)
    result = run(a)
    if a.out:
        write_result(a.out, result)


if __name__ == "__main__":
    main()
