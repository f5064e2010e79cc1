"""How far ahead the int8 kernel should ask for weight bytes, on this CPU: every linear of the 1.5B target and of
its 0.5B draft (the real weights, in forward order: one forward's weight stream, attention left out), timed at
1-9 activation rows under each prefetch distance, the distances taking turns (rotated each repeat).

    python -m experiments.prefetch_distance [--distances 0,1024,2048,4096,8192] [--rows 1,3,5,9] [--repeats 9]
        [--output results/prefetch_distance.json]

The distance is the kernel's run-time setting (models/quant_int8.py `prefetch_distance`), so one process times
them all. Reported per model and rows: the median ms of a pass over the model's linears (the first two repeats
dropped as warm-up) and the rate in GB/s of weight bytes; the distance the kernel picks on this CPU is marked.
Then whole requests: the dev code prompts (never the evaluation ones), chat template, 128 greedy tokens, our K = 0
and the default arm (the 0.5B draft), each request run under the old distance (8 KiB) and the chosen one in turn:
tok/s of each, and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specdecode import LLM, SamplingParams
from specdecode.bench.code_prompts import load_prompts
from specdecode.bench.lib import provenance, write_result
from specdecode.models.quant_int8 import Int8QuantLinear, prefetch_distance

TARGET = "qwen2.5-coder-1.5b-instruct"


def linears(model: torch.nn.Module) -> list[Int8QuantLinear]:
    return [m for m in model.modules() if isinstance(m, Int8QuantLinear)]


def one_pass(lins: list[Int8QuantLinear], xs: dict[int, torch.Tensor]) -> float:
    """Seconds for one call of every linear, each on rows of random activations xs[in_features] [rows, in]."""
    t0 = time.perf_counter()
    for m in lins:
        m(xs[m.in_features])
    return time.perf_counter() - t0


def measure(models: dict[str, list[Int8QuantLinear]], distances: list[int], rows: list[int], repeats: int) -> dict:
    seconds = {(name, r, d): [] for name in models for r in rows for d in distances}
    for rep in range(repeats):
        order = distances[rep % len(distances) :] + distances[: rep % len(distances)]
        for name, lins in models.items():
            for r in rows:
                xs = {k: torch.randn(r, k) for k in {m.in_features for m in lins}}
                for d in order:
                    prefetch_distance(d)
                    seconds[(name, r, d)].append(one_pass(lins, xs))
    out: dict = {}
    for (name, r, d), s in seconds.items():
        gb = sum(m.groups.numel() for m in models[name]) / 1e9
        ms = statistics.median(s[2:]) * 1e3
        out.setdefault(name, {}).setdefault(str(r), {})[str(d)] = {"ms": ms, "gb_per_s": gb / ms * 1e3}
    return out


def end_to_end(arms: dict[str, LLM], distances: list[int], prompts: int) -> dict:
    """tok/s of each arm's requests under each distance, the distances taking turns request by request."""
    params = SamplingParams(temperature=0.0, max_tokens=128, ignore_eos=True)
    texts = [p.text for p in load_prompts("code", "dev")][:prompts]
    rates = {(arm, d): [] for arm in arms for d in distances}
    for i, text in enumerate(texts):
        for name, llm in arms.items():
            for d in distances if i % 2 == 0 else distances[::-1]:
                prefetch_distance(d)
                t0 = time.perf_counter()
                out = llm.chat([{"role": "user", "content": text}], params)[0]
                rates[(name, d)].append(len(out.token_ids) / (time.perf_counter() - t0))
    out: dict = {}
    for name in arms:
        med = {str(d): statistics.median(rates[(name, d)]) for d in distances}
        out[name] = {"tokens_per_s": med, "per_request": {str(d): rates[(name, d)] for d in distances}}
        out[name]["ratio"] = med[str(distances[1])] / med[str(distances[0])]
        cells = "  ".join(f"{d}: {v:.1f} tok/s" for d, v in med.items())
        print(f"{name}: {cells}  ratio {out[name]['ratio']:.3f}")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--distances", default="0,1024,2048,4096,8192")
    p.add_argument("--rows", default="1,3,5,9")
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--prompts", type=int, default=8, help="dev code prompts for the whole-request part (0: none)")
    p.add_argument("--output", default="results/prefetch_distance.json")
    a = p.parse_args()
    distances = [int(v) for v in a.distances.split(",")]
    rows = [int(v) for v in a.rows.split(",")]
    llm = LLM(target=TARGET, arithmetic="fast", max_num_seqs=1)  # the default arm: the 0.5B draft beside it
    chosen = prefetch_distance()
    models = {"target": linears(llm.engine.target), "draft": linears(llm.engine.drafter.model)}
    with torch.inference_mode():
        table = measure(models, distances, rows, a.repeats)
    for name, by_rows in table.items():
        for r, by_d in by_rows.items():
            cells = "  ".join(f"{d}{'*' if int(d) == chosen else ''}: {v['ms']:.1f} ms" for d, v in by_d.items())
            print(f"{name} {r} rows  {cells}")
    whole = {}
    if a.prompts:
        plain = LLM(target=TARGET, arithmetic="fast", max_num_seqs=1, method="none")
        whole = end_to_end({"K=0": plain, "default arm": llm}, [8192, chosen], a.prompts)
    prefetch_distance(chosen)
    result = {
        **provenance("experiments.prefetch_distance"),
        "chosen_bytes": chosen,
        "repeats": a.repeats,
        "ms_by_model_rows_distance": table,
        "whole_requests": whole,
    }
    write_result(a.output, result)


if __name__ == "__main__":
    main()
