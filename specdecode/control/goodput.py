"""Goodput-maximising speculation length: pick K to maximise expected tokens per second of the whole batch.

For row i with conditional acceptance estimates p_i[1..], K drafts yield E_i(K) = 1 + sum_{j<=K} prod_{m<=j}
p_i[m] tokens in expectation. The controller picks one K maximising sum_i E_i(min(K, cap_i)) / cost(B, K, C),
priced as if every row drafted K, then trims rows whose next draft is almost surely rejected (that saves
drafting, and verification too), and prices what is left as asked: a draft model's forward for the rows left costs
about what it did for all (`_asked_pays`). Once the drafts exist, `truncate` picks the verify width again from what was
actually proposed: a drafter such as n-gram often finds drafts for only a few rows. On an accelerator the verify
forward is padded to the widest row, and at a large batch widening every row for a few costs more than they
return, so every row keeps one width; on the CPU the target runs each row's own tokens (models/llama.packs_rows:
`CostModel.packed`), so a row's drafts cost its own tokens there and each row keeps its own width.

Guards: hysteresis (the batch K only moves for a predicted gain above `margin`), bounded probing (a row that
has drafted nothing for `probe_every` steps is given drafts again: free when the batch already speculates (a
draft model's catch-up aside: one such row a step), otherwise one row at depth 1 at most once per `probe_every`
steps, no more often than keeps what probes cost within `probe_budget` of the time, and never where not even one
row's drafts, all accepted, could pay: `_alone_could_pay`, at 1 / SEED_DOUBT of a price seeded at load until drafting
steps have measured one), optimism where a row's evidence is thin (its first draft: `_explore`; deeper ones, which
learn only in steps that ask for them: `_deep_optimism`), and clipped estimates (no collapse).

A probe's cost depends on the drafter: an n-gram probe costs one more verified token, but a draft model that
sat idle must first catch up on every token since it last drafted. On the Qwen2.5-Coder pair a probe every 16
steps fed the 0.5B 17 tokens each time, and `goodput`, choosing K = 0 between probes, ran at 0.85x plain
decoding (`results/code_dev_pair_draft.json`). So each widening probe's cost is measured (its step's time over
a plain step's, as the cost model predicts it) and the next one waits until probes stay within the budget.

What a probe cannot do is price a draft: its drafting began with that catch-up. So the step after a widening
probe drafts once more (`_follow_up`), steady and priced; the first such steps also set the level of the price
seeded at load (`CostModel.seed_level`), which a machine busy at load had put at 2.5x, holding K at 0 for good.
A row its draft model has not read yet is probed too, once the steps since the last probe have earned its reading
at the probe budget (`_probe_affords_reading`): a short prompt soon, a 1,000-token one practically never.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from specdecode.control.acceptance import P_MAX, AcceptanceTracker
from specdecode.control.base import ControllerBase, StepStats
from specdecode.control.continuation import DraftContinuation, width_distributions
from specdecode.control.cost import CostModel, default_cost_model
from specdecode.control.hold_ledger import HoldLedger
from specdecode.control.one_row_curve import curve_one_row
from specdecode.control.tree_budget import ConfidenceCalibration, tree_width
from specdecode.drafters.base import Proposal
from specdecode.drafters.draft_window import SINK
from specdecode.step.sequence import Sequence, mean_context
from specdecode.verify.tree_layout import tree_layout

CAUGHT_UP = 8  # tokens a draft model may have left to read of a row that drafted last step (what it accepted)
# The most a price seeded at load has overstated drafting: a load probe timed while another process loaded beside it
# priced the 0.5B's drafts at 30 ms where they cost 12 (`_may_widen`).
SEED_DOUBT = 2.5
CONTINUATION_SEED = 4.0  # rows the load probe's measure of a drafter's stop is worth (`_seed_continuation`)
SURE_MIN = 4  # the probe's tokens of each confidence (sure, unsure) that may seed first drafts by confidence
# Steps a cheap drafter's gate (ask every draft, or none) stands for the same rows before it is priced again.
GATE_STEPS = 8
# Steps without a plain verify after which a close choice takes a plain step to price one (`_plain_probe_due`):
PLAIN_FIRST = 1  # before any was seen: the step after the first that verified drafts
PLAIN_EVERY = 64  # since the last


def row_cap(seq: Sequence, k_max: int) -> int:
    """Drafts the engine will allow this row (it clamps K the same way): the context and max_tokens bound it."""
    return max(0, min(k_max, seq.room, seq.params.max_tokens - seq.metrics.num_generated - 1))


def expected_tokens(reach: np.ndarray, caps: np.ndarray) -> np.ndarray:
    """reach [B, k_max] P(draft j accepted), caps [B] -> [B, k_max + 1] expected tokens per row for each batch K."""
    k_max = reach.shape[1]
    cum = np.concatenate([np.zeros((len(reach), 1)), np.cumsum(reach, axis=1)], axis=1)  # [B, k_max + 1]
    ks = np.minimum(np.arange(k_max + 1)[None], caps[:, None])  # [B, k_max + 1] each row's own K
    return 1.0 + cum[np.arange(len(reach))[:, None], ks]


def curve_parts(
    reach: np.ndarray,
    caps: np.ndarray,
    cost: CostModel,
    context: float,
    go_on: np.ndarray | None = None,
    go_on_accepted: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """([k_max + 1] expected tokens, [k_max + 1] predicted seconds) of the batch's step for each batch K: see
    `goodput_curve`."""
    num_seqs, k_max = reach.shape
    go_on = np.ones(k_max) if go_on is None else go_on  # [k_max] (all K made: every batch is its widest row's K)
    after = go_on if go_on_accepted is None else go_on_accepted  # [k_max] or [B, k_max]: going on after a hit
    prices = cost.predict_many(num_seqs, np.arange(k_max + 1), context)  # [k_max + 1] by width made
    if num_seqs == 1:  # the same sums in Python floats (control/one_row_curve.py)
        row_after = after[0] if after.ndim == 2 else after  # [k_max]
        tokens, seconds = curve_one_row(
            reach[0].tolist(), int(caps[0]), prices.tolist(), go_on[:k_max].tolist(), row_after[:k_max].tolist()
        )
        return np.array(tokens), np.array(seconds)
    return batch_curve_parts(reach, caps, prices, go_on, after)


def batch_curve_parts(
    reach: np.ndarray, caps: np.ndarray, prices: np.ndarray, go_on: np.ndarray, after: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """`curve_parts` for any batch from the step's prices [k_max + 1] by width made: reach [B, k_max], caps [B],
    go_on [k_max], after [k_max] or [B, k_max]."""
    k_max = reach.shape[1]
    made = np.cumprod(np.broadcast_to(after[..., :k_max], reach.shape), axis=1)  # [B, k_max]
    tokens = expected_tokens(reach * made, caps).sum(0)  # [k_max + 1]
    seconds = width_distributions(go_on, caps, k_max) @ prices  # [k_max + 1] by K asked
    return tokens, seconds


def goodput_curve(
    reach: np.ndarray,
    caps: np.ndarray,
    cost: CostModel,
    context: float,
    go_on: np.ndarray | None = None,
    go_on_accepted: np.ndarray | None = None,
) -> np.ndarray:
    """[k_max + 1] predicted tokens per second of the batch for each batch K. go_on [k_max]: P(the drafter makes
    draft j | it made j - 1) (control/continuation.py; None: it always makes all K), so that a drafter that stops
    early is asked K as a cap: K costs the drafts it makes, and only drafts made can be accepted."""
    tokens, seconds = curve_parts(reach, caps, cost, context, go_on, go_on_accepted)  # [k_max + 1] each
    return tokens / np.maximum(seconds, 1e-9)


class GoodputController(ControllerBase):
    def __init__(
        self,
        cost: CostModel | None = None,
        acceptance: AcceptanceTracker | None = None,
        margin: float = 0.03,
        probe_every: int = 16,
        probe_keep: float = 0.25,
        row_floor: float = 0.1,
        cheap_draft: float = 0.05,
        widen_margin: float = 0.05,
        probe_budget: float = 0.03,
        explore: float = 1.0,
        final_explore: float = 2.0,
        thin: float = 6.0,
        tie_margin: float = 0.01,
        plain_doubt: float = 0.3,
    ) -> None:
        self.cost = cost if cost is not None else default_cost_model()
        self.acceptance = acceptance if acceptance is not None else AcceptanceTracker()
        self.margin = margin
        self.tie_margin = tie_margin  # K within this of the best are one to a drafter that stops when unsure
        self.probe_every = probe_every
        self.probe_keep = probe_keep  # evidence kept when a row is probed
        # A row drafts position j only if P(draft j accepted) >= this: ~ the cost of one verified token relative
        # to a whole step for a small model at batch 1, so a draft below it costs more than it can return.
        self.row_floor = row_floor
        # Where K = 0 wins on the mean estimate, K = 1 is still tried while rows that have tried fewer than
        # `thin` first drafts would pay for it at `explore` standard deviations more acceptance (`_explore`).
        # Counts decay by 0.9 a step, so 6 is a row's first ~8 drafts: at 2 (its first ~3), one hit in three
        # early drafts of a draft right 78% of the time held a 2,048-token row at K = 0 until a probe 16 steps on.
        self.explore = explore
        self.final_explore = final_explore  # `explore` where a stop would be for good (`_stop_is_final`)
        self.thin = thin
        self.cheap_draft = cheap_draft
        # `truncate` verifies drafts only for a predicted gain above this over verifying none: the cost model
        # errs by ~5% of a step, and the best of several noisy estimates is biased up. At C = 8 (n-gram,
        # K_max 8) widths predicted to pay 2-8% were verified; one draft a row then cost +44% where +33% was
        # predicted, and such steps lost to plain decoding.
        self.widen_margin = widen_margin
        self.k_batch: int | None = None  # the batch K in force (the hysteresis reference)
        self.idle: dict[str, int] = {}  # steps since each request last drafted anything
        self.drafted_last: set[str] = set()  # the requests that drafted in the last step observed
        self.since_probe = 0  # steps since a probe last widened a non-speculating batch
        self.probe_budget = probe_budget  # the share of time widening probes may cost
        self.probe_interval = probe_every  # steps between widening probes: probe_every, or more where they cost
        self.probe_riders = 1  # silent rows a step that drafts anyway may probe, for a dear drafter (`_probe`)
        self.following = False  # this step is a widening probe's follow-up: observe() adds what it cost
        self.probe_extra_s = 0.0  # what the last widening probe (and its follow-up) cost over plain decoding
        self.probing: set[str] = set()  # rows given drafts by this step's probe: `truncate` keeps one for them
        self.widening: set[str] = set()  # the row a widening probe gave a draft in this step: observe() prices it
        self.follow_up: set[str] = set()  # rows widening-probed in the last step: one more draft this step
        self.continuation = DraftContinuation()  # how often the drafter goes on to its next draft (early stops)
        self.probe_drafts: tuple[tuple[float, ...], tuple[bool, ...]] = ((), ())  # seed_pair's confidences, agreed
        self.continuation_seeded = False
        self.pool_seed_weight = 0.0  # drafts the load probe's acceptance is worth per position (seed_pair)
        self.asked: dict[str, int] = {}  # the drafts each row was asked for this step
        self.made: dict[str, int] = {}  # the drafts each row made this step (before `truncate` cut any)
        self.would_go_on: dict[str, bool] = {}  # rows that made all they were asked: would their drafter go on?
        self.draft_stop_below = 0.0  # the drafter's confidence stop (bind_drafter; 0: it never stops early)
        self.draft_read_s = 0.0  # seconds a token costs a draft model to catch up on (seed_pair); 0: not priced
        self.read_per_context = 0.0  # what each cached token adds to that (seed_pair's reads)
        self.catch_up_chunk = 0  # tokens a draft model catches up on a step (seed_pair); 0: all at once
        self.unread: Callable[[Sequence], int] | None = None  # tokens of a row its drafter has yet to read
        # A draft model with a prompt lookup (drafters/lookup_first.py): rows it does not draft for still take the
        # lookup's drafts, priced on their own history (`_hold`)
        self.hold_model: Callable[[set[str]], None] | None = None
        self.held: set[str] = set()  # the rows asked for lookup drafts alone this step
        # (request ids, [B, k] estimates) from the rows' histories this step (`_history_estimates`)
        self.step_estimates: tuple[tuple[str, ...], np.ndarray] | None = None
        self.lookup_acceptance = AcceptanceTracker()  # those rows' lookup drafts: not the model's
        self.hold_ledger = HoldLedger(probe_every=probe_every)  # whether holding rows has paid (control/hold_ledger.py)
        # Tree drafters: the node budget is set in `truncate` from their confidences (control/tree_budget.py).
        self.tree_mode = False
        self.confidence_mode = False  # a chain drafter whose confidences set the width (suffix): same
        self.tree_calibration = ConfidenceCalibration()
        self.tree_verified: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # this step's (confidences, depths)
        self.tree_idle = 0  # steps since a tree was last verified
        # A cheap drafter's gate (`_gate_holds`): the rows and k_max it was priced for, whether it asks every
        # draft (open) or none, and the steps it has stood since
        self.gate_key: tuple[tuple[str, ...], int] | None = None
        self.gated = True  # whether the drafter may be gated (`bind_drafter`: not a draft model)
        self.gate_open = False
        self.gate_steps = 0
        self.idle_caps = np.zeros(0, dtype=int)  # [B] a standing draft model's caps as priced (`_stand_idle`)
        # A plain step is given where K = 0 would win were its price this much lower than believed (`_plain_probe_due`)
        self.plain_doubt = plain_doubt
        self.since_plain = 0  # steps observed since one verified no drafts

    def seed_pair(
        self,
        acceptance: float,
        draft_step_s: float,
        draft_read_s: float = 0.0,
        weight: float = 8.0,
        catch_up_chunk: int = 0,
        steps: tuple[tuple[int, int, float], ...] = (),
        window: int = 0,
        reads: tuple[tuple[int, float], ...] = (),
        confidences: tuple[float, ...] = (),
        agreed: tuple[bool, ...] = (),
    ) -> None:
        """Start from a draft model's price measured at load (control/pair_probe.py): its acceptance as the
        pool prior, worth `weight` drafts tried per position, its steady step as the cost of a drafted token,
        draft_read_s, the seconds a token costs it to read when it catches up, and catch_up_chunk, the tokens
        it reads a step (the step's token budget; 0: all at once). See `_worth_catching_up`. steps: (rows,
        cached tokens, seconds) of steady steps timed at given batch sizes and contexts, which then price a row
        and the draft's attention (draft_step_s alone is taken as a step of one row after no context); window:
        the draft's attention window (drafters/draft_window.py; 0: none), past which its attention costs no more;
        reads: (cached tokens, seconds a token) of readings timed at two contexts, which price what each cached
        token adds to a token read (draft_read_s alone: a flat price); confidences, agreed: the draft's top
        probability at each token of the probe's text and whether its top token was the target's (`bind_drafter`)."""
        self.acceptance.seed_pool(acceptance, weight)
        self.pool_seed_weight = weight
        self.probe_drafts = (confidences, agreed)
        self._seed_continuation()
        # A draft model of the target's family agrees in runs (code above all), so a position never tried starts
        # where the one before it is, not 10% lower (acceptance.py's prior_decay): drafts 3-4, never asked, had
        # stayed at ~0.65 and held `goodput` at K = 1-2 where K = 3 was best (results/goodput_replay.json).
        self.acceptance.prior_decay = 1.0
        # And the pool, which knows this draft on this target, is worth two of a row's own drafts, not one: a row's
        # ~10 forgotten drafts are a noisy sample of a rate near what a draft needs at long contexts, and on the dev
        # prose replay at 8,192 tokens a row right 62% of the time stopped after a few misses where fixed K = 1
        # paid (docs/benchmarks.md, "goodput over a draft that stops when unsure").
        self.acceptance.prior_weight = 2.0
        self.cost.draft_context_cap = SINK + window if window > 0 else 0
        steps = steps or ((1, 0, draft_step_s),)
        for rows, context, seconds in steps:  # together worth what one price was
            self.cost.seed_draft(seconds, weight=4.0 / len(steps), context=context, num_seqs=rows)
        self.draft_read_s = draft_read_s
        self.read_per_context = 0.0
        if len(reads) >= 2:  # a line through the first and the last (never cheaper for a longer cache)
            (c0, s0), (c1, s1) = reads[0], reads[-1]
            self.read_per_context = max(s1 - s0, 0.0) / max(c1 - c0, 1)
            self.draft_read_s = max(s0 - self.read_per_context * c0, 0.0)
        self.catch_up_chunk = catch_up_chunk

    def bind_drafter(self, drafter) -> None:
        self.unread = getattr(drafter, "unread", None)
        self.hold_model = getattr(drafter, "hold_model", None) if getattr(drafter, "lookup", None) else None
        # A drafter with a cache of its own (a draft model: drafters/catch_up.py) is priced every step, its first
        # drafts at their mean: the lookup gate is for drafters that read nothing (`_gate_holds`, `_reach`).
        self.gated = not hasattr(drafter, "prefill_budget")
        self.draft_stop_below = float(getattr(drafter, "stop_below", 0.0))
        self._seed_continuation()

    def _seed_continuation(self) -> None:
        """Where the drafter stops when unsure and the load probe saw its confidences, start the continuation
        (control/continuation.py) at the share of the probe's tokens it would have gone on from, over all of them
        and over those it got right, worth CONTINUATION_SEED rows; once. Its prior, that the drafter always goes on,
        priced K = 4 as four drafts made where the 0.5B, stopping below 0.7, made ~2.2 (it went on ~0.6 of the
        time on dev code at 8,192 tokens): a fresh request asked K = 1-2 where fixed K = 3 was best. The same tokens
        seed the pool's first drafts by confidence (`_by_confidence`): how often the draft was right where it was
        sure, and where it was not, each worth the pool's seed weight."""
        confidences, agreed = self.probe_drafts
        if self.continuation_seeded or self.draft_stop_below <= 0.0 or not confidences:
            return
        goes_on = np.asarray(confidences) >= self.draft_stop_below  # [N]
        right = np.asarray(agreed, dtype=bool)  # [N]
        after_right = goes_on[right].mean() if right.any() else goes_on.mean()
        self.continuation.seed(float(goes_on.mean()), float(after_right), CONTINUATION_SEED)
        if goes_on.sum() >= SURE_MIN and (~goes_on).sum() >= SURE_MIN:
            rates = float(right[goes_on].mean()), float(right[~goes_on].mean())
            self.acceptance.seed_by_confidence(rates, self.pool_seed_weight)
        self.continuation_seeded = True

    def _worth_catching_up(self, seq: Sequence, k: int, p: np.ndarray, num_seqs: int, context: float) -> bool:
        """Whether a row whose draft model has not read all of it yet should start drafting at K = k: its first
        drafts cost reading the rest of its text (the drafter's `unread`; unbound, its whole text: a 1000-token RAG
        prompt is ~1000 draft-model tokens of prefill), paid back only over the tokens it generates once the draft
        has read it. The saving per token
        is a plain step's time less a K-step's time over its expected tokens, each over the batch's rows (a row's
        share); reading is draft_read_s a token (0
        without a probe at load: lookup drafters read nothing), catch_up_chunk tokens a step, and the row
        writes a token at K = 0 in each of those steps (a 1,000-token RAG prompt read 32 tokens a step is 32 of
        its 128 tokens gone before its first draft: Spec-Bench's RAG and extraction rows drafted with 0.0-0.9 s
        of reading and too few tokens left to earn it back)."""
        if self.draft_read_s <= 0.0 and self.read_per_context <= 0.0:
            return True
        if self.unread is None and self.acceptance.has_drafted(seq.request_id):  # drafted: its draft read it then
            return True
        text = len(seq.token_ids) if self.unread is None else self.unread(seq)  # what is left to read of it
        if text <= CAUGHT_UP:  # a row that drafted last step: what it accepted since
            return True
        reading_steps = -(-text // self.catch_up_chunk) if self.catch_up_chunk > 0 else 0
        remaining = min(seq.params.max_tokens - seq.metrics.num_generated, seq.room) - reading_steps
        reach = np.cumprod(p[:k])  # [k]
        # A token of the batch costs a step's time over its rows: the row's share of what drafting saves is that
        # difference per row (the whole step's, as it was, credited each row with 8 rows' saving at batch 8)
        per_token_k = self.cost.predict(num_seqs, k, context) / (1.0 + reach.sum()) / num_seqs
        per_token_plain = self.cost.predict(num_seqs, 0, context) / num_seqs
        saving = max(remaining, 0) * (per_token_plain - per_token_k)
        return saving > self.reading_s(seq, text)

    def reading_s(self, seq: Sequence, text: int) -> float:
        """Seconds the draft model takes to read the last `text` tokens of the row: the load probe's price of a
        token read, plus what each cached token before it adds (a catch-up's tokens attend to all of them: at
        2,048 tokens the 0.5B read ~3.3 ms a token where the probe, after ~100, priced 1.1; within the draft's
        window), at the level that drafting steps have since measured for its drafts (`CostModel.seed_level`: a
        probe timed on a busy machine prices both high)."""
        context = self.cost.draft_context(len(seq.token_ids) - text / 2)  # what a token read sees, on average
        return text * (self.draft_read_s + self.read_per_context * context) * self.cost.seed_level

    def _probe_affords_reading(self, seq: Sequence, num_seqs: int, context: float) -> bool:
        """A widening probe may give a row its draft model has not read yet a draft once the steps since the last
        probe have earned its reading at probe_budget. Never probing such rows kept a row at K = 0 for good
        whenever drafting looked dear: a pool that had gone pessimistic, or a draft priced on a busy machine,
        was never tried again, since only drafting rows correct either; probing them whatever they have to read
        would read a 1,000-token RAG prompt, ~2 s of the 0.5B, for one draft."""
        text = len(seq.token_ids) if self.unread is None else self.unread(seq)
        return self.reading_s(seq, text) <= self._probe_budget_s(num_seqs, context) * self.since_probe

    def choose(self, seqs: list[Sequence], k_max: int) -> list[int]:
        self.since_probe += 1
        self.held = set()
        self.step_estimates = None  # what the last step observed has changed them
        if k_max <= 0 or not seqs:
            return [0] * len(seqs)
        caps = np.array([row_cap(s, k_max) for s in seqs])  # [B]
        room = caps.copy()  # [B] what the engine allows each row, before reading judges any
        context = mean_context(seqs)
        if self.tree_mode or self.confidence_mode:
            # Per-position acceptance means little for trees and frequency-scored chains: their confidences
            # decide in `truncate`, so they are always asked (a suffix match seen 40 times in 40 is worth
            # verifying for a row whose history is poor).
            return caps.tolist()
        key = (tuple(s.request_id for s in seqs), k_max)
        if self.gated and self._gate_holds(key):
            return caps.tolist() if self.gate_open else self._closed(seqs, caps, context)
        if self._may_stand_idle(seqs) and self._gate_holds(key):  # a draft model asked nothing lately
            return self._ask(seqs, self._closed(seqs, np.minimum(caps, self.idle_caps), context), room)
        p = self._estimates(seqs, k_max, context)  # [B, k_max]
        go_on = self._go_on(seqs, p, k_max)
        cheap = self._drafting_is_cheap(len(seqs), k_max, context)
        reach = self._reach(seqs, p, cheap, context)  # [B, k_max]
        gain = goodput_curve(reach, caps, self.cost, context, *go_on)  # [k_max + 1]
        if cheap:
            # Drafts that cost (almost) nothing, as n-gram lookups: ask for all of them and let `truncate` pick
            # the width from what was found (capping K here would also hide how long accepted runs can be).
            # Unless no width pays even if every row found drafts as good as its history (a full batch of a
            # compute-bound target): then the lookups, ~5% of a 32-row step, would only be thrown away. "Pays"
            # takes truncate's margin: a width that cannot beat it there is cut after the lookups are paid for
            # (SmolLM2, n-gram, 8 rows at 7,900 tokens: 5 drafts asked a row, 0.02 verified, 0.93x K = 0).
            pays = gain.max() > gain[0] * (1.0 + self.widen_margin) or self._one_row_pays(reach, caps, context)
            ks = caps.tolist() if pays else self._closed(seqs, caps, context)
            if self.gated:
                self.gate_key, self.gate_open, self.gate_steps = key, bool(pays), 0
                return ks
            return self._ask(seqs, ks, room)  # a draft model priced cheap: the rows it skips are held as elsewhere
        chosen = self._with_hysteresis(gain, k_max)
        k = chosen or self._explore(seqs, p, caps, context)
        # Rows keep their leading drafts that are still worth trying (reach is non-increasing in j).
        ks = np.minimum((reach >= self.row_floor).sum(1), np.minimum(caps, k))  # [B]
        # A row the draft model has not read yet drafts only if what it saves pays for that reading; else it
        # neither drafts nor is probed (a probe would pay the reading too).
        unread = [i for i, s in enumerate(seqs) if not self._worth_catching_up(s, max(k, 1), p[i], len(seqs), context)]
        ks[unread] = 0
        if chosen and not self._asked_pays(reach, ks, context):
            ks[:] = 0
        if ks.any() and self._plain_probe_due(gain, k):
            return self._plain_probe(seqs)
        caps[[i for i in unread if not self._probe_affords_reading(seqs[i], len(seqs), context)]] = 0
        out = self._probe(seqs, ks.tolist(), caps.tolist(), context)
        if self._may_stand_idle(seqs) and not any(out):
            self._stand_idle(key, caps)
        return self._ask(seqs, out, room)

    def _plain_probe_due(self, gain: np.ndarray, k: int) -> bool:
        """Whether this step, which would verify K = k drafts a row, should be plain instead: K = 0 would win were a
        plain step's price `plain_doubt` lower than believed (gain [k_max + 1]), and no plain verify has been seen in
        the last PLAIN_EVERY steps (PLAIN_FIRST before any). Only plain steps price plain steps (`correction` is one
        level for every width until both kinds are seen: CostModel._observe_extra), and a controller that drafts
        from its first step never sees one. On the pair at 8 rows of 8,192 tokens (dev code) a verify of two tokens a
        row cost 1.6x a plain one (the second query's attention, ~1.4 GFLOP a token there) where the calibration,
        timed at 64 and 512 cached tokens, priced 1.3x: at the level K = 1's steps set, a plain step looked 120 ms
        where it took 93, K = 1 looked 2% better than K = 0, and `goodput` drafted every step at 0.78x K = 0; with
        this step, 0.98x (results/goodput_plain_probe_dev_{before,after}.json). A probe costs at most `plain_doubt`
        of a step, and only where the choice is that close. Not after a widening probe: its follow-up must draft."""
        if self.follow_up or gain[k] <= gain[0]:  # K = 0 is already best (k is `_explore`'s): nothing to price
            return False
        due = PLAIN_EVERY if self.cost.plain_measured else PLAIN_FIRST
        return self.since_plain >= due and gain[0] >= gain[k] * (1.0 - self.plain_doubt)

    def _plain_probe(self, seqs: list[Sequence]) -> list[int]:
        """A step of no drafts: nothing asked of the draft model nor held to its lookup (`_hold`)."""
        self.asked = {}
        if self.hold_model is not None:
            self.hold_model(set())
        return [0] * len(seqs)

    def _ask(self, seqs: list[Sequence], ks: list[int], room: np.ndarray) -> list[int]:
        """The step's ks: the rows the draft model is asked for (`asked`), then the others held to its lookup."""
        self.asked = {s.request_id: k for s, k in zip(seqs, ks, strict=True) if k}
        return self._hold(seqs, ks, room)

    def _may_stand_idle(self, seqs: list[Sequence]) -> bool:
        """Whether K = 0 may stand for a few steps (`_stand_idle`): a draft model (not a gated lookup), 2+ rows."""
        return not self.gated and len(seqs) > 1

    def _stand_idle(self, key: tuple[tuple[str, ...], int], caps: np.ndarray) -> None:
        """A draft model asked nothing of a batch's rows (`key`) and given no probe: the next GATE_STEPS - 1 steps of
        two or more rows reuse that (a closed gate, `_gate_holds`), with probes and holds as before (caps [B]: the
        rows' caps as priced, a row too dear to read never probed), until the model drafts (`observe`), a probe is
        given or a request ends (`forget`). Where nothing drafts no estimate moves but the cost model's level, and
        pricing the whole batch again each step was most of goodput's work: on the pair at 8 rows of 256 tokens
        (K = 0 its best arm) ~0.9 ms of choose's numpy in a ~37 ms step (timed in the engine, 2026-11-30; goodput
        read 0.96x K = 0 there in two short runs whose files were not kept, 0.980x in results/long_context_pair_b8.json
        after this). At one row its
        Python-float paths cost a third of that, and a row's reading (`unread`) decides there from step to step."""
        self.gate_key, self.gate_open, self.gate_steps = key, False, 0
        self.idle_caps = caps.copy()

    def _hold(self, seqs: list[Sequence], ks: list[int], room: np.ndarray) -> list[int]:
        """ks, with each row the draft model is not asked to draft for (ks 0) asked its room [B] of the lookup's
        drafts alone, where the drafter has a lookup (`DraftModelDrafter.hold_model`). A lookup costs no forward, and
        `truncate` verifies what it finds as far as those rows' lookup drafts have paid (`_held_estimates`). Without
        it, a row whose long prompt the draft model had not read (too dear to read for what its drafts save) got no
        drafts at all: on the dev RAG and extraction prompts of ~3,000 characters, which copy much of their input,
        `goodput` decoded as K = 0 where the lookup alone (n-gram, fixed K = 3) made 1.9x (data/dev_long_prompts)."""
        if self.hold_model is None:
            return ks
        idle = [i for i, k in enumerate(ks) if k == 0 and room[i] > 0]
        if idle and self.hold_ledger.holds():  # only while what holding saves covers its lookups (hold_ledger.py)
            for i in idle:
                ks[i] = int(room[i])
                self.held.add(seqs[i].request_id)
        self.hold_model(self.held)
        return ks

    def _gate_holds(self, key: tuple[tuple[str, ...], int]) -> bool:
        """Whether this step may reuse a cheap drafter's last gate (every draft asked where some width pays, else
        none) without pricing it again: the same rows at the same k_max, fewer than GATE_STEPS steps since it was
        priced, and, for a closed gate, no draft in between (a probe's ends it: `_closed`). For lookups the gate
        only decides whether they run: `truncate` judges every draft found from the rows' histories each step, so
        an open gate held a few steps too long costs lookups it throws away (cheap, by `_drafting_is_cheap`), a
        closed one a few steps of drafts found late. Pricing it every step cost ~0.3-0.4 ms of choose's Python in
        the engine: 2-3% of SmolLM2's 16 ms step at 8 rows of 256 tokens (K = 0 on every step but probes), 3-5%
        of its ~6-9 ms step at batch 1."""
        if self.gate_key != key or self.gate_steps >= GATE_STEPS - 1:
            return False
        self.gate_steps += 1
        return True

    def _closed(self, seqs: list[Sequence], caps: np.ndarray, context: float) -> list[int]:
        """A closed gate's drafts: none but a probe's (`_probe`), whose outcome ends the gate's hold."""
        ks = self._probe(seqs, [0] * len(seqs), caps.tolist(), context)
        if any(ks):
            self.gate_key = None
        return ks

    def _estimates(self, seqs: list[Sequence], k: int, context: float) -> np.ndarray:
        """[B, k] each row's acceptance estimates; a row whose stop would be for good (`_stop_is_final`) is judged
        at its first position on all its first drafts where they say more than its last ~10 do
        (`AcceptanceTracker.long_run_first`). The forgotten counts follow a row's last ~10 drafts, and a row right
        65% of the time dips below the ~0.4 a draft needs within a few dozen: on the pair at 2,048 tokens
        `goodput` drafted 40% of its steps at 64% accepted, then stopped for good, 0.874x the best fixed K
        (results/long_context_pair_b1_s24.json). The forgotten counts still lower the deeper positions, and K."""
        p = self._history_estimates(seqs, k)  # [B, k]
        if self.unread is None or k == 0:
            return p
        budget = None  # priced once, for the first row it is asked for
        for i, s in enumerate(seqs):
            if not self.acceptance.has_drafted(s.request_id):
                continue
            long_run = self.acceptance.long_run_first(s.request_id)
            if long_run <= p[i, 0]:
                continue
            if budget is None:
                budget = self._probe_budget_s(len(seqs), context)
            if self._stop_is_final(s, budget):
                p[i, 0] = long_run
        return p

    def _history_estimates(self, seqs: list[Sequence], k: int) -> np.ndarray:
        """[B, k] each row's estimates from its drafts' history alone (first drafts by confidence where the drafter
        stops when unsure), kept from `choose` for `truncate` in the same step: nothing they read changes between
        the two but a probe's `soften`, which drops them. Computed twice a step they were ~80 us of its ~1 ms of
        Python on the pair at batch 1 (the caches cold after each forward)."""
        rows = tuple(s.request_id for s in seqs)
        kept = self.step_estimates
        if kept is not None and kept[0] == rows and kept[1].shape[1] >= k:
            return kept[1][:, :k].copy()
        if len(rows) == 1:  # np.stack's own cost, ~10 us cold, for one row
            p = self.acceptance.estimate(rows[0], k)[None]  # [1, k]
        else:
            p = np.stack([self.acceptance.estimate(rid, k) for rid in rows])  # [B, k]
        if k > 0 and self._by_confidence():
            sure = self.continuation.estimate(2)[1]  # P(the drafter is sure of a first draft: it goes on)
            first = np.stack([self.acceptance.first_by_confidence(rid) for rid in rows])  # [B, 2]
            p[:, 0] = sure * first[:, 0] + (1.0 - sure) * first[:, 1]
        self.step_estimates = (rows, p.copy())
        return p

    def _by_confidence(self) -> bool:
        """Whether first drafts are judged by the drafter's confidence in them: a drafter that stops when unsure,
        the load probe having seeded both kinds (`_seed_continuation`)."""
        return self.draft_stop_below > 0.0 and bool(self.acceptance.pool_by_confidence[:, 1].min() > 0)

    def _go_on(self, seqs: list[Sequence], p: np.ndarray, k_max: int) -> tuple[np.ndarray, np.ndarray]:
        """(go_on [k_max], after [k_max] or [B, k_max]): P(the drafter makes draft j | it made j - 1), over every row
        and after an accepted draft (control/continuation.py), the latter per row at the second draft where first
        drafts are judged by confidence (`_by_confidence`): P(sure of the first | it was accepted) is then the row's
        P(sure and right) over p [B, k_max]'s first column. A drafter that stops when unsure goes on after the drafts
        it was sure of, those likelier right, and a miss it was unsure of says little of them: the 0.5B's first draft
        of a response (its first token) was unsure and wrong on all six dev code texts at 8,192 tokens, the pooled
        estimate had it as any miss, and `goodput` asked K = 1 for the next 4-5 steps where fixed K = 4 was best."""
        every = self.continuation.estimate(k_max)
        after = self.continuation.estimate(k_max, after_accepted=True)
        if k_max < 2 or not self._by_confidence():
            return every, after
        sure_right = every[1] * np.stack([self.acceptance.first_by_confidence(s.request_id)[0] for s in seqs])  # [B]
        rows = np.tile(after, (len(seqs), 1))  # [B, k_max]
        rows[:, 1] = np.minimum(sure_right / np.maximum(p[:, 0], 1e-9), 1.0)
        return every, rows

    def _plain_rate(self, num_seqs: int, context: float) -> float:
        """Tokens per second of a plain step (K = 0) of num_seqs rows, as the cost model prices it: the rate that
        every pricing of some rows' drafts (`_one_row_pays`, `_asked_pays`, `_alone_could_pay`) must beat."""
        return num_seqs / max(self.cost.predict(num_seqs, 0, context), 1e-9)

    def _one_row_pays(self, reach: np.ndarray, caps: np.ndarray, context: float) -> bool:
        """Where the target runs each row's own tokens (`CostModel.packed`), whether some row's drafts alone would
        pay beyond truncate's margin: reach [B, k_max] P(drafts 1..j of a row accepted), caps [B]. A lookup drafter
        finds drafts in a few rows, and only theirs are verified: SmolLM2 with n-gram, 8 rows at 7,900 tokens, where
        drafts for every row cannot pay, fixed K = 1 (0.51 verified a row) decoded 1.14x K = 0 while goodput,
        pricing every row's drafts, asked for none (results/long_context_smollm2_b8_s19.json)."""
        num_seqs, k_max = reach.shape
        if not self.cost.packed or num_seqs < 2:
            return False
        plain = self._plain_rate(num_seqs, context)
        ks = np.arange(1, k_max + 1)  # [k_max] the lookups are asked of every row; one row's drafts are verified
        seconds = self.cost.predict_tokens_many(num_seqs, num_seqs + ks, context)  # [k_max]
        seconds += self.cost.predict_draft_many(num_seqs, ks, context)
        tokens = num_seqs + np.cumsum(reach, axis=1) * (np.arange(1, k_max + 1)[None] <= caps[:, None])  # [B, k_max]
        return bool((tokens / seconds[None]).max() > plain * (1.0 + self.widen_margin))

    def _asked_pays(self, reach: np.ndarray, ks: np.ndarray, context: float) -> bool:
        """Whether the drafts asked, ks [B] a row, beat a plain step by `margin` as asked: reach [B, k_max]. The
        curve priced the batch K with every row drafting, but rows are then cut (drafts unlikely to be accepted, a
        prompt not worth reading), and a draft model's forward costs about as much for one row as for all
        (it reads its weights either way: the 0.5B's ~8 ms a position against ~1.5 more a row). So where only
        some rows are left, the few drafts must pay for that forward alone. On the pair at C = 4 (dev chat prompts,
        the sweep's closed loop, 12 rounds) the steps where some rows of a batch drafted cost 1.89 s over plain steps
        for 1.04 s their drafts saved; priced again, 0.93 s for 0.91, and `goodput` ran 1.023x what it did (the
        median of paired rounds; `python -m experiments.goodput_asked_pays`, results/goodput_asked_pays_c4_dev.json).
        A batch of one is the curve's own row, and every row asked is the curve's assumption: neither is priced
        again."""
        asked = ks > 0  # [B]
        if len(ks) < 2 or not asked.any() or asked.all():
            return True
        plain = self._plain_rate(len(ks), context)
        widest = int(ks.max())
        seconds = self.cost.predict_rows(ks, context) + self.cost.predict_draft(int(asked.sum()), widest, context)
        cum = np.cumsum(reach[:, :widest], axis=1)  # [B, widest] expected accepted drafts by width
        tokens = len(ks) + float(cum[asked, ks[asked] - 1].sum())
        return tokens / seconds > plain * (1.0 + self.margin)

    def _explore(self, seqs: list[Sequence], p: np.ndarray, caps: np.ndarray, context: float) -> int:
        """1 where one draft a row would pay if the first-draft acceptance of each row with thin evidence (some
        but fewer than `thin` first drafts tried: a row that has drafted nothing stands on the pool, which the
        load probe and the ended requests priced) were `explore` standard deviations above its estimate, else 0.
        A row at K = 0 learns nothing, so an estimate that one early rejection pulled down (the pool's 0.72 and one
        miss: 0.36) would keep it there until a probe, 16 steps on, and a probe of a draft model that sat idle pays its
        catch-up: on code at 8,192 tokens, where a draft pays from ~0.69, the 0.5B's first draft was rejected and
        `goodput` decoded as K = 0 where fixed K = 2 was 1.13x faster. The same held after a few drafts: on code
        at 2,048 tokens, where one draft pays from ~0.5, the row's first three went miss, miss, hit (0.46 with the
        pool), and 16 steps at K = 0 made `goodput` as slow as plain decoding where fixed K = 1 was 1.16x it
        (results/long_context_pair_s17.json). The bonus shrinks as a row's drafts accumulate; past `thin` a row is
        judged on its estimate alone: a draft that keeps missing stops being tried after its second miss, and a batch
        whose rows are known does not speculate on a bonus."""
        bonus = self._thin_bonus(seqs, p[:, 0], context)  # [B]
        if not bonus.any():
            return 0
        gain = goodput_curve(np.minimum(p[:, 0] + bonus, 1.0)[:, None], np.minimum(caps, 1), self.cost, context)  # [2]
        return int(gain[1] > gain[0] * (1.0 + self.margin))

    def _thin_bonus(self, seqs: list[Sequence], first: np.ndarray, context: float) -> np.ndarray:
        """[B] what `explore` standard deviations add to each row's first-draft estimate first [B], for rows with
        some but fewer than `thin` first drafts tried (0 elsewhere): one standard deviation of the batch's sum,
        shared by its thin rows in proportion to their variance (`_bonus`). A step's tokens are the rows' sum, whose
        spread grows as the root of their number. A deviation for each row (the sum of theirs) had all 8 rows of
        the pair, after one draft each, draft at K = 1 for 4 steps at 2,048 tokens, ~2x a plain step's time each.
        One row: its own standard deviation."""
        if self.explore <= 0:
            return np.zeros(len(seqs))
        if len(seqs) == 1:  # the same sums in Python floats
            return np.array([self._thin_bonus_row(seqs[0], float(first[0]), context)])
        return self._thin_bonus_batch(seqs, first, context)

    def _thin_bonus_batch(self, seqs: list[Sequence], first: np.ndarray, context: float) -> np.ndarray:
        """`_thin_bonus` for any batch, first [B] -> [B]."""
        evidence = np.array([self.acceptance.evidence(s.request_id) for s in seqs])  # [B] drafts tried at 1
        thin = (evidence > 0) & (evidence < self.thin)  # [B] rows whose own few drafts moved their estimate
        var = first * (1 - first) / (evidence + 1.0) * thin  # [B] each thin row's estimate's variance
        if not var.any():
            return np.zeros(len(seqs))
        budget = 0.0 if self.unread is None else self._probe_budget_s(len(seqs), context)  # `_stop_is_final`'s
        final = [bool(v) and self._stop_is_final(s, budget) for s, v in zip(seqs, var, strict=True)]
        return self._bonus(var) * np.where(final, self.final_explore / self.explore, 1.0)  # [B]

    def _thin_bonus_row(self, seq: Sequence, first: float, context: float) -> float:
        """`_thin_bonus` for a batch of one row of first-draft estimate `first`: its own deviation. At batch 1 the
        batch path's small-array calls were ~60-75 us a call in the engine, once or twice a step
        (`test_one_rows_thin_bonus_is_the_batchs`)."""
        evidence = self.acceptance.evidence(seq.request_id)
        var = first * (1 - first) / (evidence + 1.0) if 0 < evidence < self.thin else 0.0
        if not var:
            return 0.0
        bonus = self.explore * var / math.sqrt(var)
        budget = 0.0 if self.unread is None else self._probe_budget_s(1, context)
        return bonus * (self.final_explore / self.explore) if self._stop_is_final(seq, budget) else bonus

    def _reach(self, seqs: list[Sequence], p: np.ndarray, cheap: bool, context: float) -> np.ndarray:
        """[B, k] P(drafts 1..j of each row all accepted) as `choose` prices K from p [B, k]: deeper positions of
        thin evidence judged up (`_deep_optimism`) unless the drafts are cheap (lookups: `truncate` judges them);
        then, for a lookup drafter (`gated`) where each row keeps its own width (`CostModel.packed`), first drafts
        of thin evidence judged up as `truncate` judges them (`_first_judged_up`). Judged at their mean here, a
        lookup gate closed on a few early misses that truncate would have verified, and a closed gate learns from
        probes only: SmolLM2's n-gram at 8 rows of 7,900 tokens, where fixed K = 1 made 1.19x K = 0 (its drafts
        right half the time), sat at K = 0 in every repeat of a run (0.857x,
        results/long_context_smollm2_open_gate_s32.json)."""
        if not cheap:
            return np.cumprod(self._deep_optimism(seqs, p), axis=1)
        if self.cost.packed and self.gated:
            p = self._first_judged_up(seqs, p.copy(), context)
        return np.cumprod(p, axis=1)

    def _first_judged_up(self, seqs: list[Sequence], p: np.ndarray, context: float) -> np.ndarray:
        """p [B, k] with each row's first draft of thin evidence judged `explore` deviations up (`_thin_bonus`),
        in place."""
        p[:, 0] = np.minimum(p[:, 0] + self._thin_bonus(seqs, p[:, 0], context), 1.0)
        return p

    def _deep_optimism(self, seqs: list[Sequence], p: np.ndarray) -> np.ndarray:
        """p [B, k] with each position past the first that a row has tried a few times only (some but fewer than
        `thin` drafts there, forgotten counts) judged `explore` standard deviations up (`_bonus`, per position), as
        `_explore` judges a row's first draft (drafters priced per draft only: a lookup drafter is asked for every
        draft wherever any width pays, and `truncate` judges what it found). A deeper position learns only in steps
        that ask for it, so one miss there held K below it: on dev code at 8,192 tokens one rejected second draft
        put it at 0.50 (the pool's 0.75 and the miss), K = 2 then looked 7% worse than K = 1, and `goodput` asked
        K = 1 for the next 35 steps, recovering only as the miss was forgotten, where second drafts were right ~80%
        of the time and fixed K = 3 decoded 1.11x faster."""
        if self.explore <= 0 or p.shape[1] < 2:
            return p
        if len(seqs) == 1:  # the same sums in Python floats
            row = self._deep_optimism_row(seqs[0].request_id, p[0].tolist())
            return p if row is None else np.array([row])
        return self._deep_optimism_batch(seqs, p)

    def _deep_optimism_batch(self, seqs: list[Sequence], p: np.ndarray) -> np.ndarray:
        """`_deep_optimism` for any batch, p [B, k] with k >= 2."""
        evidence = np.stack([self.acceptance.trials_at(s.request_id, p.shape[1]) for s in seqs])  # [B, k]
        thin = (evidence > 0) & (evidence < self.thin)  # [B, k]
        thin[:, 0] = False  # the first position: `_explore`
        if not thin.any():
            return p
        var = p * (1 - p) / (evidence + 1.0) * thin  # [B, k]
        bonus = np.stack([self._bonus(v) if v.any() else v for v in var.T], axis=1)  # [B, k]
        return np.minimum(p + bonus, P_MAX)

    def _deep_optimism_row(self, request_id: str, p: list[float]) -> list[float] | None:
        """`_deep_optimism` for a batch of one row, p [k] (None: no position is thin, p stands). At batch 1 its dozen
        small-array calls were ~60 us a call in the engine, twice a step (`test_one_rows_optimism_is_the_batchs`)."""
        evidence = self.acceptance.trials_at(request_id, len(p)).tolist()  # [k]
        if not any(0.0 < e < self.thin for e in evidence[1:]):
            return None
        out = [min(p[0], P_MAX)]
        for pj, e in zip(p[1:], evidence[1:], strict=True):
            var = pj * (1 - pj) / (e + 1.0) if 0.0 < e < self.thin else 0.0
            out.append(min(pj + (self.explore * var / math.sqrt(var) if var else 0.0), P_MAX))
        return out

    def _probe_budget_s(self, num_seqs: int, context: float) -> float:
        """Seconds a step earns for probes: probe_budget of a plain step's price."""
        return self.probe_budget * self.cost.predict_verify(num_seqs, 0, context)

    def _stop_is_final(self, seq: Sequence, budget: float) -> bool:
        """Whether a row's draft model, caught up on it now, would never draft again once stopped: each token it
        then falls behind costs more to read than a step earns at probe_budget (`budget`, seconds), so no probe
        affords its backlog (`_probe_affords_reading`) and no request of any length pays for it. Such a stop is
        judged at `final_explore` standard deviations, not `explore`: on the pair at 2,048 tokens (~3 ms to read a
        token against ~1 ms of budget a step), a row whose first two drafts missed (the pool's 0.72 down to 0.24, one
        deviation 0.49, where a draft pays from ~0.5) stopped for good, and `goodput` ran below K = 0 where fixed
        K = 1, right 68% of the time on that row, made 1.06x (results/long_context_pair_b1_s22.json). At two a
        draft that keeps missing stops after ~5 misses: a few of its drafts, once, against a stop for good."""
        if self.unread is None or self.unread(seq) > CAUGHT_UP:
            return False
        return self.reading_s(seq, 1) > budget

    def _bonus(self, var: np.ndarray) -> np.ndarray:
        """var [B] -> [B] each row's share of `explore` standard deviations of the batch's sum."""
        return self.explore * var / np.sqrt(var.sum())

    def _drafting_is_dear(self, stats: StepStats) -> bool:
        return self._dear(len(stats.seqs), stats.mean_context_len)

    def _dear(self, num_seqs: int, context: float) -> bool:
        """A draft is priced at over `cheap_draft` of a plain step: then its price can hold K at 0."""
        return self.cost.predict_draft(num_seqs, 1, context) > self.cheap_draft * self.cost.predict_verify(
            num_seqs, 0, context
        )

    def _drafting_is_cheap(self, num_seqs: int, k_max: int, context: float) -> bool:
        """Drafting K_max rather than 1 for every row costs under `cheap_draft` of a plain step (learned from
        propose times; a draft model starts here too, until its first steps have shown what drafting costs).

        Only the extra positions count: a lookup drafter (n-gram, suffix) pays its per-row cost whatever K, so
        a lookup that costs 5% of a step is no reason to ask it for fewer drafts. Counting the whole cost made
        `goodput` ask the suffix drafter for K from its rows' acceptance histories (~2 drafts) once its
        lookups of three histories crossed 5% of a step, and its chains lost a quarter of their accepted
        tokens (τ 1.81 fixed against 1.68)."""
        extra = self.cost.predict_draft(num_seqs, k_max, context) - self.cost.predict_draft(num_seqs, 1, context)
        return extra < self.cheap_draft * self.cost.predict_verify(num_seqs, 0, context)

    def _with_hysteresis(self, gain: np.ndarray, k_max: int) -> int:
        """The batch K: the best of gain [k_max + 1], moved to only for a gain above `margin` over the K in force.
        For a drafter that stops when unsure (`draft_stop_below`), K is a cap on drafts its own confidence cuts
        short, and moving it costs nothing: each step takes the widest K within `tie_margin` of the best, so that
        where the model cannot tell them apart the drafter's confidence in each draft, which no row's history
        knows, decides where a chain ends. Holding K, `goodput` sat at K = 1 at 8,192 tokens on the dev code replay
        where K = 3 was predicted 1.008x it and measured 1.043x; the widest within the 3% hold instead took K_max
        where a shallower K was best (results/goodput_replay_{code,prose}_s26.json: this rule)."""
        best = int(np.argmax(gain))
        if self.draft_stop_below > 0.0 and best > 0:
            self.k_batch = int(np.flatnonzero(gain >= gain[best] / (1.0 + self.tie_margin))[-1])
            return self.k_batch
        current = best if self.k_batch is None else min(self.k_batch, k_max)
        if gain[best] > gain[current] * (1.0 + self.margin):
            current = best
        self.k_batch = current
        return current

    def _probe(self, seqs: list[Sequence], ks: list[int], caps: list[int], context: float) -> list[int]:
        """Give drafts back to rows that have been silent for a while, so a recovery is noticed.

        Where the batch already drafts, a silent row is probed at its width: the verify is padded to it anyway,
        so that costs only the row's drafting. For a dear drafter (a draft model) that is not little: the row first
        catches up on every token since it last drafted. So one such row joins a step, not every silent one at
        once: on the pair at 2,048 tokens and batch 8, a probe's follow-up draft let the 7 other rows join it (18
        tokens each to read), and their few drafts then had the whole batch explore at K = 1 the step after."""
        ks = self._follow_up(seqs, ks, caps)
        width = max(ks)
        riders = len(seqs)  # silent rows that may join a step that drafts anyway
        widen: bool | None = None  # whether a widening probe is due this step: asked once, where a row could take it
        if width and self._dear(len(seqs), context):
            # none joins a follow-up: its catch-up would keep that step from pricing a draft (`observe`: not steady)
            riders = 0 if self.following else self.probe_riders
        for i, s in enumerate(seqs):
            if ks[i] or caps[i] == 0 or self.idle.get(s.request_id, 0) < self.probe_every:
                continue
            if width:  # the batch is padded to `width` anyway: probing this row costs its drafting
                if not riders:
                    continue
                ks[i] = min(width, caps[i])
                riders -= 1
            else:  # widening the batch costs every row: one probe a step, depth 1
                if widen is None:
                    widen = self._widening_due(len(seqs), max(caps), context)
                if not widen:
                    continue
                ks[i], widen = 1, False
                self.since_probe = 0
                self.widening.add(s.request_id)
                self.probe_extra_s = 0.0
            self.idle[s.request_id] = 0
            self.acceptance.soften(s.request_id, self.probe_keep)
            self.step_estimates = None
            self.probing.add(s.request_id)
        return ks

    def _widening_due(self, num_seqs: int, k_max: int, context: float) -> bool:
        """Whether the steps since the last widening probe have earned one (`probe_interval`, and what padding the
        batch costs: `_widening_spacing`) and it may be given (`_may_widen`)."""
        if self.since_probe < self.probe_interval:  # the spacing is never shorter: not due, whatever it is
            return False
        spacing = max(self.probe_interval, self._widening_spacing(num_seqs, context))
        return self.since_probe >= spacing and self._may_widen(num_seqs, k_max, context)

    def _may_widen(self, num_seqs: int, k_max: int, context: float) -> bool:
        """Whether a widening probe may be given: only where one row could pay (`_alone_could_pay`). Until a
        drafting step has priced drafts, the price may be a busy machine's, and probes are how it is learned: one
        row's drafts are then judged at 1 / SEED_DOUBT of it. Probing whatever the price, 8 rows at 8,192 tokens on
        the pair (dev code, 2026-11-29: a row's drafts could not pay there at 2.5x below their seeded price) spent
        4.5% of a 64-token run on one probe and its follow-up (349 and 119 ms against 92 a plain step)."""
        doubt = 1.0 if self.cost.draft_measured else 1.0 / SEED_DOUBT
        return self._alone_could_pay(num_seqs, k_max, context, doubt)

    def _alone_could_pay(self, num_seqs: int, k_max: int, context: float, draft_scale: float = 1.0) -> bool:
        """Whether one row's drafts could pay in this batch even if every one were accepted (P_MAX each), at some
        K <= k_max: a widening probe gives one row a draft, and where not even that could pay, what it learns
        changes nothing. On the pair at 8 rows of 2,048 tokens (one row's draft ~11 ms and a verified token ~8
        more, against ~16 ms a token of a plain step) the probes only spent their budget: `goodput` 0.968x K = 0,
        five repeats of 5 (results/long_context_pair_b8_s22.json). At batch 1 the row is the batch: wherever a
        draft could pay at all, it probes as before. draft_scale: the drafts' price is taken at this share of the
        cost model's (`_may_widen`)."""
        plain = self._plain_rate(num_seqs, context)
        ks = np.arange(1, k_max + 1)  # [k_max]
        drafting = draft_scale * self.cost.predict_draft_many(1, ks, context)  # [k_max]
        seconds = self.cost.predict_one_row(num_seqs, ks, context) + drafting
        tokens = num_seqs + np.cumsum(P_MAX**ks)  # [k_max] every draft accepted
        return bool(np.any(tokens / seconds > plain * (1.0 + self.widen_margin)))

    def _widening_spacing(self, num_seqs: int, context: float) -> int:
        """Steps since the last widening probe that pay, at probe_budget, for what one row's draft costs the
        target's verify. Where the verify is padded to its widest row (an accelerator; the CPU before it ran real
        tokens alone), at batch 8 one row's probe verified 16 tokens, not 8 (the pair at 2,048 tokens: 107 ms a
        plain step, ~200 with the probe; ~30 steps of the budget, where the first probe came at step 16, before
        `_price_probe` had measured one); packed (`CostModel.packed`), it costs its own token. Only the target's
        price counts: every step corrects it, where drafting's is seeded at load and may be wrong (a busy
        machine's), so the probe itself prices that. At batch 1 a second token costs a few percent of a step, and
        probes keep `probe_every`."""
        plain = self.cost.predict_verify(num_seqs, 0, context)
        one_draft = np.zeros(num_seqs, dtype=int)  # [B] one row's draft
        one_draft[0] = 1
        extra = self.cost.predict_rows(one_draft, context) - plain
        return math.ceil(max(extra, 0.0) / max(self.probe_budget * plain, 1e-9))

    def _follow_up(self, seqs: list[Sequence], ks: list[int], caps: list[int]) -> list[int]:
        """One draft for each row a widening probe gave one in the step before (`observe`: where drafts are dear).

        A probe's drafting is never a steady price: the draft model first caught up on every token since it last
        drafted. If the price seeded at load was timed on a busy machine (the 0.5B at 30 ms a draft, not 12),
        K = 0 then looked right forever: rows at K = 0 only ever drafted in probes, so no step priced a draft
        again (the replay, results/goodput_replay.json: 0.68x the best fixed K at 256 tokens). The step after a
        probe drafts once more, with nothing to catch up on, and prices drafting (`observe`); where the draft is
        right often, that step also pays for itself."""
        follow, self.follow_up = self.follow_up, set()
        for i, s in enumerate(seqs):
            if s.request_id in follow and caps[i] > 0 and ks[i] == 0:
                ks[i] = 1
                self.probing.add(s.request_id)
                self.following |= max(ks) == 1 and sum(ks) == 1  # it alone widens the batch
        return ks

    def truncate(self, seqs: list[Sequence], proposal: Proposal) -> Proposal:
        """The verify width that maximises expected tokens per second given the drafts that exist.

        Drafting is already paid, so it does not change with the width, but it is part of the step the tokens are
        made in: each width's rate is its expected tokens over the drafts' price and its verify's. Over the verify
        alone, a verify from 4 to 5 tokens on the pair at 2,048 tokens (+4 ms of ~41) looked too dear for a 4th
        draft right ~0.4 of the time, where the step's ~88 ms made it pay: in the engine on the eval text `goodput`
        drafted K = 4's drafts and verified fixed K = 3's (41.3 ms of drafting a step, fixed:3 35.5 for the same
        verified drafts). The cut depends on draft counts and past
        outcomes only, never on the target, so verification stays lossless.
        """
        probing, self.probing = self.probing, set()
        counts = proposal.num_tokens.tolist()  # [B] drafts each row actually has
        self.made = {s.request_id: made for s, made in zip(seqs, counts, strict=True) if s.request_id in self.asked}
        self.would_go_on = self._would_go_on(seqs, proposal)
        widest = max(counts, default=0)
        # Trees by their confidences, and chains whose drafter says its confidences can set the width. Only
        # deterministic ones (q one-hot): a sampled chain's width would depend on the drafts drawn, and a draft
        # kept for what was drawn after it is no longer a sample of q, which rejection sampling needs.
        by_confidence = proposal.parents is not None or (proposal.confidence_sets_width and proposal.probs is None)
        self.tree_mode |= proposal.parents is not None
        self.confidence_mode |= by_confidence
        if widest == 0:
            return proposal
        if proposal.confidence is not None and by_confidence:
            return self._truncate_by_confidence(seqs, proposal, np.array(counts))
        context = mean_context(seqs)
        p = self._held_estimates(seqs, self._verify_estimates(seqs, widest, context))  # [B, widest]
        drafts = np.array(counts)  # [B]
        # seconds this step's drafting took, as priced (a held row's lookup: none)
        modelled = any(c for s, c in zip(seqs, counts, strict=True) if s.request_id not in self.held)
        paid = self.cost.predict_draft(len(seqs), widest, context) if modelled else 0.0
        if self.cost.packed:
            width = self._packed_widths(np.cumprod(p, axis=1), drafts, context, paid)
        else:
            width = self._one_width(np.cumprod(p, axis=1), drafts, context, paid)
        if np.array_equal(width, drafts):
            return proposal
        keep = [max(int(w), 1 if s.request_id in probing else 0) for s, w in zip(seqs, width, strict=True)]
        num = proposal.num_tokens
        return proposal.truncated(torch.tensor(keep, dtype=num.dtype, device=num.device))

    def _verify_estimates(self, seqs: list[Sequence], widest: int, context: float) -> np.ndarray:
        """[B, widest] the acceptance estimates `truncate` keeps drafts on.

        Where the target runs each row's own tokens, each row is kept on its own estimate, so one whose first drafts
        missed would never be verified again, nor learn otherwise (SmolLM2, n-gram, 8 rows at 7,900 tokens: half the
        rows missed their first draft, sat at 0.25 and were cut for good, where their drafts were right half the
        time): rows of thin evidence are judged `explore` deviations up, as `_explore` judges K = 1. Where drafts
        are dear, deeper positions of thin evidence are judged up as `choose` judged them when it asked for them
        (`_deep_optimism`). Judged at their mean here, a deep draft asked for on that optimism was cut once made,
        never verified, and its evidence stayed thin, so `choose` kept asking for it: on the pair at 16,384 tokens
        goodput asked 3.54 drafts a step and verified 1.68 where fixed K = 3 verified all 1.81 its drafter made,
        each cut draft a ~20 ms forward paid for nothing (0.899x the best fixed K,
        results/long_context_pair_16k_s31.json)."""
        p = self._estimates(seqs, widest, context)  # [B, widest]
        if self.cost.packed:
            p = self._first_judged_up(seqs, p, context)
        if not self._drafting_is_cheap(len(seqs), widest, context):
            p = self._deep_optimism(seqs, p)
        return p

    def _held_estimates(self, seqs: list[Sequence], p: np.ndarray) -> np.ndarray:
        """p [B, widest] with each held row's estimates (`_hold`) from its lookup drafts' own history
        (`lookup_acceptance`), the first judged `explore` deviations up while that history is thin, as
        `_first_judged_up` judges a model's: the model's history says nothing of what a lookup finds. In place."""
        if not self.held:
            return p
        for i, s in enumerate(seqs):
            if s.request_id in self.held:
                q = self.lookup_acceptance.estimate(s.request_id, p.shape[1])  # [widest]
                tried = self.lookup_acceptance.evidence(s.request_id)
                if self.explore > 0 and 0 < tried < self.thin:
                    q[0] = min(q[0] + self.explore * math.sqrt(q[0] * (1.0 - q[0]) / (tried + 1.0)), 1.0)
                p[i] = q
        return p

    def _would_go_on(self, seqs: list[Sequence], proposal: Proposal) -> dict[str, bool]:
        """For each row that made every draft it was asked for, whether a drafter that stops when unsure would have
        gone on past the last: its confidence is at least the stop (control/continuation.py: the position past K
        is otherwise never observed). Empty for a drafter without a stop."""
        if self.draft_stop_below <= 0.0 or proposal.confidence is None:
            return {}
        out = {}
        for b, s in enumerate(seqs):
            made = self.made.get(s.request_id, 0)
            if made and made == self.asked.get(s.request_id):
                out[s.request_id] = float(proposal.confidence[b, made - 1]) >= self.draft_stop_below
        return out

    def _one_width(self, reach: np.ndarray, drafts: np.ndarray, context: float, paid: float = 0.0) -> np.ndarray:
        """Where the verify is padded to its widest row: one width w for the batch (each row keeps min(its
        drafts, w)), the w maximising expected tokens per second of the step (paid: its drafting's seconds).
        reach [B, widest] P(drafts 1..j accepted), drafts [B] -> [B] the drafts each row keeps."""
        tokens = expected_tokens(reach, drafts).sum(0)  # [widest + 1]
        widths = range(reach.shape[1] + 1)
        seconds = paid + np.array([self.cost.predict_rows(np.minimum(drafts, w), context) for w in widths])
        goodput = tokens / np.maximum(seconds, 1e-9)  # [widest + 1]
        width = int(np.argmax(goodput))
        if goodput[width] < goodput[0] * (1.0 + self.widen_margin):  # within the model's error: not a gain
            width = 0
        return np.minimum(drafts, width)

    def _packed_widths(self, reach: np.ndarray, drafts: np.ndarray, context: float, paid: float = 0.0) -> np.ndarray:
        """Where the target computes each row's own tokens (`CostModel.packed`): each row its own width. A verify
        then costs its total tokens, whichever rows they are in, so the best n drafts to verify are the n likeliest
        accepted (P(drafts 1..j of row i accepted), non-increasing along a row: taking them in that order keeps
        every row a prefix of its chain), and n is the one that maximises expected tokens per second. One width for
        every row, as a padded verify needs, cut SmolLM2's n-gram rows at 7,900 tokens and batch 8 to the width
        the batch's average row could pay for. reach [B, widest], drafts [B] -> [B] the drafts each row keeps."""
        if reach.shape[0] == 1:  # the same choice in Python floats: a row's drafts go in chain order
            return np.array([self._one_row_width(reach[0].tolist(), int(drafts[0]), context, paid)])
        return self._packed_widths_batch(reach, drafts, context, paid)

    def _one_row_width(self, reach: list[float], drafts: int, context: float, paid: float) -> int:
        """`_packed_widths` for a batch of one row: reach [widest] P(drafts 1..j accepted), non-increasing, so the
        n likeliest drafts are its first n. At batch 1 numpy's dozen small-array calls cost ~50 us a step in the
        engine, a step of SmolLM2 being ~6-8 ms (`test_one_rows_width_is_the_batch_width`)."""
        prices = self.cost.predict_tokens_list(1, list(range(1, drafts + 2)), context)  # [drafts + 1] verifying n
        tokens, rates = 1.0, []
        for n, price in enumerate(prices):
            tokens += reach[n - 1] if n else 0.0
            rates.append(tokens / max(paid + price, 1e-9))
        best = max(range(len(rates)), key=rates.__getitem__)  # the first of equal maxima, as np.argmax
        return best if rates[best] >= rates[0] * (1.0 + self.widen_margin) else 0

    def _packed_widths_batch(self, reach: np.ndarray, drafts: np.ndarray, context: float, paid: float) -> np.ndarray:
        """`_packed_widths` for any batch."""
        num_seqs, widest = reach.shape
        made = np.where(np.arange(widest)[None] < drafts[:, None], reach, -1.0)  # [B, widest] -1: no such draft
        order = np.argsort(-made, axis=None, kind="stable")[: int(drafts.sum())]  # [n] row-major: ties keep prefixes
        tokens = num_seqs + np.concatenate([[0.0], np.cumsum(made.flat[order])])  # [n + 1] verifying the first m
        seconds = paid + self.cost.predict_tokens_many(num_seqs, num_seqs + np.arange(len(order) + 1), context)  # [n+1]
        goodput = tokens / np.maximum(seconds, 1e-9)  # [n + 1]
        best = int(np.argmax(goodput))
        if goodput[best] < goodput[0] * (1.0 + self.widen_margin):  # within the model's error: not a gain
            best = 0
        return np.bincount(order[:best] // widest, minlength=num_seqs)

    def _truncate_by_confidence(self, seqs: list[Sequence], proposal: Proposal, counts: np.ndarray) -> Proposal:
        """The width from the drafter's own confidences, calibrated per depth (control/tree_budget.py).

        A chain is the tree whose node j hangs under node j - 1: its path probabilities are the running products
        of its per-draft confidences. They know what the per-request acceptance history cannot: a suffix or
        n-gram continuation seen 40 times in 40 is worth verifying deep, one seen once in three is not."""
        context = mean_context(seqs)
        conf = proposal.confidence.float().cpu().numpy()  # [B, n]
        if proposal.parents is None:
            conf = np.cumprod(conf, axis=1)  # [B, n] P(drafts 1..j all right), by the drafter's account
            depth = np.broadcast_to(np.arange(1, conf.shape[1] + 1), conf.shape)  # [B, n]
        else:
            depth = tree_layout(proposal.parents, proposal.num_tokens)[0][:, 1:].cpu().numpy()  # [B, n]
        width = tree_width(conf, depth, counts, self.tree_calibration, self.cost, context)
        self.tree_idle = 0 if width else self.tree_idle + 1
        if width == 0 and self.tree_idle >= self.probe_every:  # keep the calibration honest: verify one node
            width, self.tree_idle = 1, 0
        self.tree_verified = {
            s.request_id: (conf[b, : min(width, c)], depth[b, : min(width, c)])
            for b, (s, c) in enumerate(zip(seqs, counts.tolist(), strict=True))
        }
        num = proposal.num_tokens
        return proposal.truncated(torch.full_like(num, width))

    def observe(self, stats: StepStats) -> None:
        # A step prices drafting only if every row that drafted in it drafted in the step before: a draft model
        # that sat idle first catches up on every token since (a request's first drafts: its whole prompt), and
        # charged to drafting that made the 0.5B's drafts cost 35 ms each against ~8, and goodput stayed at
        # K = 0. What a catch-up costs is the probe's price (_price_probe), paid once, not per drafted token.
        self.step_estimates = None
        held, self.held = self.held, set()  # rows whose drafts were the lookup's alone: not the model's (`_hold`)
        model_proposed = [0 if s.request_id in held else n for s, n in zip(stats.seqs, stats.num_proposed, strict=True)]
        drafting = {s.request_id for s, proposed in zip(stats.seqs, model_proposed, strict=True) if proposed}
        if drafting and not self.gate_open:  # drafts past a closed gate: priced before it stands again
            self.gate_key = None
        steady = drafting <= self.drafted_last
        self.drafted_last = drafting
        widening, self.widening = self.widening, set()
        dear = bool(widening) and self._drafting_is_dear(stats)
        self.follow_up = {s.request_id for s in stats.seqs if s.request_id in widening and dear}
        asked, self.asked, made, self.made = self.asked, {}, self.made, {}
        would_go_on, self.would_go_on = self.would_go_on, {}
        for s, proposed, accepted in zip(stats.seqs, stats.num_proposed, stats.num_accepted, strict=True):
            rid = s.request_id
            if rid in held:  # the model idled for it: probes still find it silent
                self.lookup_acceptance.update(rid, proposed, accepted)
                self.idle[rid] = self.idle.get(rid, 0) + 1
                continue
            if rid in made:
                self.continuation.update(asked[rid], min(made[rid], asked[rid]), accepted, would_go_on.get(rid))
            if rid in self.tree_verified and proposed:
                self.tree_calibration.update(*self.tree_verified[rid], accepted)
            self.idle[rid] = 0 if proposed else self.idle.get(rid, 0) + 1
            self.acceptance.update(rid, proposed, accepted, self._sure_of_first(rid, asked, made, would_go_on))
        if held:
            self._record_hold(stats, held, model_proposed, model_asked=bool(asked))
        num_seqs = len(stats.seqs)
        plain = stats.num_verified_tokens <= num_seqs and not stats.prefill_tokens
        self.since_plain = 0 if plain else self.since_plain + 1
        # A step whose forward also cached prompt chunks (fused_prefill) says nothing of a verify's or a probe's
        # price alone: its time is not learned from (a probe in it goes unpriced).
        probed = bool(widening) or self.following  # a widening probe's step or its follow-up's
        self.following = False
        if num_seqs and stats.step_time_s > 0 and not stats.prefill_tokens:
            if probed:
                self._price_probe(stats)
            # Drafting is priced at the drafts made, before `truncate` cut any: they were all paid for. Priced at
            # the drafts verified, a lookup's time was charged to however many of its drafts truncate kept.
            drafted = max(max(model_proposed, default=0), max(made.values(), default=0))
            # Everything but drafting is charged to verification: commit overhead is per step, like its fixed cost.
            rest = stats.step_time_s - stats.propose_time_s
            context, tokens = stats.mean_context_len, stats.num_verified_tokens
            # The draft is priced per row asked (a probe asks one; tree and confidence modes ask every row).
            rows = len(asked) or num_seqs
            self.cost.observe(num_seqs, drafted, context, rest, stats.propose_time_s, steady, tokens, rows)

    def _record_hold(self, stats: StepStats, held: set[str], model_proposed: list[int], model_asked: bool) -> None:
        """What this step's held rows (`_hold`) saved, each accepted draft a plain step's time over its rows, and what
        verifying their drafts cost; their lookups' time is the step's drafting where the model was asked nothing
        (control/hold_ledger.py)."""
        num_seqs, context = len(stats.seqs), stats.mean_context_len
        rows = [i for i, s in enumerate(stats.seqs) if s.request_id in held]
        saved = self.cost.predict_verify(num_seqs, 0, context) / num_seqs * sum(stats.num_accepted[i] for i in rows)
        verify = 0.0
        if any(stats.num_proposed[i] for i in rows):
            with_held = self.cost.predict_rows(np.array(stats.num_proposed), context)
            verify = max(with_held - self.cost.predict_rows(np.array(model_proposed), context), 0.0)
        self.hold_ledger.record(len(rows), saved, verify, None if model_asked else stats.propose_time_s)

    def _sure_of_first(
        self, rid: str, asked: dict[str, int], made: dict[str, int], would_go_on: dict[str, bool]
    ) -> bool | None:
        """Whether a drafter that stops when unsure was sure of the row's first draft this step: sure where it went on
        past it, unsure where it stopped after it though asked for more; asked for one, its confidence says
        (`would_go_on`). None where nothing tells (no stop, no draft made, or no confidence)."""
        if self.draft_stop_below <= 0.0 or made.get(rid, 0) < 1:
            return None
        n = min(made[rid], asked[rid])
        if n >= 2:
            return True
        return False if asked[rid] >= 2 else would_go_on.get(rid)

    def _price_probe(self, stats: StepStats) -> None:
        """Space widening probes so that what the last one cost over plain decoding (its step and its follow-up's,
        less the plain steps their accepted drafts saved) stays within probe_budget."""
        plain = self.cost.predict_verify(len(stats.seqs), 0, stats.mean_context_len)
        extra = stats.step_time_s - plain * (1 + sum(stats.num_accepted) / len(stats.seqs))
        self.probe_extra_s += extra
        spacing = math.ceil(max(self.probe_extra_s, 0.0) / max(self.probe_budget * plain, 1e-9))
        self.probe_interval = max(self.probe_every, spacing)

    def forget(self, seq: Sequence) -> None:
        self.step_estimates = None
        self.gate_key = None  # its counts join the pool, every row's prior: priced again
        self.acceptance.forget(seq.request_id)
        self.lookup_acceptance.forget(seq.request_id)
        self.held.discard(seq.request_id)
        self.tree_verified.pop(seq.request_id, None)
        self.idle.pop(seq.request_id, None)
        self.probing.discard(seq.request_id)
        self.widening.discard(seq.request_id)
        self.follow_up.discard(seq.request_id)
        self.asked.pop(seq.request_id, None)
        self.made.pop(seq.request_id, None)
        self.would_go_on.pop(seq.request_id, None)

    def live_request_ids(self) -> set[str]:
        live = self.acceptance.request_ids() | set(self.tree_verified) | set(self.idle) | self.probing
        live |= self.lookup_acceptance.request_ids() | self.held
        return live | self.widening | self.follow_up | set(self.asked) | set(self.made) | set(self.would_go_on)
