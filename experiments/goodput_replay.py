"""Replay speculation controllers on the Qwen2.5-Coder pair without this machine's timing noise.

    python -m experiments.goodput_replay [--contexts 256,2048,8192] [--texts 6] [--max-tokens 64]
        [--split dev] [--out results/goodput_replay.json] [--texts-file texts.npz] [--passes 1]
        [--k-max 5] [--stop-below 0.7] [--retime]

Greedy verification accepts a draft model's drafts exactly while they spell what the target says next, and a draft
model drafting on the true prefix is the draft model teacher-forced there. So one greedy response of the target and
one teacher-forced forward of the 0.5B over prompt + response give, for every position t, the run of drafts the
0.5B would get accepted from t (and its confidence at each, for `--draft-stop-below`), whatever K a controller
asks. Step times come from a table timed once in this process (target forwards of 1..K_MAX + 1 tokens, draft
forwards of 1..3 and 16 tokens, after each context's cached tokens; medians of interleaved repeats), so every
arm is charged the same prices and the comparison has no noise left but the texts'.

Each arm decodes every text of a context in turn, as a server would see them one after another: `goodput`
(seeded by the pair's load probe, as `LLM.new_controller` seeds it) carries its pool of ended requests from one
text to the next; a variant re-seeds only what its name says (`goodput-busy-probe`: the load probe's draft prices
at BUSY times what it measured, as on a machine busy at load); `goodput-cold` takes a fresh controller for every
text, as bench long-context starts each arm's repeat (nothing learned from the texts before). The fixed arms draft
K every step (K = 0: none), stopping after a draft below STOP_BELOW confidence as the arm does; `-nostop` arms
never stop (they are not counted as the best fixed arm). With --passes N every arm decodes the texts N times over,
and each pass is also reported on its own: a controller seeded wrong shows in the first pass, whether it recovered
in the later ones.
The draft reads each prompt before the first step (bench long-context warms it the same way), and the first step
drafts the response's first token, as the engine's first decode step does (it feeds the prompt's last token, left
pending by the prefill; until 2026-11-29 the replay started a token later, where the 0.5B is seldom wrong). Every
draft made is charged, those `truncate` then cuts as well (the engine has paid for them; until 2026-11-29 only the
drafts kept were, which made cutting look free); --retime times the prices again for a --texts-file's texts. What
this leaves out: the engine's own overhead between forwards (the same for every arm), and the draft's confidences
after a rejected draft (taken on the true prefix: a draft made after a miss is wasted whatever it says).

The text is the code set's --split part (dev by default: this chooses how the controller works, so never the eval
prompts), or a --prompts file's (never Spec-Bench's: a prose text for development can be cut from the distillation
prompts, ../shared/data/distill/prompts.jsonl.gz, decontaminated against Spec-Bench), cut at offsets ROW_STRIDE
apart as bench long-context cuts its rows.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from tqdm import tqdm

from experiments.goodput_draft_context import pair_llm
from specdecode.bench import long_context as lc
from specdecode.bench.lib import provenance, write_result
from specdecode.config import SamplingParams
from specdecode.control.cost import SEED_CHECKS
from specdecode.control.goodput import GoodputController
from specdecode.control.pair_probe import forward_one_row
from specdecode.llm import LLM
from specdecode.step.proposal import Proposal
from specdecode.step.sequence import Sequence
from specdecode.step.stats import StepStats

DRAFT_WIDTHS = (1, 2, 3, 16)  # draft forward widths timed; a catch-up of other widths is interpolated
K_MAX = 5  # the widest draft asked (--k-max)
STOP_BELOW = 0.7  # the pair's default arm under the fast arithmetic (arms.py; --stop-below)
CHUNK = 512  # teacher-forced forwards, in pieces
# A load probe timed while another process loaded beside it (2026-11-28): the 0.5B's step at 30 ms, not 12.
BUSY = 2.5


@dataclass
class Text:
    prompt: list[int]
    response: list[int]  # the target's greedy tokens after the prompt
    agree: np.ndarray  # [R] bool: the draft's top token on the true prefix is response[i]
    confidence: np.ndarray  # [R] the draft's top probability there


@dataclass
class Prices:
    """Seconds of one forward after `context` cached tokens: target by width, draft by width."""

    target: dict[int, float]
    draft: dict[int, float]

    def draft_s(self, width: int) -> float:
        if width <= 0:
            return 0.0
        known = sorted(self.draft)
        if width in self.draft:
            return self.draft[width]
        lo = max(w for w in known if w < width)
        hi = min((w for w in known if w > width), default=known[-1])
        if hi == lo:
            return self.draft[lo] * width / lo
        return self.draft[lo] + (self.draft[hi] - self.draft[lo]) * (width - lo) / (hi - lo)


@torch.inference_mode()
def teacher_forced(draft, prompt: list[int], response: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """[R] agreement and [R] top probability of the draft at each response position, on the true prefix."""
    text = prompt + response
    cache = draft.new_cache(1, len(text) + 1)
    agree, confidence = [], []
    for start in range(0, len(text) - 1, CHUNK):
        piece = text[start : min(start + CHUNK, len(text) - 1)]
        logits = forward_one_row(
            draft, cache, piece, start
        ).float()  # [T, vocab]: position i predicts text[start + i + 1]
        first = max(len(prompt) - 1 - start, 0)  # the first position that predicts a response token
        if first >= len(piece):
            continue
        probs = logits[first:].softmax(-1)  # [T', vocab]
        top, arg = probs.max(-1)
        truth = torch.tensor(text[start + first + 1 : start + len(piece) + 1])
        agree.append((arg == truth).numpy())
        confidence.append(top.numpy())
    return np.concatenate(agree), np.concatenate(confidence)


@torch.inference_mode()
def time_prices(base: LLM, context: int, repeats: int = 7) -> Prices:
    """Forward times after `context` cached tokens (the cache's values do not change what a forward costs)."""
    target, draft = base.target, base.draft_model
    tcache = target.new_cache(1, context + K_MAX + 2)
    dcache = draft.new_cache(1, context + max(DRAFT_WIDTHS) + 1)
    jobs = [("target", w) for w in range(1, K_MAX + 2)] + [("draft", w) for w in DRAFT_WIDTHS]
    times: dict[tuple[str, int], list[float]] = {j: [] for j in jobs}
    for r in range(repeats + 1):
        for role, w in jobs:
            model, cache = (target, tcache) if role == "target" else (draft, dcache)
            t0 = time.perf_counter()
            forward_one_row(model, cache, [100] * w, context)
            if r:  # the first round warms up
                times[(role, w)].append(time.perf_counter() - t0)
    med = {j: statistics.median(v) for j, v in times.items()}
    return Prices({w: med[("target", w)] for w in range(1, K_MAX + 2)}, {w: med[("draft", w)] for w in DRAFT_WIDTHS})


def accepted_run(text: Text, t: int, n: int) -> int:
    """Drafts accepted of n made at response position t: greedy verification keeps them while the draft agrees."""
    run = 0
    while run < n and text.agree[t + run]:
        run += 1
    return run


class Replay:
    """One arm over a list of texts; `controller` None: fixed K."""

    def __init__(
        self,
        controller: GoodputController | None,
        k: int,
        prices: Prices,
        stop_below: float,
        renew: Callable[[], GoodputController] | None = None,
    ) -> None:
        self.controller, self.k, self.prices, self.stop_below = None, k, prices, stop_below
        self.renew = renew  # a fresh controller for every text (bench long-context's arms start so), else one for all
        self.seconds = 0.0
        self.tokens = 0
        self.k_chosen: list[int] = []
        self.backlog = 0  # tokens the draft has yet to read of the current text
        if controller is not None:
            self.attach(controller)

    def attach(self, controller: GoodputController) -> None:
        self.controller = controller
        # as the engine binds the draft model's drafter: what it has yet to read, and where it stops
        controller.bind_drafter(SimpleNamespace(unread=lambda seq: self.backlog, stop_below=self.stop_below))

    def run(self, text: Text, name: str, max_tokens: int) -> None:
        if self.renew is not None:
            self.attach(self.renew())
        params = SamplingParams(max_tokens=max_tokens)
        # The prompt's last token pending, as the engine leaves it (engine._prefill_chunks): the first step drafts the
        # response's first token. The draft read the rest of the prompt (warmed up); the pending token is its backlog.
        seq = Sequence(name, text.prompt, params, max_len=len(text.prompt) + len(text.response) + K_MAX + 2)
        self.backlog = 1
        end = min(max_tokens, len(text.response))  # a response that ended early (EOS) ends the request there
        while seq.metrics.num_generated < end:
            self.step(seq, text, end)
        if self.controller is not None:
            self.controller.forget(seq)

    def step(self, seq: Sequence, text: Text, end: int) -> None:
        t = seq.metrics.num_generated  # response tokens in token_ids; drafts would be response[t], ...
        k = self.k if self.controller is None else self.controller.choose([seq], K_MAX)[0]
        k = max(0, min(k, end - t - 1))  # as the engine clamps K: the step's tokens stay within the request's
        self.k_chosen.append(k)
        n = made = self.drafted(text, t, k)
        if self.controller is not None and n:
            confidence = torch.tensor(text.confidence[t : t + n], dtype=torch.float32)[None]  # [1, n]
            proposal = Proposal(torch.full((1, n), 100), torch.tensor([n]), None, confidence)
            n = int(self.controller.truncate([seq], proposal).num_tokens[0])
        accepted = accepted_run(text, t, n)
        # every draft made is paid, those truncate then cut too
        draft_s = self.prices.draft_s(self.backlog) + (made - 1) * self.prices.draft_s(1) if made else 0.0
        verify_s = self.prices.target[n + 1]
        self.backlog = self.backlog_after(n, accepted)
        seq.token_ids.extend(text.response[t : t + accepted + 1])
        seq.metrics.num_generated += accepted + 1
        self.seconds += draft_s + verify_s
        self.tokens += accepted + 1
        if self.controller is not None:
            context = float(seq.num_cached - accepted - 1)
            stats = StepStats([seq], [n], [accepted], draft_s + verify_s, n + 1, context, draft_s, verify_s)
            self.controller.observe(stats)

    def drafted(self, text: Text, t: int, k: int) -> int:
        """Drafts the 0.5B makes when asked for k at response position t: it stops after a doubtful one."""
        for j in range(k):
            if self.stop_below > 0.0 and text.confidence[t + j] < self.stop_below:
                return j + 1
        return k

    def backlog_after(self, n: int, accepted: int) -> int:
        """What the draft has to read next step: the bonus token, and the last draft when all were accepted (it
        cached pending and its drafts but the last); at K = 0 the backlog grows by the step's token."""
        if n == 0:
            return self.backlog + 1
        return 2 if accepted == n else 1


def texts_for(base: LLM, text_ids: list[int], context: int, count: int, max_tokens: int, bar) -> list[Text]:
    prompts = lc.context_prompts(base, text_ids, context, count, True)
    out = []
    for prompt in prompts:
        response = base.generate([prompt], SamplingParams(max_tokens=max_tokens))[0].outputs[0].token_ids
        agree, confidence = teacher_forced(base.draft_model, prompt, list(response))
        out.append(Text(prompt, list(response), agree, confidence))
        bar.update(1)
    return out


def save_cell(path: str, context: int, texts: list[Text], prices: Prices) -> None:
    """A context's texts and prices, to replay other controllers on later (`--texts-file`) without the responses'
    generation (a 8,192-token text took ~3 minutes of prefill here)."""
    arrays = {f"{context}_{i}_{field}": np.asarray(getattr(t, field)) for i, t in enumerate(texts) for field in vars(t)}
    arrays[f"{context}_target"] = np.array([prices.target[w] for w in sorted(prices.target)])
    arrays[f"{context}_draft"] = np.array([[w, prices.draft[w]] for w in sorted(prices.draft)])
    old = dict(np.load(path)) if Path(path).exists() else {}
    np.savez(path, **{**old, **arrays})


def load_cell(path: str, context: int) -> tuple[list[Text], Prices] | None:
    if not Path(path).exists():
        return None
    data = np.load(path)
    if f"{context}_target" not in data:
        return None
    count = len({k.split("_")[1] for k in data if k.startswith(f"{context}_") and k.split("_")[1].isdigit()})
    texts = [
        Text(
            data[f"{context}_{i}_prompt"].tolist(),
            data[f"{context}_{i}_response"].tolist(),
            data[f"{context}_{i}_agree"],
            data[f"{context}_{i}_confidence"],
        )
        for i in range(count)
    ]
    target = {w + 1: float(s) for w, s in enumerate(data[f"{context}_target"])}
    draft = {int(w): float(s) for w, s in data[f"{context}_draft"]}
    return texts, Prices(target, draft)


def arms(base: LLM, prices: Prices) -> dict[str, Replay]:
    """The arms replayed: fixed K, goodput as it ships, and goodput with other per-request prior weights."""
    out = {f"fixed:{k}": Replay(None, k, prices, STOP_BELOW) for k in range(K_MAX + 1)}
    out.update({f"fixed:{k}-nostop": Replay(None, k, prices, 0.0) for k in range(1, 5)})
    out["goodput"] = Replay(base.new_controller("goodput"), 0, prices, STOP_BELOW)
    out["goodput-cold"] = Replay(None, 0, prices, STOP_BELOW, renew=lambda: base.new_controller("goodput"))
    unseeded = lambda: never_seeded(base.new_controller("goodput"))  # noqa: E731
    out["goodput-cold-unseeded"] = Replay(None, 0, prices, STOP_BELOW, renew=unseeded)
    shallow = lambda: without_deep_optimism(base.new_controller("goodput"))  # noqa: E731
    out["goodput-cold-no-deep-optimism"] = Replay(None, 0, prices, STOP_BELOW, renew=shallow)
    out["goodput-cold-as-of-s27"] = Replay(None, 0, prices, STOP_BELOW, renew=lambda: without_deep_optimism(unseeded()))
    blind = lambda: blind_to_confidence(base.new_controller("goodput"))  # noqa: E731
    out["goodput-cold-as-of-s28"] = Replay(None, 0, prices, STOP_BELOW, renew=blind)
    for weight in (2.0, 4.0):
        ctrl = base.new_controller("goodput")
        ctrl.acceptance.prior_weight = weight
        out[f"goodput-w{weight:g}"] = Replay(ctrl, 0, prices, STOP_BELOW)
    ctrl = base.new_controller("goodput")
    ctrl.explore = 0.0
    out["goodput-noexplore"] = Replay(ctrl, 0, prices, STOP_BELOW)
    ctrl = base.new_controller("goodput")
    ctrl.final_explore = ctrl.explore  # a stop for good judged as one that probes undo, as before 2026-11-29
    out["goodput-final-stop-1sd"] = Replay(ctrl, 0, prices, STOP_BELOW)
    ctrl = base.new_controller("goodput")
    ctrl.thin = 2.0  # exploring a row's first ~3 drafts only, as of c16eaf1
    out["goodput-thin2"] = Replay(ctrl, 0, prices, STOP_BELOW)
    out["goodput-busy-probe"] = Replay(busy_controller(base), 0, prices, STOP_BELOW)
    ctrl = base.new_controller("goodput")
    ctrl.cost._observe_extra = lambda base, extra, seconds, width: None  # one factor on the whole verify (0fd2d23)
    out["goodput-one-factor"] = Replay(ctrl, 0, prices, STOP_BELOW)
    out["goodput-no-recovery"] = Replay(without_recovery(base.new_controller("goodput")), 0, prices, STOP_BELOW)
    out["goodput-no-continuation"] = Replay(blind_to_stops(base.new_controller("goodput")), 0, prices, STOP_BELOW)
    before = without_recovery(blind_to_stops(base.new_controller("goodput")))
    before.acceptance.prior_decay = 0.9  # a position never tried started 10% below the one before it
    before.thin = 2.0
    out["goodput-as-of-57d1873"] = Replay(before, 0, prices, STOP_BELOW)
    out["goodput-busy-probe-no-recovery"] = Replay(without_recovery(busy_controller(base)), 0, prices, STOP_BELOW)
    out["goodput-seed-first"] = Replay(seeded_first_only(base.new_controller("goodput")), 0, prices, STOP_BELOW)
    out["goodput-ties-up"] = Replay(ties_up(base.new_controller("goodput")), 0, prices, STOP_BELOW)
    both = ties_up(seeded_first_only(base.new_controller("goodput")))
    out["goodput-seed-first-ties-up"] = Replay(both, 0, prices, STOP_BELOW)
    return out


def never_seeded(ctrl: GoodputController) -> GoodputController:
    """`goodput` whose continuation starts at its prior (the drafter always goes on), not at the load probe's
    measure of the drafter's stop, as before 2026-11-29 (s28)."""
    ctrl.continuation_seeded = True
    return ctrl


def blind_to_confidence(ctrl: GoodputController) -> GoodputController:
    """`goodput` judging a row's first drafts on all of them alike, not by the drafter's confidence in each, as
    before 2026-11-29 (s29)."""
    ctrl._by_confidence = lambda: False
    return ctrl


def without_deep_optimism(ctrl: GoodputController) -> GoodputController:
    """`goodput` judging positions past the first on their mean estimates alone, as before 2026-11-29 (s28)."""
    ctrl._deep_optimism = lambda seqs, p: p
    return ctrl


def seeded_first_only(ctrl: GoodputController) -> GoodputController:
    """`goodput` whose load probe seeds the pool's first position only: deeper ones follow the chain above them."""
    ctrl.acceptance.pool_hits[1:] = 0.0
    ctrl.acceptance.pool_trials[1:] = 0.0
    return ctrl


def ties_up(ctrl: GoodputController) -> GoodputController:
    """`goodput` taking the widest K whose predicted goodput is within `margin` of the best, not holding K there."""

    def choose_k(gain: np.ndarray, k_max: int) -> int:
        near = np.flatnonzero(gain >= gain.max() / (1.0 + ctrl.margin))  # [n] the K within margin of the best
        ctrl.k_batch = int(near[-1]) if gain.argmax() > 0 else 0
        return ctrl.k_batch

    ctrl._with_hysteresis = choose_k
    return ctrl


def blind_to_stops(ctrl: GoodputController) -> GoodputController:
    """`goodput` pricing K as K drafts made, as before it learned where the draft stops (control/continuation.py)."""
    ctrl.continuation.estimate = lambda k, after_accepted=False: np.ones(k)
    return ctrl


def without_recovery(ctrl: GoodputController) -> GoodputController:
    """`goodput` as it was before it could recover from a price seeded on a busy machine: no follow-up draft after
    a probe, no probe of a row its draft has not read, and the seeded price's level never checked."""
    ctrl._follow_up = lambda seqs, ks, caps: ks
    ctrl._probe_affords_reading = lambda seq, num_seqs, context: False
    ctrl.cost._seed_ratios = [1.0] * SEED_CHECKS
    return ctrl


def busy_controller(base: LLM) -> GoodputController:
    """`goodput` seeded with the draft's step and reading priced at BUSY times what the load probe measured."""
    quiet = base.pair_price
    base.pair_price = dataclasses.replace(
        quiet,
        draft_step_s=BUSY * quiet.draft_step_s,
        draft_step_long_s=BUSY * quiet.draft_step_long_s,
        draft_read_s=BUSY * quiet.draft_read_s,
        draft_step_rows_s=BUSY * quiet.draft_step_rows_s,
        draft_read_long_s=BUSY * quiet.draft_read_long_s,
    )
    try:
        return base.new_controller("goodput")
    finally:
        base.pair_price = quiet


def replay_passes(replay: Replay, texts: list[Text], name: str, passes: int, max_tokens: int) -> list[float]:
    """Tokens per replayed second of each pass over the texts (a controller keeps what it learned between them)."""
    out = []
    for p in range(passes):
        seconds, tokens = replay.seconds, replay.tokens
        for i, text in enumerate(texts):
            replay.run(text, f"{name}-{p}-{i}", max_tokens)
        out.append((replay.tokens - tokens) / (replay.seconds - seconds))
    return out


def set_arm_shape(k_max: int, stop_below: float) -> None:
    """The widest draft every arm may ask and the draft's confidence stop, for the whole replay."""
    global K_MAX, STOP_BELOW
    K_MAX, STOP_BELOW = k_max, stop_below


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--contexts", default="256,2048,8192")
    ap.add_argument("--texts", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--split", default="dev", choices=("dev", "eval"))
    ap.add_argument("--prompts", default="code", help="the texts: the code set (its --split part) or a prompts file")
    ap.add_argument("--out", default="results/goodput_replay.json")
    ap.add_argument("--texts-file", help="an .npz of texts and prices: read where it has a context, else written")
    ap.add_argument("--passes", type=int, default=1, help="replay the texts this many times, one after another")
    ap.add_argument("--k-max", type=int, default=K_MAX, help="the widest draft asked (fixed arms 0..K)")
    ap.add_argument("--stop-below", type=float, default=STOP_BELOW, help="the draft's confidence stop")
    ap.add_argument("--retime", action="store_true", help="time the prices again (--texts-file's texts, this build)")
    a = ap.parse_args()
    set_arm_shape(a.k_max, a.stop_below)
    contexts = [int(x) for x in a.contexts.split(",")]
    base = pair_llm(max_model_len=max(contexts) + a.max_tokens + 2 * K_MAX + 8)
    text_ids = lc.text_ids(base, contexts, a.texts, a.prompts, a.split)
    cells = []
    with tqdm(total=len(contexts) * a.texts, unit="text", desc="responses") as bar:
        for context in contexts:
            cached = load_cell(a.texts_file, context) if a.texts_file else None
            if cached is None:
                texts = texts_for(base, text_ids, context, a.texts, a.max_tokens, bar)
                prices = time_prices(base, context)
                if a.texts_file:
                    save_cell(a.texts_file, context, texts, prices)
            else:
                texts, prices = cached
                if a.retime:  # the texts stay what the model says; their prices are this build's (a new kernel)
                    prices = time_prices(base, context)
                bar.update(len(texts))
            replays = arms(base, prices)
            by_pass = {name: replay_passes(r, texts, name, a.passes, a.max_tokens) for name, r in replays.items()}
            tps = {name: r.tokens / r.seconds for name, r in replays.items()}
            best = max((n for n in tps if n.startswith("fixed") and "nostop" not in n), key=tps.get)
            cell = {
                "context": context,
                "prices_ms": {
                    "target": {w: 1e3 * s for w, s in prices.target.items()},
                    "draft": {w: 1e3 * s for w, s in prices.draft.items()},
                },
                "first_draft_agreement": float(np.mean([t.agree.mean() for t in texts])),
                "tokens_per_s": tps,
                "mean_k": {name: float(np.mean(r.k_chosen)) for name, r in replays.items()},
                "best_fixed": best,
                "over_best_fixed": {name: v / tps[best] for name, v in tps.items()},
                "over_best_fixed_by_pass": {
                    name: [v / b for v, b in zip(vs, by_pass[best], strict=True)] for name, vs in by_pass.items()
                },
            }
            cells.append(cell)
            tqdm.write(
                f"N={context}: agreement {cell['first_draft_agreement']:.2f}; best fixed {best}; "
                + "  ".join(
                    f"{n} {v:.3f} (K {cell['mean_k'][n]:.2f}; by pass "
                    + "/".join(f"{x:.3f}" for x in cell["over_best_fixed_by_pass"][n])
                    + ")"
                    for n, v in cell["over_best_fixed"].items()
                )
            )
    result = {
        **provenance(model=base.target),
        "command": "python -m experiments.goodput_replay "
        f"--contexts {a.contexts} --texts {a.texts} --max-tokens {a.max_tokens} --split {a.split} --passes {a.passes} "
        f"--k-max {a.k_max} --stop-below {a.stop_below}"
        + (f" --prompts {a.prompts}" if a.prompts != "code" else "")
        + (f" --texts-file {Path(a.texts_file).name}" if a.texts_file else "")
        + (" --retime" if a.retime else ""),
        "pair_price": base.pair_price.__dict__,
        "cells": cells,
    }
    print(f"wrote {write_result(a.out, result)}")


if __name__ == "__main__":
    main()
