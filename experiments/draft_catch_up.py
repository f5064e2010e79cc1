"""A draft model's catch-up read in one forward against pieces the few-queries attention kernel takes.

    python -m experiments.draft_catch_up [--contexts 0,256,2048,8192] [--backlogs 8,32,33,64,256,1024]
        [--repeats 3] [--out results/draft_catch_up.json]

The Qwen2.5-Coder 0.5B as the pair's drafter loads it (fast arithmetic, bf16 cache, no window): one row's cache
filled to `context` tokens, then a backlog of B tokens read after it (the draft catching up: a new prompt at
context 0, what a row accepted since it last drafted, a probe's idle steps), either in one forward (`_feed`, as
the drafter read before 2026-11-29: past KERNEL_MAX_QUERIES tokens a row its attention went to SDPA) or in forwards
of at most `kernel_piece` tokens (`_feed_pieces`, as it reads now). The two arms take turns in each repeat, the
cache cut back to `context` before each; medians, ms a token read. Random token ids: what a forward costs does not
depend on them.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from tqdm import tqdm

from specdecode.bench.lib import provenance, write_result
from specdecode.config import SamplingParams
from specdecode.llm import LLM
from specdecode.models.attention import kernel_piece
from specdecode.step.sequence import Sequence


def read_ms(drafter, slot: int, ids: list[int], context: int, backlog: int, pieces: bool) -> float:
    """ms a token of reading ids[context : context + backlog] after `context` cached tokens."""
    drafter.cache.set_length(slot, context)
    feed = drafter._feed_pieces if pieces else drafter._feed
    t0 = time.perf_counter()
    feed([slot], [0], [ids[context : context + backlog]])
    return (time.perf_counter() - t0) * 1e3 / backlog


def fill(drafter, slot: int, ids: list[int], length: int, chunk: int = 2048) -> None:
    """The row's cache holds ids[:length] (read a chunk at a time)."""
    for start in range(0, length, chunk):
        drafter.cache.set_length(slot, start)
        drafter._feed_pieces([slot], [0], [ids[start : min(start + chunk, length)]])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", default="0,256,2048,8192")
    parser.add_argument("--backlogs", default="8,32,33,64,256,1024")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="results/draft_catch_up.json")
    a = parser.parse_args()
    contexts, backlogs = [int(x) for x in a.contexts.split(",")], [int(x) for x in a.backlogs.split(",")]
    longest = max(contexts) + max(backlogs)
    llm = LLM(
        target="qwen2.5-coder-1.5b-instruct",
        method="draft",
        arithmetic="fast",
        max_model_len=longest + 16,
        max_num_seqs=1,
        draft_window=0,
    )
    drafter = llm.engine.drafter
    ids = torch.randint(100, 30_000, (longest,), generator=torch.Generator().manual_seed(0)).tolist()
    drafter.add_sequence(Sequence("r", ids, SamplingParams(max_tokens=1), max_len=longest + 16))
    slot = drafter.slots["r"]
    fill(drafter, slot, ids, max(contexts))
    rows = []
    for context in tqdm(contexts, desc="contexts", unit="context"):
        for backlog in backlogs:
            one, pieces = [], []
            for _ in range(a.repeats):
                one.append(read_ms(drafter, slot, ids, context, backlog, pieces=False))
                pieces.append(read_ms(drafter, slot, ids, context, backlog, pieces=True))
            row = {"context": context, "backlog": backlog}
            row |= {"one_forward_ms": statistics.median(one), "pieces_ms": statistics.median(pieces)}
            row["ratio"] = row["pieces_ms"] / row["one_forward_ms"]
            rows.append(row)
            print(
                f"context {context:5d} backlog {backlog:5d}: one forward {row['one_forward_ms']:.2f} ms a token, "
                f"pieces {row['pieces_ms']:.2f} ({row['ratio']:.2f}x)",
                flush=True,
            )
    piece = kernel_piece(drafter.model.device, drafter.model.dtype)
    result = {**provenance("experiments.draft_catch_up", drafter.model), "piece": piece, "repeats": a.repeats}
    out = write_result(a.out, {**result, "rows": rows})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
