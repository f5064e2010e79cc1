"""Replay the suffix drafter over the target's greedy responses to held-out prompts: τ without running the target.

Usage:
    python -m experiments.suffix_replay --eval data/dev_chat_responses.npz --prompts data/dev_chat_prompts.jsonl \\
        --corpus ../shared/data/distill/*.npz --grid spec_factor=1,2 min_prob=0.05,0.1 --output results/x.json

Greedy verification accepts a drafted path exactly when it spells what the target said next. So walking a greedy
response step by step (draft at the current point, accept the agreeing prefix, move past it and the target's
own next token) gives the τ a greedy run of the engine would see, at microseconds a step instead of a forward.
Requests are replayed in file order through one drafter per setting, so each finished response joins the
drafter's cache of finished outputs as it would in a bench run. Tune here, on prompts that are not Spec-Bench
(data/dev_chat_prompts.jsonl); measure on Spec-Bench.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from dataclasses import dataclass

import numpy as np

from experiments.suffix_index import VOCAB, accepted
from specdecode.bench.lib import provenance, write_result
from specdecode.config import MAX_SPECULATIVE_TOKENS, SamplingParams, SpeculativeConfig
from specdecode.drafters.suffix import OutputCache, SuffixDrafter, corpus_index
from specdecode.prompts import load_jsonl
from specdecode.step.sequence import Sequence

SETTINGS = ("max_depth", "spec_factor", "request_spec_factor", "min_prob", "cache_max_tokens")  # what --grid may vary


@dataclass(frozen=True)
class Request:
    category: str
    prompt: list[int]
    response: list[int]  # the target's greedy answer, as it said it


@dataclass
class Walk:
    """One request's replay: decode steps taken, tokens they emitted, drafts they proposed."""

    steps: int = 0
    tokens: int = 0
    drafted: int = 0
    seconds: float = 0.0  # in draft() alone


def load_requests(path: str, prompts: str | None) -> list[Request]:
    """The greedy records of a token file in the distillation format, with each prompt's category from the
    jsonl it was generated from (`prompt_index` is the line), else 'all'."""
    with np.load(path) as d:
        tokens, offsets, prompt_len = d["tokens"], d["offsets"], d["prompt_len"]
        sampled, index = d["sampled"], d["prompt_index"]
    categories = [p.category for p in load_jsonl(prompts)] if prompts else None
    out = []
    for i in np.flatnonzero(sampled == 0).tolist():
        start, cut, end = int(offsets[i]), int(offsets[i] + prompt_len[i]), int(offsets[i + 1])
        category = categories[int(index[i])] if categories else "all"
        out.append(Request(category, tokens[start:cut].tolist(), tokens[cut:end].tolist()))
    return out


def walk(drafter: SuffixDrafter, req: Request, name: str, k_max: int, max_tokens: int) -> Walk:
    """Greedy decoding of `req` with the drafter's chains or trees, the response standing in for the target.

    The prefill emits the first response token; each step drafts from prompt + response so far (its last token
    pending, as in the engine) and emits the accepted drafts plus the target's next token."""
    seq = Sequence(name, req.prompt, SamplingParams(), len(req.prompt) + len(req.response) + k_max + 1)
    seq.token_ids = req.prompt + req.response[:1]
    drafter.add_sequence(seq)
    w = Walk()
    i = 1
    while i < len(req.response):
        k = min(k_max, max_tokens - i - 1)
        t0 = time.perf_counter()
        draft = drafter.draft(seq, max(k, 0))
        w.seconds += time.perf_counter() - t0
        emitted = accepted(draft, req.response[i:]) + 1
        w.steps += 1
        w.tokens += min(emitted, len(req.response) - i)
        w.drafted += len(draft.tokens)
        i += emitted
        seq.token_ids = req.prompt + req.response[:i]
    seq.token_ids = req.prompt + req.response
    drafter.remove_sequence(seq)
    return w


def summarize(walks: list[tuple[str, Walk]]) -> dict[str, dict[str, float]]:
    """Per category and overall: τ (tokens per decode step), drafts per step, draft() time per step."""
    groups: dict[str, list[Walk]] = {}
    for category, w in walks:
        groups.setdefault(category, []).append(w)
        groups.setdefault("overall", []).append(w)
    out = {}
    for category, ws in sorted(groups.items()):
        steps = sum(w.steps for w in ws) or 1
        out[category] = {
            "tau": sum(w.tokens for w in ws) / steps,
            "drafted_per_step": sum(w.drafted for w in ws) / steps,
            "draft_us_per_step": 1e6 * sum(w.seconds for w in ws) / steps,
        }
    return out


def parse_grid(items: list[str]) -> list[dict[str, float]]:
    """['spec_factor=1,2', 'min_prob=0.1'] -> every combination, as keyword overrides of the defaults."""
    axes = {}
    for item in items:
        name, _, values = item.partition("=")
        if name not in SETTINGS or not values:
            raise SystemExit(f"--grid: expected NAME=V1,V2 with NAME one of {', '.join(SETTINGS)}; got {item!r}")
        axes[name] = [float(v) if "." in v else int(v) for v in values.split(",")]
    return [dict(zip(axes, combo, strict=True)) for combo in itertools.product(*axes.values())]


def replay(requests: list[Request], corpus: tuple[str, ...], setting: dict, k: int, tree: bool, max_tokens: int):
    spec = SpeculativeConfig()
    depth = int(setting.get("max_depth", spec.suffix_max_depth))
    index = corpus_index(corpus, VOCAB, depth + MAX_SPECULATIVE_TOKENS) if corpus else None
    drafter = SuffixDrafter(
        index,
        OutputCache(int(setting.get("cache_max_tokens", spec.suffix_cache_max_tokens))),
        tree,
        depth,
        float(setting.get("spec_factor", spec.suffix_spec_factor)),
        float(setting.get("min_prob", spec.suffix_min_prob)),
        request_spec_factor=float(setting.get("request_spec_factor", spec.suffix_request_spec_factor)),
    )
    return summarize([(r.category, walk(drafter, r, f"r{n}", k, max_tokens)) for n, r in enumerate(requests)])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--eval", required=True, help="token file (.npz, distillation format) of greedy responses")
    p.add_argument("--prompts", default=None, help="the jsonl they were generated from (for categories)")
    p.add_argument("--corpus", nargs="*", default=[], help="token files for the drafter's corpus index")
    p.add_argument("--grid", nargs="*", default=[], help="NAME=V1,V2 ... over " + ", ".join(SETTINGS))
    p.add_argument("-k", type=int, default=8, help="speculation budget K")
    p.add_argument("--tree", action="store_true", help="suffix_tree: token trees instead of chains")
    p.add_argument("--max-tokens", type=int, default=128, help="the generation cap the responses were made with")
    p.add_argument("--output", default="results/suffix_replay.json")
    a = p.parse_args(argv)
    requests = load_requests(a.eval, a.prompts)
    rows = []
    for setting in parse_grid(a.grid) or [{}]:
        result = replay(requests, tuple(a.corpus), setting, a.k, a.tree, a.max_tokens)
        rows.append({"setting": setting, "result": result})
        o = result["overall"]
        print(
            f"{setting}: tau {o['tau']:.3f}, {o['drafted_per_step']:.2f} drafts/step, {o['draft_us_per_step']:.0f} us"
        )
    argv_text = " ".join(sys.argv[1:] if argv is None else argv)
    payload = {
        **provenance(),
        "command": "python -m experiments.suffix_replay " + argv_text,
        "requests": len(requests),
        "k": a.k,
        "tree": a.tree,
        "rows": rows,
    }
    write_result(a.output, payload, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
