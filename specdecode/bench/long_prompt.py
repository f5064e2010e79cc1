"""`specdecode bench long-prompt`: a long prompt arriving while short streams decode, at several token budgets.

    specdecode bench long-prompt --target smollm2-135m-instruct --long-tokens 6000 --budgets 64,128,512

For each budget (EngineConfig.max_num_batched_tokens) the engine runs --streams short requests (kept at that
count: one that ends is replaced) and records when each of their tokens comes out of a step, as a streaming
client would see it (in-process: the engine loop alone, without HTTP between). After --warm-steps steps the long
prompt arrives; the window "with" lasts until its first token. Reported per budget:

- the short streams' p99 time per output token (each step's gap / the tokens it brought) without the long prompt
  (the --warm-steps steps before it arrived, once every stream has its first token) and while it prefills, and
  their ratio (target <= 3);
- the long request's time to first token against its prefill alone: the same request on an idle engine with the
  sweep's largest budget (target <= 1.5);
- the streams started while it prefilled (replacing those that ended) and the longest any of them waited for its
  first token: a prefill that held new prompts back would leave the streams to run out, and the ratios above
  would then read an engine with nobody decoding.

On a CPU the prefill is compute-bound, so the budget trades one ratio against the other; the plot shows the
trade. Writes the JSON to --output (default results/long_prompt.json), the plot beside it (.png).
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from specdecode.config import SamplingParams

SHORT_PROMPTS = [
    "Write a short poem about the sea.",
    "Explain what a hash table is.",
    "List five fruits and their colours.",
    "How do I reverse a list in Python?",
    "Describe a sunrise in three sentences.",
    "What is the capital of France, and why is it famous?",
    "Give me a recipe for pancakes.",
    "Summarise the plot of Hamlet.",
]
FILLER = (
    "The history of computing is a story of layers: each generation of machines and programs builds on the "
    "abstractions of the one before, and each hides the details that came before it. "
)


@dataclass
class Window:
    """Per-token gaps of the short streams: (step gap / tokens it brought), one sample per token-bearing update."""

    tpot_s: list[float] = field(default_factory=list)
    ttft_s: list[float] = field(default_factory=list)  # first-token waits of the streams that started in it

    def p99(self) -> float:
        return float(np.percentile(self.tpot_s, 99)) if self.tpot_s else float("nan")

    def worst_ttft(self) -> float:
        return max(self.ttft_s, default=float("nan"))


CHARS_A_TOKEN = 8  # characters of text read a token asked: prose and code run ~3.5-4.5 a token


def long_prompt_ids(llm, n: int, prompts_file: str | None, split: str = "all") -> list[int]:
    """n token ids of text: the --prompts file's prompts concatenated (those of `split` where its lines carry
    one, as the code set's do; a .gz file is read through gzip), or filler prose, repeated to length. Only as
    many prompts as n tokens need are encoded (CHARS_A_TOKEN characters each)."""
    text = FILLER
    if prompts_file:
        path = Path(prompts_file)
        lines = (gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()).splitlines()
        rows = [json.loads(line) for line in lines if line.strip()]
        rows = [r for r in rows if split == "all" or r.get("split", split) == split]
        texts, chars = [], 0
        for r in rows:
            if chars > CHARS_A_TOKEN * n:
                break
            texts.append(r.get("prompt") or "\n".join(r.get("turns", [])))
            chars += len(texts[-1])
        text = "\n\n".join(texts)
    ids = llm.tokenizer.encode(text)
    return (ids * (n // max(len(ids), 1) + 1))[:n]


class Scene:
    """One engine with the short streams kept running; times each stream's updates."""

    def __init__(self, llm, shorts: list[list[int]], max_tokens: int) -> None:
        self.engine = llm.engine
        self.shorts, self.params = shorts, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        self.last: dict[str, float] = {}  # stream -> when its last tokens came out (when it was added, before any)
        self.ids = 0

    def start_short(self, i: int) -> None:
        rid = f"short{i}-{self.ids}"
        self.ids += 1
        self.engine.add_request(rid, self.shorts[i % len(self.shorts)], self.params)
        self.last[rid] = time.perf_counter()

    def step(self, window: Window | None) -> list:
        updates = self.engine.step()
        now = time.perf_counter()
        for u in updates:
            rid = u.seq.request_id
            if rid.startswith("short") and u.new_token_ids:
                if window is not None and rid in self.last:
                    if u.seq.metrics.num_generated == len(u.new_token_ids):  # its first tokens: a wait since added
                        window.ttft_s.append(now - self.last[rid])
                    else:
                        window.tpot_s.append((now - self.last[rid]) / len(u.new_token_ids))
                self.last[rid] = now
            if rid.startswith("short") and u.finished:
                self.last.pop(rid, None)
                self.start_short(int(rid[5:].split("-")[0]))  # keep the stream count
        return updates

    def requests(self) -> list:
        """The engine's sequences, waiting and running."""
        return list(self.engine.waiting) + list(self.engine.running)

    def settle(self, max_steps: int = 10_000) -> int:
        """Step (untimed) until every short stream running now has its first token (or has ended): a stream still
        prefilling would put its own prompt's chunks into the "without" window. Returns the steps it took."""
        seqs = [s for s in self.requests() if s.request_id.startswith("short")]
        for n in range(max_steps):
            if all(s.metrics.num_generated > 0 or s.finish_reason is not None for s in seqs):
                return n
            self.step(None)
        raise RuntimeError(f"the short streams did not all start decoding in {max_steps} steps")

    def clear(self) -> None:
        for seq in self.requests():
            self.engine.abort(seq.request_id)
        while self.engine.has_work():
            self.engine.step()


def time_to_first_token(scene: Scene, long_ids: list[int], window: Window | None) -> float:
    """Add the long request now; step until its first token; seconds it took."""
    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    t0 = time.perf_counter()
    seq = scene.engine.add_request("long", long_ids, params)
    while seq.metrics.num_generated == 0 and seq.finish_reason is None:
        scene.step(window)
    if seq.finish_reason == "error":
        raise RuntimeError(f"the long request failed: {seq.error}")
    return time.perf_counter() - t0


def run_budget(llm, shorts, long_ids, streams: int, warm_steps: int, max_tokens: int) -> dict:
    scene = Scene(llm, shorts, max_tokens)
    for i in range(streams):
        scene.start_short(i)
    scene.settle()  # the streams' prefills and first tokens: not decode gaps
    without = Window()
    for _ in range(warm_steps):
        scene.step(without)
    with_long = Window()
    ttft = time_to_first_token(scene, long_ids, with_long)
    scene.clear()
    return {
        "budget": llm.engine.config.max_num_batched_tokens,
        "p99_tpot_without_s": without.p99(),
        "p99_tpot_with_s": with_long.p99(),
        "tpot_ratio": with_long.p99() / without.p99(),
        "long_ttft_s": ttft,
        "tokens_without": len(without.tpot_s),
        "tokens_with": len(with_long.tpot_s),
        # streams that ended while it prefilled were replaced: how long the worst replacement waited for its first
        # token, and how many there were (a prefill that holds new prompts back leaves the streams to run out)
        "short_ttft_max_s": with_long.worst_ttft(),
        "short_starts_with": len(with_long.ttft_s),
    }


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a benchmark machine
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    xs, ys = [r["ttft_ratio"] for r in rows], [r["tpot_ratio"] for r in rows]
    ax.plot(xs, ys, "o-")
    for r, x, y in zip(rows, xs, ys, strict=True):
        ax.annotate(f"{r['budget']} tokens/step", (x, y), textcoords="offset points", xytext=(6, 6))
    ax.axvline(1.5, color="grey", ls="--", lw=1)
    ax.axhline(3.0, color="grey", ls="--", lw=1)
    ax.set_xlabel("long prompt's TTFT / its prefill alone")
    ax.set_ylabel("short streams' p99 TPOT: with / without it")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def set_budget(llm, budget: int) -> None:
    """The engine's (and a drafter's own) per-step token budget, changed between arms: one engine for all of them,
    as a second KV cache of a 16k context would not fit beside the first on a small machine."""
    engine = llm.engine
    engine.config = dataclasses.replace(engine.config, max_num_batched_tokens=budget)
    if hasattr(engine.drafter, "prefill_budget"):  # drafters with a cache of their own (drafters/catch_up.py)
        engine.drafter.prefill_budget = budget


def run_from_args(a: argparse.Namespace) -> None:
    from specdecode.bench.lib import provenance, write_result
    from specdecode.llm_args import llm_from_args

    budgets, alone_budget = a.budgets, max(a.budgets)
    max_len = a.max_model_len or a.long_tokens + a.max_tokens + 64
    llm = llm_from_args(a, max_num_batched_tokens=alone_budget, max_num_seqs=a.streams + 1, max_model_len=max_len)
    long_ids = long_prompt_ids(llm, a.long_tokens, a.prompts, a.split)
    chat = [llm.apply_chat_template([{"role": "user", "content": p}]) if a.chat else p for p in SHORT_PROMPTS]
    shorts = [llm.tokenizer.encode(p) for p in chat]
    scene = Scene(llm, shorts, a.max_tokens)
    time_to_first_token(scene, long_ids[:256], None)  # warm-up: the compiled step, allocations
    scene.clear()
    alone = time_to_first_token(scene, long_ids, None)
    scene.clear()
    print(f"long prompt: {len(long_ids)} tokens, prefill alone {alone:.2f} s (budget {alone_budget})", flush=True)
    rows = []
    for budget in budgets:
        set_budget(llm, budget)
        row = run_budget(llm, shorts, long_ids, a.streams, a.warm_steps, a.max_tokens)
        row["ttft_ratio"] = row["long_ttft_s"] / alone
        rows.append(row)
        print(
            f"budget {budget:5d}: p99 TPOT {row['p99_tpot_without_s'] * 1e3:7.1f} -> "
            f"{row['p99_tpot_with_s'] * 1e3:7.1f} ms ({row['tpot_ratio']:.1f}x), "
            f"long TTFT {row['long_ttft_s']:.2f} s ({row['ttft_ratio']:.2f}x alone); "
            f"{row['short_starts_with']} new streams, first token within {row['short_ttft_max_s']:.2f} s",
            flush=True,
        )
    result = {
        **provenance(model=llm.target),
        "target": a.target,
        "method": a.method,
        "streams": a.streams,
        "long_prompt_tokens": len(long_ids),
        "prefill_alone_s": alone,
        "prefill_alone_budget": alone_budget,
        "targets": {"tpot_ratio_max": 3.0, "ttft_ratio_max": 1.5},
        "budgets": rows,
    }
    out = write_result(a.output, result)
    plot(rows, out.with_suffix(".png"), f"{a.target}, {a.method}: {len(long_ids)}-token prompt, {a.streams} streams")
    print(f"wrote {out} and {out.with_suffix('.png')}", file=sys.stderr)
