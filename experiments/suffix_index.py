"""Cost of the suffix drafter's corpus index: build time and memory, lookup latency, and what it would accept.

Usage:
    python -m experiments.suffix_index ../shared/data/distill/*.npz --output results/suffix_index.json

The full index is built and timed once. Lookups are then timed on an index built without `--held-out`
responses, querying at random points of those held-out responses (a query that finds its own response would
flatter every number). Offline acceptance: on the held-out greedy responses, the drafts (chain and tree at
K, and the tree from the request's own history alone) are compared with what the target actually said
next; accepted = the longest drafted path that agrees, as greedy verification would accept.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from datetime import date

import numpy as np

from specdecode.bench.lib import write_result
from specdecode.config import MAX_SPECULATIVE_TOKENS, SamplingParams, SpeculativeConfig
from specdecode.drafters.suffix import Draft, OutputCache, SuffixDrafter
from specdecode.drafters.suffix_index import SuffixArray, join_documents, load_corpus
from specdecode.hardware import cpu_model
from specdecode.step.sequence import Sequence

VOCAB = 49_152  # SmolLM2's; the corpus files are its responses
WARMUP = 16  # first queries left out of the latencies (first-call costs in numpy and the caches)


def accepted(draft: Draft, truth: list[int]) -> int:
    """Drafts a greedy verifier would accept: the deepest node whose root path spells truth's prefix."""
    depth = {0: 0}
    best = 0
    for j, (tok, parent) in enumerate(zip(draft.tokens, draft.parents, strict=True)):
        d = depth.get(parent)
        if d is not None and d < len(truth) and truth[d] == tok:
            depth[j + 1] = d + 1
            best = max(best, d + 1)
    return best


def percentiles(seconds: list[float]) -> dict[str, float]:
    us = np.array(seconds) * 1e6
    return {
        "p50_us": float(np.median(us)),
        "p90_us": float(np.percentile(us, 90)),
        "p99_us": float(np.percentile(us, 99)),
    }


def split_held_out(paths: list[str], num: int, seed: int) -> tuple[list[np.ndarray], list[tuple[list[int], list[int]]]]:
    """([responses] of every file but `num` greedy records of the last, [(prompt, response)] of those records)."""
    with np.load(paths[-1]) as d:
        tokens, offsets, prompt_len, sampled = d["tokens"], d["offsets"], d["prompt_len"], d["sampled"]
    greedy = np.flatnonzero(sampled == 0)
    out = set(np.random.default_rng(seed).choice(greedy, size=min(num, len(greedy)), replace=False).tolist())
    starts = offsets[:-1] + prompt_len  # [records] where each response begins
    records = [(offsets[i], starts[i], offsets[i + 1]) for i in range(len(prompt_len))]
    held = [(tokens[a:b].tolist(), tokens[b:c].tolist()) for i, (a, b, c) in enumerate(records) if i in out]
    rest = [tokens[b:c].astype(np.int32) for i, (_, b, c) in enumerate(records) if i not in out and c > b]
    return load_corpus(paths[:-1], VOCAB) + rest, held


def measure_build(paths: list[str], depth: int) -> dict[str, float]:
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    docs = load_corpus(paths, VOCAB)
    t1 = time.perf_counter()
    index = SuffixArray(join_documents(docs), depth)
    t2 = time.perf_counter()
    return {
        "responses": len(docs),
        "tokens": int(sum(len(d) for d in docs)),
        "sorted_depth": index.depth,
        "load_s": t1 - t0,
        "build_s": t2 - t1,
        "index_mb": index.nbytes / 1e6,
        "peak_rss_growth_mb": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1e3,
    }


def measure_lookups(index: SuffixArray, held: list[tuple[list[int], list[int]]], k: int, seed: int) -> dict:
    """Per query: the corpus match alone, and a whole draft() as the engine calls it (the request's own history
    searched too; no finished outputs). The `own_history_tree` arm leaves the corpus out: what it adds."""
    rng = np.random.default_rng(seed)
    arms = {
        "tree": SuffixDrafter(index, OutputCache(0), True),
        "chain": SuffixDrafter(index, OutputCache(0), False),
        "own_history_tree": SuffixDrafter(None, OutputCache(0), True),
    }
    times: dict[str, list[float]] = {"match": []} | {name: [] for name in arms}
    lengths, hits = [], {name: [] for name in arms}
    for prompt, response in held:
        for cut in rng.integers(1, len(response), size=min(8, len(response) - 1)).tolist():
            history = prompt + response[:cut]
            t0 = time.perf_counter()
            m, _ = index.match(np.asarray(history[-arms["tree"].max_depth :], dtype=np.int32))
            times["match"].append(time.perf_counter() - t0)
            lengths.append(m)
            for name, drafter in arms.items():
                seq = Sequence("q", history, SamplingParams(), len(history) + k + 1)
                drafter.add_sequence(seq)
                t0 = time.perf_counter()
                draft = drafter.draft(seq, k)
                times[name].append(time.perf_counter() - t0)
                drafter.remove_sequence(seq)
                hits[name].append((accepted(draft, response[cut:]), len(draft.tokens)))
    report: dict = {"queries": len(lengths), "corpus_match_len_mean": float(np.mean(lengths))}
    report["latency"] = {
        ("corpus_match" if n == "match" else f"draft_{n}"): percentiles(t[WARMUP:]) for n, t in times.items()
    }
    for name, rows in hits.items():
        acc, drafted = np.array(rows).T
        report[name] = {
            "drafted_per_step": float(drafted.mean()),
            "accepted_per_step": float(acc.mean()),
            "tau_estimate": float(1 + acc.mean()),  # every step also emits the target's own token
        }
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("corpus", nargs="+", help="token files (.npz) in the distillation format")
    p.add_argument("--output", default="results/suffix_index.json")
    p.add_argument("--held-out", type=int, default=200, help="greedy responses of the last file kept out")
    p.add_argument("-k", type=int, default=8, help="speculation budget K")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    depth = SpeculativeConfig().suffix_max_depth + MAX_SPECULATIVE_TOKENS  # as the drafter builds it
    build = measure_build(a.corpus, depth)
    rest, held = split_held_out(a.corpus, a.held_out, a.seed)
    index = SuffixArray(join_documents(rest), depth)
    result = {
        "command": "python -m experiments.suffix_index " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": f"{cpu_model()} ({os.cpu_count()} cores, shared), one Python thread",
        "date": date.today().isoformat(),
        "build": build,
        "lookup": measure_lookups(index, held, a.k, a.seed) | {"held_out_responses": len(held), "k": a.k},
    }
    write_result(a.output, result)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
