"""The 0.5B draft with the file's blocks against its linears requantized (models/requantize.py).

    python -m experiments.draft_weights [--split dev] [--k 4] [--stop 0.7] [--steps 40] [--weights file,q4_1]
        [--out results/draft_weights_dev.json]

On one loaded 1.5B (fast arithmetic), the arms take turns prompt by prompt over the code set's `split`
(greedy, 128 tokens, whole request): K = 0, then the draft arm with each of `--weights` (the file's blocks,
requantized to Q4_1, to Q4_0). Then each draft's compiled one-token step at 200 cached tokens, the drafts taking
turns `--steps` times.
Reported: tok/s, speedup over K = 0, acceptance and τ per arm; the median draft step of each.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from tqdm import tqdm

from specdecode.bench.code_prompts import load_prompts
from specdecode.bench.lib import provenance, write_result
from specdecode.config import SamplingParams
from specdecode.llm import LLM
from specdecode.step.runner import forward_ragged

TARGET = "qwen2.5-coder-1.5b-instruct"
LABELS = {"file": "draft, file blocks", "q4_1": "draft, Q4_1", "q4_0": "draft, Q4_0"}  # --weights -> arm


def step_seconds(model, cache, slot: int) -> float:
    """One compiled draft step of one token after the slot's cached ones (the cache length is left as it was)."""
    t0 = time.perf_counter()
    with torch.inference_mode():
        forward_ragged(model, cache, [slot], [[5]], last_only=True)
    return time.perf_counter() - t0


def draft_steps(drafts: dict[str, torch.nn.Module], steps: int) -> dict[str, float]:
    """Median seconds of each draft's one-token step at 200 cached tokens, the drafts taking turns."""
    caches = {}
    for name, model in drafts.items():
        cache = model.new_cache(1, 256)
        slot = cache.allocate()
        with torch.inference_mode():
            forward_ragged(model, cache, [slot], [list(range(1000, 1200))], last_only=True)
        cache.set_length(slot, 200)
        caches[name] = (cache, slot)
    times: dict[str, list[float]] = {name: [] for name in drafts}
    for _ in range(steps + 1):
        for name, model in drafts.items():
            times[name].append(step_seconds(model, *caches[name]))
    return {name: statistics.median(ts[1:]) for name, ts in times.items()}


def new_totals() -> dict:
    return {"seconds": 0.0, "tokens": 0, "drafted": 0, "accepted": 0, "forwards": 0}


def timed_chat(llm: LLM, text: str, params: SamplingParams, totals: dict):
    """One chat request of `text`, its seconds, tokens, drafts and forwards added to `totals`; its output."""
    t0 = time.perf_counter()
    out = llm.chat([{"role": "user", "content": text}], params)[0]
    totals["seconds"] += time.perf_counter() - t0
    totals["tokens"] += len(out.token_ids)
    totals["drafted"] += out.metrics.get("num_drafted", 0)
    totals["accepted"] += out.metrics.get("num_accepted", 0)
    totals["forwards"] += out.metrics["num_target_forwards"]
    return out


def arm_rows(totals: dict[str, dict], base_arm: str = "K = 0") -> dict[str, dict]:
    """Each arm's totals with its tok/s, speedup over `base_arm`, acceptance and tau."""
    base = totals[base_arm]["tokens"] / totals[base_arm]["seconds"]
    rows = {}
    for name, t in totals.items():
        tok_s = t["tokens"] / t["seconds"]
        rows[name] = {
            **t,
            "tok_s": tok_s,
            "speedup": tok_s / base,
            "acceptance": t["accepted"] / max(t["drafted"], 1),
            "tau": (t["accepted"] + t["forwards"]) / max(t["forwards"], 1),
        }
    return rows


def arm_result(command: str, model, a: argparse.Namespace, rows: dict[str, dict]) -> dict:
    """A run's JSON: provenance, the arms' settings (`a`: split, k, stop, max_tokens) and their rows."""
    settings = {"split": a.split, "k": a.k, "stop_below": a.stop, "max_tokens": a.max_tokens}
    return {**provenance(command, model), "target": TARGET, **settings, "arms": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--split", default="dev", choices=["dev", "eval"])
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--stop", type=float, default=0.7)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--weights", default="file,q4_1", help="the draft arms' weights, comma-separated: file, q4_1, q4_0")
    ap.add_argument("--out", default="results/draft_weights_dev.json")
    a = ap.parse_args()
    spec = dict(method="draft", num_speculative_tokens=a.k, controller="fixed", draft_stop_below=a.stop)
    common = dict(arithmetic="fast", max_num_seqs=1)
    plain = LLM(TARGET, method="none", **common)
    weights = a.weights.split(",")
    drafts = {LABELS[w]: LLM(TARGET, share_target=plain, draft_weights=w, **spec, **common) for w in weights}
    arms = {"K = 0": plain, **drafts}
    for llm in arms.values():
        llm.warm_up()
    params = SamplingParams(temperature=0.0, max_tokens=a.max_tokens)
    totals = {name: new_totals() for name in arms}
    for p in tqdm(load_prompts("code", a.split), desc="draft weights", unit="prompt"):
        for name, llm in arms.items():
            timed_chat(llm, p.text, params, totals[name])
    rows = arm_rows(totals)
    for name, row in rows.items():
        speed = f"{row['tok_s']:6.2f} tok/s  {row['speedup']:5.3f}x K = 0"
        print(f"{name:>20}: {speed}  acceptance {row['acceptance']:.3f}")
    steps = draft_steps({name: llm.draft_model for name, llm in drafts.items()}, a.steps)
    for name, s in steps.items():
        print(f"{name:>20}: draft step {s * 1e3:.2f} ms")
    result = {
        **arm_result("experiments.draft_weights", plain.target, a, rows),
        "draft_step_ms": {name: s * 1e3 for name, s in steps.items()},
    }
    print(f"wrote {write_result(a.out, result)}")


if __name__ == "__main__":
    main()
