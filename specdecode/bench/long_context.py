"""`specdecode bench long-context`: decode speed of fixed K (K = 0 included) and `goodput` as the context grows.

    specdecode bench long-context --contexts 256,2048,8192,16384 --batches 1,8 --max-tokens 64 --repeats 2
    specdecode bench long-context --target qwen2.5-coder-1.5b-instruct --draft qwen2.5-coder-0.5b-instruct \\
        --method draft --arithmetic fast

A cell is one context length N and batch size B: B prompts of exactly N tokens (text from --prompts, default the
packaged code set, each row from its own offset into it so the rows do not decode alike, then a question) are
prefilled once; every arm then decodes from that same state, the arms taking turns, their order rotating from
repeat to repeat so that a noisy machine's drift does not always hit the same arm.

Prefilled once, because rollback is bookkeeping: decoding writes K/V only past the prompt, so putting every row
back at its prompt end (`rewind`) is truncating its tokens and setting the cache lengths (the target's here, the
draft's through the drafter's commit hook). The prefill, the same for every arm and minutes long at 16k tokens
on two cores, is then paid once per cell instead of once per arm, and is never timed: the figure is DECODE speed.
The rows never finish (EOS ignored, max_tokens past the run) so they keep their slots; an arm stops once the
batch has made B x --max-tokens tokens, so the batch is B rows throughout. Greedy speculation is lossless, so
every arm must emit the same tokens: each cell records whether they did (`lossless`), a check of the rewind.

With --texts N a cell decodes N batches in turn, each cut further along the text and prefilled on its own, and an
arm's tok/s in a repeat is all of their tokens over all of their seconds: at batch 1 a cell is otherwise one text,
whose own character (how far its drafts run) decides which fixed K wins.

Reported per cell: tok/s per arm (median over repeats); per step the mean K each arm's controller asked for and
the drafts verified per row (after the drafter found what it could and `truncate`: what goodput really chose
with a cheap drafter, which it always asks for everything); acceptance and tau; and goodput / the best fixed arm
(K = 0 counted) against the target (>= 0.97), and with 2 or more repeats the same against the fixed arm chosen on
the other repeats (`verdict`: the best arm picked and scored on the same repeats is biased upward). Contexts that
do not fit the target's context with the decode room are skipped with a note. JSON to --output (default
results/long_context.json), the plot beside it (.png): tok/s and K against context (log), one column per batch size.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from dataclasses import dataclass, field
from itertools import chain

import numpy as np
from tqdm import tqdm

from specdecode.bench.sweep import RecordingController, build_engine
from specdecode.bench.sweep_config import ArmSpec
from specdecode.config import ConfigError, SamplingParams
from specdecode.control import make_controller
from specdecode.engine.engine import Engine
from specdecode.step.sequence import SeqMetrics, Sequence, Status

TARGET_RATIO = 0.97  # goodput's tok/s over the best fixed arm's, at every cell
QUESTION = "\n\nWhat is the text above about? Answer in a few sentences."
ROW_STRIDE = 2039  # tokens between the rows' starting offsets into the text (prime: rows fall out of phase)
PREFILL_BUDGET = 2048  # tokens a prefill step may run, unless --max-num-batched-tokens says otherwise
WARMUP_STEPS = 8  # untimed steps of every arm in a cell before the timed runs (`warm_up`)
REWINDABLE = ("ngram", "draft")  # drafters whose state a rewind restores exactly (see `rewind`)


# ---- prompts ------------------------------------------------------------------------------------------------
def frame(llm, chat: bool) -> tuple[list[int], list[int]]:
    """Token ids around a prompt's text: the chat template's head, and the question plus the template's tail."""
    if not chat:
        return [], llm.encode(QUESTION)
    mark = "\x00TEXT\x00"
    head, tail = llm.apply_chat_template([{"role": "user", "content": mark}]).split(mark)
    return (llm.encode(head) if head else []), llm.encode(QUESTION + tail)


def context_prompts(llm, text: list[int], n: int, rows: int, chat: bool, first: int = 0) -> list[list[int]]:
    """`rows` prompts of exactly n tokens: head + text[offset : offset + body] + question + tail, row i at
    offset (first + i) * ROW_STRIDE. text: token ids at least (first + rows - 1) * ROW_STRIDE + n long
    (`text_ids`)."""
    head, tail = frame(llm, chat)
    body = n - len(head) - len(tail)
    if body < 1:
        raise ConfigError(
            f"a context of {n} tokens leaves no room for text: the template and question take {len(head) + len(tail)}"
        )
    offsets = [(first + i) * ROW_STRIDE for i in range(rows)]
    return [head + text[o : o + body] + tail for o in offsets]


def text_ids(llm, contexts: list[int], rows: int, prompts: str | None, split: str = "all") -> list[int]:
    """The text all prompts are cut from, long enough for the longest context's last row: the prompts file's
    prompts concatenated (`--prompts code`, the default, is the packaged code set; --split picks its dev or eval
    part), repeated to length."""
    from specdecode.bench.code_prompts import CODE_PROMPTS
    from specdecode.bench.long_prompt import long_prompt_ids

    path = str(CODE_PROMPTS) if prompts in (None, "code") else prompts
    return long_prompt_ids(llm, max(contexts) + (rows - 1) * ROW_STRIDE, path, split)


# ---- one cell: prefill once, rewind per arm ---------------------------------------------------------------
@dataclass
class ArmRun:
    """One arm's decode of one cell, from the prompts' end."""

    seconds: float = 0.0
    tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    forwards: int = 0
    k_chosen: list[float] = field(default_factory=list)  # per step: mean K the controller asked for, over rows
    # per step: mean drafts verified a row, after the drafter (an n-gram may find fewer) and the controller's
    # truncate (goodput asks a cheap drafter for all it has, then picks the width from what was found)
    k_verified: list[float] = field(default_factory=list)
    outputs: list[list[int]] = field(default_factory=list)  # per row: the tokens it emitted


def decode_room(batch: int, max_tokens: int, k_max: int) -> int:
    """Tokens one row may emit in one arm. The arm stops once the batch made batch x max_tokens; a row that made x
    took >= x / (k_max + 1) steps, in each of which every other row made one token at least, so
    x (1 + (batch - 1) / (k_max + 1)) <= batch x max_tokens, plus the last step's k_max + 1."""
    return -(-batch * max_tokens * (k_max + 1) // (k_max + batch)) + k_max + 1


def prefill_steps(batch: int, n: int, budget: int) -> int:
    """Steps the prefill, or a draft model's catch-up (at the same budget), can take: rows already done decode
    meanwhile, and their verify tokens (two a row at K = 1) come out of the budget."""
    return -(-batch * n // max(budget - 2 * batch, 16)) + batch


def row_room(n: int, batch: int, max_tokens: int, k_max: int, budget: int) -> int:
    """Cache positions past the prompt a row needs: the most it decodes between two rewinds (an arm; the prefill
    at K = 0 and the catch-up at K = 1, a token or two a step; a warm-up), plus a step's drafts."""
    most = max(decode_room(batch, max_tokens, k_max), 2 * prefill_steps(batch, n, budget), WARMUP_STEPS * (k_max + 1))
    return most + k_max + 2


def set_arm(engine: Engine, arm: ArmSpec, base=None) -> None:
    """The engine decodes as `arm` from its next step: a fresh controller (no history from other arms; `base`, the
    LLM, starts it as its own: goodput from the pair's price), told what the drafter has read, and its K."""
    fresh = make_controller(arm.controller, engine.target) if base is None else base.new_controller(arm.controller)
    fresh.bind_drafter(engine.drafter)  # a warm-up read the prompts: goodput asks the drafter, not its own history
    engine.controller = RecordingController(fresh)
    engine.k_max = arm.k


def rewind(engine: Engine, seqs: list[Sequence]) -> None:
    """Every row back at its prompt's end, as if it had just been prefilled: its outputs and counters dropped, the
    target cache cut to the prompt (all but the pending last token; verification starts from the row's own
    count, the cache's length is kept in step with it), and the drafter's speculative state rolled back by its
    commit hook (the draft model's cache cut to the same length, the n-gram history re-synced at its next
    lookup). The engine's detokenizer keeps its text: nothing here reads it."""
    for s in seqs:
        del s.token_ids[len(s.prompt_ids) :]
        s.metrics = SeqMetrics()
        engine.cache.set_length(s.slot, s.num_cached)
    engine.drafter.commit(seqs)


def check_alive(seqs: list[Sequence]) -> None:
    for s in seqs:
        if s.status is not Status.RUNNING:
            raise RuntimeError(f"row {s.request_id} stopped decoding ({s.finish_reason}: {s.error})")


def prefill(engine: Engine, prompts: list[list[int]], max_tokens: int) -> list[Sequence]:
    """Add the rows and step until every prompt is cached. Rows done early decode at K = 0 meanwhile (rewound
    later); EOS is ignored so that no row finishes and leaves its slot."""
    set_arm(engine, ArmSpec("none", "fixed", 0))
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    seqs = [engine.add_request(f"row{i}", p, params) for i, p in enumerate(prompts)]
    while any(s.status is not Status.RUNNING for s in seqs):
        engine.step()
        if any(s.status is Status.FINISHED for s in seqs):
            check_alive(seqs)
    return seqs


def warm_up(engine: Engine, seqs: list[Sequence], arm: ArmSpec, until_drafted: bool = False, base=None) -> None:
    """Untimed steps of `arm`, then a rewind: first uses (the compiled step's shapes, the controller's code) stay
    out of the timed runs. until_drafted: also until every row has drafted, which a draft model does once its
    catch-up on the prompt (a chunk a step, once asked for drafts) is done; else it would land in the first
    drafting arm's time."""
    set_arm(engine, arm, base)
    steps = 0
    while steps < WARMUP_STEPS or (until_drafted and not all(s.metrics.num_drafted for s in seqs)):
        engine.step()
        check_alive(seqs)
        steps += 1
    rewind(engine, seqs)


def decode(engine: Engine, seqs: list[Sequence], tokens: int) -> ArmRun:
    """Step from the rewound state until the batch made `tokens` tokens; only decode steps run, all timed."""
    recorder = engine.controller
    run = ArmRun()
    t0 = time.perf_counter()
    while sum(s.metrics.num_generated for s in seqs) < tokens:
        engine.step()
        check_alive(seqs)  # a row that failed or ran out of room would leave the loop waiting for ever
        run.k_chosen.append(float(np.mean(recorder.last)))
        run.k_verified.append(float(np.mean(engine.last_step.num_proposed)))
    run.seconds = time.perf_counter() - t0
    for s in seqs:
        run.tokens += s.metrics.num_generated
        run.drafted += s.metrics.num_drafted
        run.accepted += s.metrics.num_accepted
        run.forwards += s.metrics.num_target_forwards
        run.outputs.append(list(s.output_ids))
    return run


@dataclass(frozen=True)
class CellPlan:
    context: int
    batch: int
    max_tokens: int
    repeats: int


def run_cell(base, arms: list[ArmSpec], prompts: list[list[int]], plan: CellPlan, turn: int, bar) -> dict:
    """Every arm, `plan.repeats` times, on one prefilled engine; returns runs[arm name] -> [ArmRun per repeat]."""
    k_max = max(a.k for a in arms)
    budget = base.engine_config.max_num_batched_tokens
    room = row_room(plan.context, plan.batch, plan.max_tokens, k_max, budget)
    engine = build_engine(base, ArmSpec(f"fixed:{k_max}", "fixed", k_max), plan.batch, plan.context + room)
    bar.set_postfix_str(f"N={plan.context} B={plan.batch} prefill")
    seqs = prefill(engine, prompts, room)
    rewind(engine, seqs)
    if k_max and hasattr(engine.drafter, "prefill_budget"):  # drafters with a cache of their own (catch_up.py)
        warm_up(engine, seqs, ArmSpec("fixed:1", "fixed", 1), until_drafted=True)
    for arm in arms:
        warm_up(engine, seqs, arm, base=base)
    runs: dict[str, list[ArmRun]] = {a.name: [] for a in arms}
    for r in range(plan.repeats):
        shift = (turn + r) % len(arms)
        for arm in arms[shift:] + arms[:shift]:
            bar.set_postfix_str(f"N={plan.context} B={plan.batch} {arm.name} repeat {r + 1}/{plan.repeats}")
            set_arm(engine, arm, base)
            runs[arm.name].append(decode(engine, seqs, plan.batch * plan.max_tokens))
            rewind(engine, seqs)
            bar.update(1)
    for s in seqs:
        engine.abort(s.request_id)
    del engine, seqs
    gc.collect()  # the cell's caches go before the next cell allocates its own
    return runs


def run_texts(base, arms: list[ArmSpec], prompt_sets: list[list[list[int]]], plan: CellPlan, turn: int, bar) -> dict:
    """`run_cell` on each set of prompts in turn (a cell's texts: `--texts`), each arm's repeat r then one run over
    all of them (`joined`): its tok/s is every text's tokens over every text's seconds. At batch 1 a cell is one
    row, so one text's own character (how far its drafts run, how early they miss) would decide between the arms."""
    per_text = [run_cell(base, arms, prompts, plan, turn + t, bar) for t, prompts in enumerate(prompt_sets)]
    return {a.name: [joined([runs[a.name][r] for runs in per_text]) for r in range(plan.repeats)] for a in arms}


def joined(runs: list[ArmRun]) -> ArmRun:
    """One arm's runs on several texts as one run: times, counts, per-step K and rows, one after another."""
    out = ArmRun()
    for run in runs:
        out.seconds += run.seconds
        out.tokens += run.tokens
        out.drafted += run.drafted
        out.accepted += run.accepted
        out.forwards += run.forwards
        out.k_chosen += run.k_chosen
        out.k_verified += run.k_verified
        out.outputs += run.outputs
    return out


def lossless(runs: dict[str, list[ArmRun]]) -> bool:
    """Every arm and repeat emitted the same tokens per row (over the tokens all of them made): greedy
    speculation is lossless, and a rewind that left stale state would break it."""
    every = list(chain.from_iterable(runs.values()))
    for row in range(len(every[0].outputs)):
        outs = [r.outputs[row] for r in every]
        common = min(map(len, outs))
        if len({tuple(o[:common]) for o in outs}) != 1:
            return False
    return True


# ---- figures and verdicts ---------------------------------------------------------------------------------
def arm_summary(runs: list[ArmRun]) -> dict:
    tps = [r.tokens / r.seconds for r in runs]
    drafted, accepted, forwards = (sum(getattr(r, k) for r in runs) for k in ("drafted", "accepted", "forwards"))
    asked = list(chain.from_iterable(r.k_chosen for r in runs))
    verified = list(chain.from_iterable(r.k_verified for r in runs))
    return {
        "tokens_per_s": float(np.median(tps)),
        "tokens_per_s_repeats": tps,
        "tokens": sum(r.tokens for r in runs),
        "seconds": sum(r.seconds for r in runs),
        "mean_k_chosen": float(np.mean(asked)) if asked else 0.0,
        "mean_k_verified": float(np.mean(verified)) if verified else 0.0,
        "acceptance_rate": accepted / drafted if drafted else 0.0,
        # Each target forward yields its accepted drafts plus one recovered or bonus token.
        "mean_accepted_tokens": (accepted + forwards) / forwards if forwards else float("nan"),
    }


def verdict(summaries: dict[str, dict], arms: list[ArmSpec], dynamic: str = "goodput") -> dict:
    """goodput's tok/s against the best fixed arm's (K = 0 counted), and whether it meets TARGET_RATIO.

    The best of several noisy arms, picked and scored on the same repeats, is biased upward by about one arm's
    noise (the winner's curse: ~5% with this machine's 2 repeats). So with 2 or more repeats the verdict also
    scores the arm a user could have chosen in advance: for each repeat, the fixed arm best on the OTHER repeats,
    its tok/s on this one (`held_out`); goodput's median against the median of those (`held_out_ratio`). And each
    repeat against itself (`paired_ratio`): the arms of a repeat run back to back, and this machine's speed drifts
    from repeat to repeat by more than the arms differ (SmolLM2 at 2,048 tokens, 2026-11-30: every arm 115-128 tok/s
    across five repeats), so the medians of unpaired repeats carry that drift into the ratio."""
    fixed = [a.name for a in arms if a.is_fixed]
    best = max(fixed, key=lambda name: summaries[name]["tokens_per_s"])
    ratio = summaries[dynamic]["tokens_per_s"] / summaries[best]["tokens_per_s"]
    out = {"best_fixed": best, "ratio": ratio, "met": bool(ratio >= TARGET_RATIO)}
    repeats = {name: summaries[name].get("tokens_per_s_repeats", []) for name in [*fixed, dynamic]}
    if min(map(len, repeats.values())) >= 2:
        chosen = [held_out_best(repeats, fixed, j) for j in range(len(repeats[dynamic]))]
        held_out = float(np.median([repeats[name][j] for j, name in enumerate(chosen)]))
        held_ratio = float(np.median(repeats[dynamic])) / held_out
        paired = paired_ratio(repeats, chosen, dynamic)
        out |= {
            "held_out_chosen": chosen,
            "held_out_ratio": held_ratio,
            "held_out_met": bool(held_ratio >= TARGET_RATIO),
            "paired_ratio": paired,
            "paired_met": bool(paired >= TARGET_RATIO),
        }
    return out


def paired_ratio(repeats: dict[str, list[float]], chosen: list[str], dynamic: str = "goodput") -> float:
    """The median over repeats j of goodput's tok/s over that of chosen[j], the fixed arm chosen on the other repeats,
    both in repeat j."""
    return float(np.median([repeats[dynamic][j] / repeats[name][j] for j, name in enumerate(chosen)]))


def held_out_best(repeats: dict[str, list[float]], fixed: list[str], j: int) -> str:
    """The fixed arm with the best median tok/s over every repeat but j."""
    return max(fixed, key=lambda name: float(np.median([x for i, x in enumerate(repeats[name]) if i != j])))


def cell_line(cell: dict, arms: list[ArmSpec]) -> str:
    """One line of the report: tok/s per arm, goodput's K and its ratio to the best fixed arm, the verdict."""
    figs, v = cell["arms"], cell["verdict"]
    per_arm = "  ".join(f"{a.name} {figs[a.name]['tokens_per_s']:.1f}" for a in arms)
    return (
        f"N={cell['context']:6d} B={cell['batch']:2d}  tok/s: {per_arm}  | goodput K asked "
        f"{figs['goodput']['mean_k_chosen']:.2f}, verified {figs['goodput']['mean_k_verified']:.2f}; "
        f"{v['ratio']:.3f}x best fixed ({v['best_fixed']}): "
        + ("met" if v["met"] else "MISS")
        + (f"; {v['held_out_ratio']:.3f}x chosen on the other repeats" if "held_out_ratio" in v else "")
        + (f", {v['paired_ratio']:.3f}x paired by repeat" if "paired_ratio" in v else "")
        + ("" if cell["lossless"] else "  [the arms' tokens differ: not lossless]")
    )


def plot(cells: list[dict], arms: list[ArmSpec], path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a benchmark machine
    import matplotlib.pyplot as plt

    batches = sorted({c["batch"] for c in cells})
    fig, axes = plt.subplots(2, len(batches), figsize=(6 * len(batches), 8), squeeze=False)
    for col, b in enumerate(batches):
        row = sorted((c for c in cells if c["batch"] == b), key=lambda c: c["context"])
        xs = [c["context"] for c in row]
        tps_ax, k_ax = axes[0][col], axes[1][col]
        for a in arms:
            style = "o-" if a.name == "goodput" else ".--"
            tps_ax.plot(xs, [c["arms"][a.name]["tokens_per_s"] for c in row], style, label=a.name)
            k_ax.plot(xs, [c["arms"][a.name]["mean_k_verified"] for c in row], style, label=a.name)
            if a.name == "goodput":
                asked = [c["arms"][a.name]["mean_k_chosen"] for c in row]
                k_ax.plot(xs, asked, "o:", color=k_ax.lines[-1].get_color(), label="goodput, K asked")
        tps_ax.set_title(f"batch {b}: decode tok/s", fontsize=9)
        k_ax.set_title(f"batch {b}: drafts verified per row and step (goodput: and K asked)", fontsize=9)
        for ax in (tps_ax, k_ax):
            ax.set_xscale("log")
            ax.set_xlabel("context (prompt tokens)")
            ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---- the command ------------------------------------------------------------------------------------------
def check_arms(method: str, arms: list[ArmSpec]) -> None:
    if method not in REWINDABLE:
        raise ConfigError(
            f"bench long-context rewinds each row per arm; it supports --method {' or '.join(REWINDABLE)}"
        )
    if "goodput" not in {a.name for a in arms} or not any(a.is_fixed for a in arms):
        raise ConfigError("bench long-context compares goodput with fixed K: --arms needs goodput and a fixed arm")


def fitting_cells(
    contexts: list[int], batches: list[int], max_tokens: int, k_max: int, budget: int, limit: int
) -> tuple[list[tuple[int, int]], list[str]]:
    """(context, batch) pairs whose rows fit the target's context, and a note for each that does not."""
    cells, notes = [], []
    for n in contexts:
        for b in batches:
            need = n + row_room(n, b, max_tokens, k_max, budget)
            if need > limit:
                notes.append(f"context {n} at batch {b} skipped: it needs {need} positions, the target has {limit}")
            else:
                cells.append((n, b))
    return cells, notes


def run_from_args(a: argparse.Namespace) -> None:
    from specdecode.bench.args import LONG_CONTEXT_ARMS
    from specdecode.bench.lib import provenance, write_result
    from specdecode.bench.sweep_config import parse_arms
    from specdecode.llm_args import llm_from_args

    arms = parse_arms(a.arms, a.num_speculative_tokens, LONG_CONTEXT_ARMS)
    check_arms(a.method, arms)
    if a.texts < 1:
        raise ConfigError(f"--texts must be >= 1, got {a.texts}")
    k_max = max(arm.k for arm in arms)
    budget = a.max_num_batched_tokens or PREFILL_BUDGET
    # The base LLM holds the weights; its own engine is never used (one slot, a short context), each cell builds one.
    base = llm_from_args(
        a, num_speculative_tokens=k_max, max_num_seqs=1, max_model_len=64, max_num_batched_tokens=budget
    )
    limit = a.max_model_len or base.target.cfg.context_limit
    cells, notes = fitting_cells(a.contexts, a.batches, a.max_tokens, k_max, budget, limit)
    for note in notes:
        print(note, flush=True)
    if not cells:
        raise ConfigError(f"no context fits the target's {limit} positions with the decode room")
    rows = max(b for _, b in cells) * a.texts  # a cell's texts are rows too, cut further along
    text = text_ids(base, [n for n, _ in cells], rows, a.prompts, a.split)
    results = []
    with tqdm(total=len(cells) * a.texts * len(arms) * a.repeats, desc="long-context", unit="arm") as bar:
        for turn, (n, b) in enumerate(cells):
            prompt_sets = [context_prompts(base, text, n, b, a.chat, first=t * b) for t in range(a.texts)]
            runs = run_texts(base, arms, prompt_sets, CellPlan(n, b, a.max_tokens, a.repeats), turn, bar)
            summaries = {name: arm_summary(rs) for name, rs in runs.items()}
            cell = {"context": n, "batch": b, "arms": summaries, "verdict": verdict(summaries, arms)}
            cell["lossless"] = lossless(runs)
            results.append(cell)
            tqdm.write(cell_line(cell, arms), file=sys.stdout)
    result = {
        **provenance(model=base.target),
        "target": a.target,
        "method": a.method,
        "draft": a.draft if a.method == "draft" else None,
        "arms": [arm.name for arm in arms],
        "max_tokens": a.max_tokens,
        "repeats": a.repeats,
        "texts": a.texts,
        "prompts": a.prompts or "code",
        "split": a.split,
        "chat": a.chat,
        "target_ratio": TARGET_RATIO,
        "skipped": notes,
        "cells": results,
        "all_met": all(c["verdict"]["met"] for c in results),
        "all_paired_met": all(c["verdict"].get("paired_met", False) for c in results),
    }
    out = write_result(a.output, result)
    title = f"{a.target}, {a.method}: {a.max_tokens} tokens a row after the prompt, {a.texts} text(s)"
    title += f", median of {a.repeats}"
    plot(results, arms, out.with_suffix(".png"), title)
    print(f"wrote {out} and {out.with_suffix('.png')}", file=sys.stderr)
