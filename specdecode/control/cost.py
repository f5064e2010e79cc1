"""Step-time cost model: predicted seconds of one engine step for B rows, speculation length K, context C.

A verify forward of B rows scores N tokens: B * (K + 1) on an accelerator, where it is padded to the widest row
whatever each row's own K is; the sum of the rows' own K + 1 on the CPU, where the target runs the real tokens
alone (`packed`, models/llama.packs_rows):

    t_verify = a + b * B + c * N + sum_k h_k * max(0, N - n_k) + d * N * C / 1000 + r * B * C / 1000
    t_draft  = e * K + f * B * K + g * B * [K > 0] + s * B * K * C / 1000
                                     (g: a lookup per row whatever K, as n-gram's; s: a draft model's attention)

a is the fixed launch/overhead, b per row, c per token while the weights' reading dominates, h_k the extra per
token past each knee n_k in KNEES (a weight-streaming GEMM is flat for a few rows, then turns compute-bound:
on the 2-core CPU measured here 1, 2 and 3 tokens cost 21-23 ms and each token past ~4 adds ~4 ms, a bend no
straight line fits), d the attention's work per query and r its reading of each row's cached keys: each row
reads its own cache once whatever its tokens, so 8 rows of one token at context 2048 cost 67.5 ms where one
row of 9 tokens cost 38.0 (results/cost_attention.json), and without r the fit missed the former by 22%.
Coefficients are fitted by non-negative least squares (a negative per-token cost would reward padding;
non-negative hinges also keep the curve convex). An online multiplicative correction (EWMA of measured /
predicted verify time) heals a profile measured on a busier or quieter machine; factors by the number of tokens a
verify computes past one a row (`extra_scales`) heal their price, which a level alone cannot: on the
Qwen2.5-Coder 1.5B the load-time fit (at 64 and 512 cached tokens) priced a second token +5.7 ms at 2,048 where it
cost +1.5-4.7 and a third +5.7 where it cost ~+9 (results/cost_pair_contexts_s23.json, results/goodput_replay_*),
and one level fitted to drafting steps priced a plain step low by as much: a draft looked to pay from 0.56
acceptance where it paid from ~0.4. The draft coefficients are
learned online from measured propose times; a draft price seeded at load (seed_draft) keeps its shape, and takes
its level from the median measured / seeded price of the first SEED_CHECKS drafting steps (a load on a busy
machine priced the 0.5B's drafts at 2.5x). The per-row term matters: an n-gram lookup costs the same for
K = 1 and K = 8, and without g a fit through K = 1-3 steps charges it per position and calls K = 8 expensive.
So does the context term: each token a draft model drafts reads its row's whole cache (s; capped at a windowed
draft's window, `draft_context_cap`). The Qwen2.5-Coder 0.5B's one-token step is 10.9 ms after the load probe's
86 tokens and 21.9 ms after 8,192 (results/goodput_draft_context.json): priced at the first alone, as it was,
a draft at 8,192 tokens looked half its cost.
A profile is JSON: coefficients plus the fingerprint (model, device, dtype, torch) it was measured for.
"""

from __future__ import annotations

import functools
import itertools
import json
import statistics
import warnings
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from specdecode.models.ragged import verify_tokens

PROFILE_VERSION = 3  # 2: the hinge terms; 3: the per-row cache read
KNEES = (4, 16, 64)  # tokens per forward past which a hinge term adds its own per-token cost
VERIFY_TERMS = (
    "intercept",
    "per_seq",
    "per_token",
    *(f"per_token_past_{n}" for n in KNEES),
    "per_token_kctx",
    "per_seq_kctx",
)
DRAFT_TERMS = ("per_position", "per_row_position", "per_row", "per_row_position_kctx")
MIN_SAMPLES = 4
TIE = 1e-12  # objectives closer than this (relative) are a tie in `nnls_gram`
SEED_CHECKS = 5  # drafting steps whose measured times set the seeded draft price's level
EXTRA_WINDOW = 16  # the last plain verifies, and those of each extra width, that set `extra_scales`
EXTRA_WIDTHS = 8  # tokens past one a row told apart (more share the last factor)
EXTRA_PRIOR = 1.0  # pseudo-verifies at the calibrated price that the factor of all widths is shrunk toward
WIDTH_PRIOR = 2.0  # pseudo-verifies at the factor of all widths that each width's own is shrunk toward
EXTRA_RANGE = (0.05, 10.0)  # the factors' bounds
FEW_PRICES = 16  # prices asked at once that are computed one at a time in Python floats (`_verify_parts_one`)


class ProfileError(ValueError):
    """A calibration profile that can't be read or was measured for another model, device or dtype."""


def verify_features(num_seqs: float, num_tokens: float | np.ndarray, context: float) -> np.ndarray:
    """[..., len(VERIFY_TERMS)] the regressors of t_verify (see the module docstring), for each of num_tokens [...]."""
    t = np.asarray(num_tokens, dtype=float)[..., None]  # [..., 1]
    out = t * np.array([0.0, 0.0, 1.0, *[0.0] * len(KNEES), context / 1000.0, 0.0])  # [..., F] the per-token terms
    out[..., 0], out[..., 1], out[..., -1] = 1.0, num_seqs, num_seqs * context / 1000.0
    out[..., 3 : 3 + len(KNEES)] = np.maximum(t - np.array(KNEES, dtype=float), 0.0)
    return out


def draft_features(num_seqs: float, k: float | np.ndarray, context: float = 0.0) -> np.ndarray:
    """[..., len(DRAFT_TERMS)] the regressors of t_draft for each K of k [...] (nothing is drafted, nor paid for,
    at K = 0)."""
    k = np.asarray(k, dtype=float)[..., None]  # [..., 1]
    out = k * np.array([1.0, num_seqs, 0.0, num_seqs * context / 1000.0])  # [..., D] the terms linear in K
    out[..., 2] = num_seqs * (k[..., 0] > 0)
    return out


def draft_row(num_seqs: float, k: int, context: float = 0.0) -> list[float]:
    """`draft_features` of one K in Python floats (the same IEEE products, term for term): a drafting step learns
    from one row of regressors, and numpy's small-array calls, after a forward has left the caches cold, cost more
    than the arithmetic."""
    kf = float(k)
    return [kf * 1.0, kf * num_seqs, float(num_seqs * (k > 0)), kf * (num_seqs * context / 1000.0)]


def decayed_sums(decay: float, xtx: list[list[float]], xty: list[float], x: list[float], y: float) -> tuple:
    """(decay * xtx + outer(x, x), decay * xty + x * y) in Python floats: numpy's elementwise products and sums, in
    the same order, without its per-call cost (the online draft regression's update, once a drafting step)."""
    outer = [[decay * a + xi * xj for a, xj in zip(row, x, strict=True)] for row, xi in zip(xtx, x, strict=True)]
    return outer, [decay * a + xi * y for a, xi in zip(xty, x, strict=True)]


def nnls_gram(gram: np.ndarray, xty: np.ndarray) -> np.ndarray:
    """min ||x w - y|| subject to w >= 0, given gram = x^T x [F, F] and xty = x^T y [F] -> w [F].

    The optimum is the unconstrained optimum on its own active set, so the best feasible solution over every
    subset of columns is exact (where several tie within rounding, the first of the fewest columns); for the 2-7
    features used here that is at most 127 tiny solves, and no scipy. They run as one stacked pseudo-inverse
    (`_subset_solves`): one at a time, a refit of the draft's price took ~1 ms of Python, on each of a request's
    first drafting steps.
    """
    masks = _subset_masks(len(xty))  # [S, F] in order of size, then of columns
    w = _subset_solves(gram, xty, masks)  # [S, F]
    obj = np.einsum("sf,fg,sg->s", w, gram, w) - 2.0 * (w @ xty)  # [S] ||xw - y||^2 - ||y||^2
    feasible = np.all(w >= 0, axis=1)  # [S]
    # Ties within rounding (a feature that copies another: per_position and per_row_position at batch 1) go to
    # the first subset, the fewest columns: a later one must beat the best by more than rounding.
    tie = TIE * float(np.max(np.abs(obj), initial=0.0))
    best, best_obj = np.zeros(len(xty)), 0.0  # the objective is 0 at w = 0
    for s in np.flatnonzero(feasible):  # in enumeration order
        if obj[s] < best_obj - tie:
            best, best_obj = w[s], float(obj[s])
    return best


@functools.cache
def _subset_masks(num_features: int) -> np.ndarray:
    """[2^F - 1, F] bool: every non-empty subset of the features, by size, then in combinations' order."""
    subsets = [c for r in range(1, num_features + 1) for c in itertools.combinations(range(num_features), r)]
    masks = np.zeros((len(subsets), num_features), dtype=bool)
    for s, cols in enumerate(subsets):
        masks[s, list(cols)] = True
    return masks


def _subset_solves(gram: np.ndarray, xty: np.ndarray, masks: np.ndarray) -> np.ndarray:
    """[S, F] pinv(gram[sub, sub]) @ xty[sub] for each subset masks[s] [F], zero off the subset. Each subset's
    block is padded to [F, F] with its largest diagonal entry on the diagonal outside it: the pseudo-inverse of a
    block-diagonal matrix is its blocks', and the pad changes neither the largest singular value (the cut-off
    of pinv's relative tolerance) nor, lying on no cut singular value, which are cut."""
    inside = masks[:, :, None] & masks[:, None, :]  # [S, F, F]
    blocks = np.where(inside, gram[None], 0.0)  # [S, F, F]
    pad = np.max(np.where(masks, np.diagonal(gram)[None], 0.0), axis=1)  # [S]
    blocks += np.where(masks, 0.0, pad[:, None])[:, :, None] * np.eye(len(xty))[None]  # [S, F, F]
    w = np.linalg.pinv(blocks) @ np.where(masks, xty[None], 0.0)[:, :, None]  # [S, F, 1]
    return np.where(masks, w[:, :, 0], 0.0)


def _extra_width(num_tokens, num_seqs: int):
    """[...] the tokens past one a row of a verify of num_tokens [...] tokens over num_seqs rows, capped at
    EXTRA_WIDTHS: the index of its factor in `CostModel.extra_scales` (an int for an int: np.clip on a scalar
    took ~15 us, a step asks dozens of prices)."""
    if isinstance(num_tokens, (int, np.integer)):
        return min(max(int(num_tokens) - num_seqs, 0), EXTRA_WIDTHS)
    return np.minimum(np.maximum(np.asarray(num_tokens, dtype=int) - num_seqs, 0), EXTRA_WIDTHS)


def _verify_tokens(coef: list[float], kctx: float, n: int) -> float:
    """What n tokens add to a verify's calibrated price, in Python floats: coef [len(VERIFY_TERMS)] (its per-token
    terms), kctx the cached tokens / 1000. The hinges summed left to right from 0, as `sum` adds them."""
    (k0, k1, k2), (h0, h1, h2) = KNEES, coef[3:-2]
    hinges = 0 + h0 * max(n - k0, 0) + h1 * max(n - k1, 0) + h2 * max(n - k2, 0)
    return coef[2] * n + hinges + coef[-2] * (n * kctx)


def weighted_median(values: list[float], weights: list[float]) -> float:
    """The value at which the weights of the values below it and above it each reach half (the lower where
    they meet exactly)."""
    order = sorted(range(len(values)), key=values.__getitem__)
    half, total = sum(weights) / 2.0, 0.0
    for i in order:
        total += weights[i]
        if total >= half:
            return values[i]
    return values[order[-1]]


def nnls(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares: x [num_samples, F], y [num_samples] -> w [F]."""
    return nnls_gram(x.T @ x, x.T @ y)


@dataclass
class CostModel:
    verify_coef: np.ndarray  # [len(VERIFY_TERMS)] seconds per VERIFY_TERMS
    draft_coef: np.ndarray = field(default_factory=lambda: np.zeros(len(DRAFT_TERMS)))  # seconds per DRAFT_TERMS
    fingerprint: dict = field(default_factory=dict)  # what the profile was measured on; {} = a prior
    correction_alpha: float = 0.1  # EWMA weight of one measured step in the correction
    draft_decay: float = 0.95  # forgetting factor of the online draft-cost regression
    # The draft coefficients are refit on the 1st, 2nd, 4th, ... drafting step up to `draft_refit_every`, then on
    # every `draft_refit_every`-th (and on each that moves the seed's level: `_check_seed`): a refit (NNLS over every
    # subset of the terms) took ~0.3 ms, 1.5% of a 20 ms step, and ~0.35 ms in the engine (its caches cold after the
    # forward), where SmolLM2's step is ~7 ms; refit on each of the first 8, it was ~0.6% of a 64-token request's time.
    draft_refit_every: int = 8
    _draft_seen: int = 0  # drafting steps observed
    correction: float = 1.0  # measured / predicted verify time, smoothed
    # [EXTRA_WIDTHS + 1] measured / calibrated price of a verify's n tokens past one a row (n = 1..; entry 0
    # unused), at the level `correction` sets (`_observe_extra`)
    _extra_scales: np.ndarray = field(default_factory=lambda: np.ones(EXTRA_WIDTHS + 1))
    # Widths (0: the plain level) observed since `extra_scales` was last refit: it is refit when next read
    # (`extra_scales`), so that steps priced by nobody (goodput holding a gate: `_gate_holds`) refit nothing.
    _extra_pending: set[int] = field(default_factory=set)
    _plain_levels: list[float] = field(default_factory=list)  # [EXTRA_WINDOW] measured / priced plain verifies
    # extra width n -> [EXTRA_WINDOW] (plain price, price of its n tokens past one a row, measured seconds)
    _extra_steps: dict[int, list[tuple[float, float, float]]] = field(default_factory=dict)
    _extra_level: float = 0.0  # the plain level _extra_fits were computed at
    # width -> (its steps' ratios at that level, their weights (price^2), their weighted median)
    _extra_fits: dict[int, tuple[list[float], list[float], float]] = field(default_factory=dict)
    # ((rows, context, coefficients), kctx, a verify's fixed price, a plain step's tokens' price) of the last
    # `_verify_parts_list` call
    _parts_memo: tuple | None = field(default=None, repr=False, compare=False)
    # Cached tokens a draft model's step reads at most (its window and sink, drafters/draft_window.py; 0: all):
    # the draft's attention stops growing there.
    draft_context_cap: int = 0
    # The target computes each row's own tokens, not the batch padded to its widest row (models/llama.packs_rows):
    # a verify then costs the rows' draft counts summed (`predict_rows`).
    packed: bool = False
    # The online regression's sums, in Python floats (`decayed_sums`): [D, D] decayed X^T X and [D] decayed X^T y
    _draft_xtx: list[list[float]] = field(default_factory=lambda: [[0.0] * len(DRAFT_TERMS) for _ in DRAFT_TERMS])
    _draft_xty: list[float] = field(default_factory=lambda: [0.0] * len(DRAFT_TERMS))
    # The seed (seed_draft) apart: its pseudo-steps decay with the real ones, and its times are scaled by
    # seed_level, the median of measured / seeded price over the first SEED_CHECKS drafting steps (see observe).
    _seed_xtx: list[list[float]] = field(default_factory=lambda: [[0.0] * len(DRAFT_TERMS) for _ in DRAFT_TERMS])
    _seed_xty: list[float] = field(default_factory=lambda: [0.0] * len(DRAFT_TERMS))  # at the seeded times
    _seed_coef: np.ndarray = field(default_factory=lambda: np.zeros(len(DRAFT_TERMS)))  # [D] the seed's own fit
    _seed_ratios: list[float] = field(default_factory=list)  # measured / seeded price of the first drafting steps
    seed_level: float = 1.0

    @property
    def extra_scales(self) -> np.ndarray:
        """[EXTRA_WIDTHS + 1] the widths' factors (`_refit_extra`), refit first for the verifies observed since."""
        if self._extra_pending:
            self._refit_extra(self._extra_pending)
            self._extra_pending = set()
        return self._extra_scales

    @extra_scales.setter
    def extra_scales(self, scales: np.ndarray) -> None:
        self._extra_scales, self._extra_pending = scales, set()

    # ---- fitting and prediction -----------------------------------------------------------------------
    @classmethod
    def linear(
        cls, intercept: float, per_seq: float, per_token: float, per_token_kctx: float, per_seq_kctx: float = 0.0
    ) -> CostModel:
        """A model without bends: every token costs the same (a hand-written prior or a test's ground truth)."""
        return cls(np.array([intercept, per_seq, per_token, *[0.0] * len(KNEES), per_token_kctx, per_seq_kctx]))

    @classmethod
    def fit(cls, samples: list[tuple[float, float, float, float]], fingerprint: dict | None = None) -> CostModel:
        """Fit t_verify from (num_seqs B, padded tokens N, mean context C, seconds) samples."""
        if len(samples) < MIN_SAMPLES:  # fewer than terms is fine: NNLS then takes the smallest coefficients
            raise ValueError(f"need at least {MIN_SAMPLES} samples to fit the cost model, got {len(samples)}")
        x = np.stack([verify_features(b, n, c) for b, n, c, _ in samples])  # [num_samples, len(VERIFY_TERMS)]
        y = np.array([t for *_, t in samples])  # [num_samples]
        # Relative error matters (a 1 ms miss on a 20 ms step is as bad as 5 ms on 100 ms): weight rows by 1/t.
        w = 1.0 / np.maximum(y, 1e-9)
        return cls(nnls(x * w[:, None], y * w), fingerprint=dict(fingerprint or {}))

    def predict_verify(self, num_seqs: int, k: int, context: float) -> float:
        """Seconds of a verify of K drafts on every row."""
        return self.predict_tokens(num_seqs, num_seqs * (k + 1), context)

    def predict_tokens(self, num_seqs: int, num_tokens: int, context: float) -> float:
        """Seconds of a verify forward of num_tokens tokens over num_seqs rows."""
        return self.predict_tokens_list(num_seqs, [int(num_tokens)], context)[0]

    def predict_tokens_list(self, num_seqs: int, num_tokens: list[int], context: float) -> list[float]:
        """`predict_tokens` for each of num_tokens, in Python floats, what they share (the coefficients, a plain
        step's price, the factors) looked up once: a one-row truncate asks up to K_max + 1 of them each step."""
        scales = self.extra_scales.tolist()  # [EXTRA_WIDTHS + 1] (refit first where verifies were observed since)
        parts = self._verify_parts_list(num_seqs, num_tokens, context)
        return [
            self.correction * (base + scales[_extra_width(n, num_seqs)] * extra)
            for n, (base, extra) in zip(num_tokens, parts, strict=True)
        ]

    def predict_tokens_many(self, num_seqs: int, num_tokens: np.ndarray, context: float) -> np.ndarray:
        """[N] `predict_tokens` for each of num_tokens [N] (a few in Python floats: `_verify_parts_list`)."""
        if np.size(num_tokens) <= FEW_PRICES:
            return np.array(self.predict_tokens_list(num_seqs, np.asarray(num_tokens).tolist(), context))
        return self.correction * self._verify_price(num_seqs, num_tokens, context)

    def _verify_parts(self, num_seqs: int, num_tokens, context: float) -> tuple[float, np.ndarray]:
        """The calibrated price of one token a row (a plain step), and what num_tokens [...] add to it ([...])."""
        tokens = np.asarray(num_tokens, dtype=float)
        prices = verify_features(num_seqs, np.concatenate([[num_seqs], tokens.ravel()]), context) @ self.verify_coef
        return float(prices[0]), prices[1:].reshape(tokens.shape) - prices[0]

    def _verify_parts_one(self, num_seqs: int, num_tokens: int, context: float) -> tuple[float, float]:
        """`_verify_parts` for one verify, in Python floats: a step asks a few dozen single prices, and each through
        numpy's small-array calls cost ~20 us in the engine, where the forward before it has left the caches cold
        (experiments/goodput_overhead.py --cold)."""
        return self._verify_parts_list(num_seqs, [num_tokens], context)[0]

    def _verify_parts_list(self, num_seqs: int, num_tokens: list[int], context: float) -> list[tuple[float, float]]:
        """`_verify_parts_one` for each of num_tokens. What they share (the coefficients, a plain step's price) is
        kept from the last call at the same rows, context and coefficients: a step asks a dozen prices there."""
        coef = self.verify_coef.tolist()
        key = (num_seqs, context, coef)
        if self._parts_memo is None or self._parts_memo[0] != key:
            kctx = context / 1000.0
            row = coef[0] + coef[1] * num_seqs + coef[-1] * (num_seqs * context / 1000.0)  # what any verify costs
            self._parts_memo = (key, kctx, row, _verify_tokens(coef, kctx, num_seqs))
        _, kctx, row, base = self._parts_memo
        return [(row + base, _verify_tokens(coef, kctx, n) - base) for n in num_tokens]

    def _verify_price(self, num_seqs: int, num_tokens, context: float) -> np.ndarray:
        """[...] a verify's price before `correction`: a plain step's, plus the tokens past one a row at their
        width's factor (`extra_scales`) of their calibrated price."""
        base, extra = self._verify_parts(num_seqs, num_tokens, context)
        return base + self.extra_scales[_extra_width(num_tokens, num_seqs)] * extra

    def predict_one_row(self, num_seqs: int, ks: np.ndarray, context: float) -> np.ndarray:
        """[N] seconds of a verify of num_seqs rows, one of which has ks[n] drafts and the others none."""
        tokens = [verify_tokens([k] + [0] * (num_seqs - 1), k, self.packed) for k in ks.tolist()]
        return self.predict_tokens_many(num_seqs, np.array(tokens), context)

    def predict_rows(self, drafts: np.ndarray, context: float) -> float:
        """Seconds of a verify of drafts[i] drafts on row i ([B]): their own tokens where the target runs only
        real ones (`packed`), else every row padded to the widest."""
        tokens = verify_tokens(drafts.tolist(), int(drafts.max(initial=0)), self.packed)
        return self.predict_tokens(len(drafts), tokens, context)

    @property
    def plain_measured(self) -> bool:
        """Whether a plain verify (one token a row) has been observed: without one, `correction` is the wider verifies'
        level alone, and a plain step's price is the calibration's shape at that level (`_observe_extra`)."""
        return bool(self._plain_levels)

    @property
    def draft_measured(self) -> bool:
        """Whether a steady drafting step has been learned from (a price seeded at load alone may be a busy
        machine's)."""
        return self._draft_seen > 0

    def draft_context(self, context: float) -> float:
        """What a drafted token's attention reads of `context` cached tokens."""
        return min(context, self.draft_context_cap) if self.draft_context_cap > 0 else context

    def predict_draft(self, num_seqs: int, k: int, context: float = 0.0) -> float:
        """Seconds of drafting k tokens for each of num_seqs rows (`draft_features` @ draft_coef, in Python floats
        as `_verify_parts_one`)."""
        e, f, g, s = self.draft_coef.tolist()
        kctx = num_seqs * self.draft_context(context) / 1000.0
        return e * k + f * (k * num_seqs) + g * (num_seqs if k > 0 else 0) + s * (k * kctx)

    def predict(self, num_seqs: int, k: int, context: float) -> float:
        """Seconds of a step that drafts K tokens per row and verifies the padded [B, K + 1] block."""
        return self.predict_verify(num_seqs, k, context) + self.predict_draft(num_seqs, k, context)

    def predict_many(self, num_seqs: int, ks: np.ndarray, context: float) -> np.ndarray:
        """[N] `predict` for each K of ks [N]."""
        verify = self.predict_tokens_many(num_seqs, num_seqs * (ks + 1), context)  # [N]
        return verify + self.predict_draft_many(num_seqs, ks, context)

    def predict_draft_many(self, num_seqs: int, ks: np.ndarray, context: float = 0.0) -> np.ndarray:
        """[N] `predict_draft` for each K of ks [N] (a few one at a time, as `predict_tokens_many`)."""
        if np.size(ks) <= FEW_PRICES:
            return np.array([self.predict_draft(num_seqs, k, context) for k in np.asarray(ks).tolist()])
        return draft_features(num_seqs, ks, self.draft_context(context)) @ self.draft_coef

    def seed_draft(
        self, seconds_per_draft: float, weight: float = 4.0, context: float = 0.0, num_seqs: int = 1
    ) -> None:
        """Price a draft step of `num_seqs` rows at `seconds_per_draft` a drafted token after `context` cached
        tokens (a steady draft step timed at load) before any drafting step is seen: `weight` pseudo-steps of
        K = 1 and of K = 4 join the online regression, so the first real steps refine the price instead of
        replacing it. Seeded at two contexts, the fit prices the draft's attention (per_row_position_kctx) from
        their difference; at two batch sizes, what a row adds to a step (per_row_position) apart from what a step
        costs whatever its rows (per_position: at batch 1 alone the two cannot be told apart)."""
        seed_xtx, seed_xty = np.array(self._seed_xtx), np.array(self._seed_xty)  # [D, D], [D]
        for k in (1, 4):
            x = draft_features(num_seqs, k, self.draft_context(context))  # [D]
            seed_xtx = seed_xtx + weight * np.outer(x, x)
            seed_xty = seed_xty + weight * x * seconds_per_draft * k
        self._seed_xtx, self._seed_xty = seed_xtx.tolist(), seed_xty.tolist()
        self._seed_coef = nnls_gram(seed_xtx, seed_xty)
        self._refit_draft()

    def _refit_draft(self) -> None:
        xtx = np.array(self._draft_xtx) + np.array(self._seed_xtx)  # [D, D]
        self.draft_coef = nnls_gram(xtx, np.array(self._draft_xty) + self.seed_level * np.array(self._seed_xty))

    def _check_seed(self, x: list[float], propose_s: float) -> bool:
        """Set the seed's level from a drafting step's measured time x -> propose_s, for the first SEED_CHECKS
        such steps; True if it changed. The seed is timed once at load, and a machine busy then (another process
        loading beside it: the 0.5B priced at 30 ms a draft, not 12) priced drafts at 2.5x: `goodput` chose K = 0
        and, at 8 pseudo-steps against one real step per probe, would have needed ~8 probes' steady steps to
        learn otherwise. The level takes the seed's price to what steps measure, and keeps its shape (the
        attention's price from its two contexts); the median lets no one stalled step set it."""
        if len(self._seed_ratios) >= SEED_CHECKS or propose_s <= 0:
            return False
        predicted = float(x @ self._seed_coef)
        if predicted <= 0:
            return False
        self._seed_ratios.append(min(max(propose_s / predicted, 0.1), 10.0))
        # numpy's median, in Python (the middle one, or the mean of the middle two): np.median took ~0.3 ms a call in
        # the engine, on each of a request's first drafting steps
        self.seed_level = float(statistics.median(self._seed_ratios))
        return True

    # ---- online updates -------------------------------------------------------------------------------
    def observe(
        self,
        num_seqs: int,
        k: int,
        context: float,
        verify_s: float,
        propose_s: float,
        learn_draft: bool = True,
        num_tokens: int | None = None,
        draft_rows: int | None = None,
    ) -> None:
        """One measured step of K drafts a row (the widest row's) whose verify computed num_tokens tokens (None:
        every row's K + 1): heal the verify prediction and (learn_draft) learn the draft cost, of draft_rows rows
        asked to draft (None: every row; a probe in a batch of 8 asks one, and its 15 ms priced as 8 rows' drafts
        once set the whole draft price at 0.43x)."""
        tokens = num_seqs * (k + 1) if num_tokens is None else num_tokens
        base, extra = self._verify_parts_one(num_seqs, tokens, context)
        width = _extra_width(tokens, num_seqs)
        predicted = base + (float(self.extra_scales[width]) * extra if extra else 0.0)  # a plain one needs no refit
        if predicted > 0 and verify_s > 0:
            self._observe_extra(base, float(extra), verify_s, width)
            ratio = min(max(verify_s / predicted, 0.1), 10.0)  # one stalled step can't wreck the model
            self.correction += self.correction_alpha * (ratio - self.correction)
        if learn_draft and k > 0 and propose_s >= 0:
            rows = num_seqs if draft_rows is None else draft_rows
            x = draft_row(rows, k, self.draft_context(context))  # [D]
            checked = self._check_seed(x, propose_s)
            d = self.draft_decay
            self._draft_xtx, self._draft_xty = decayed_sums(d, self._draft_xtx, self._draft_xty, x, propose_s)
            self._seed_xtx = [[d * a for a in row] for row in self._seed_xtx]
            self._seed_xty = [d * a for a in self._seed_xty]
            self._draft_seen += 1
            seen = self._draft_seen
            first = seen <= self.draft_refit_every and seen & (seen - 1) == 0  # the 1st, 2nd, 4th, 8th: a power of 2
            if checked or first or seen % self.draft_refit_every == 0:
                self._refit_draft()

    def _observe_extra(self, base: float, extra: float, verify_s: float, width: int) -> None:
        """Learn `extra_scales` from a verify of verify_s seconds priced base (a plain step) + extra (its `width`
        tokens past one a row) before any correction. A plain verify gives the level, verify_s / base; a wider
        one, what its extra tokens cost at that level: (verify_s / level - base) / extra, a ratio to their price.
        Each from the last EXTRA_WINDOW verifies of its kind (plain, or each width), and medians: the kinds come
        in stretches (`goodput` drafts, then stops), so each keeps its own, and a stalled step moves a median by
        one place where it would have set a mean. Nothing is learned before both kinds are seen: a level still
        healing (1.0 where steps took 1.2x) set the ratio at 5x its truth, since the extra tokens are ~10% of a
        step and the level's error lands on them whole."""
        if base <= 0 or verify_s <= 0:
            return
        if extra <= 0 or width == 0:
            self._plain_levels = [*self._plain_levels[-(EXTRA_WINDOW - 1) :], verify_s / base]
        else:
            seen = self._extra_steps.get(width, [])
            self._extra_steps[width] = [*seen[-(EXTRA_WINDOW - 1) :], (base, extra, verify_s)]
        if self._plain_levels and self._extra_steps:
            self._extra_pending.add(width)

    def _refit_extra(self, widths: set[int]) -> None:
        """`extra_scales` from the windows, after verifies of `widths` extra tokens (0: a plain one). The ratios of
        all widths (weighted by their price squared: a wider verify's ratio is less noisy) make one factor, shrunk
        toward 1 by EXTRA_PRIOR pseudo-verifies; each width's own weighted median is shrunk toward that by
        WIDTH_PRIOR, and a width never seen takes it. One factor for every width fitted the pair's cheap second
        token (~0.6 of its price) and underpriced the third and fourth (~0.85): the curve bends there. A width's
        ratios are recomputed only when the level or its own window moved."""
        level = statistics.median(self._plain_levels)
        if level == self._extra_level and widths <= {0} and self._extra_fits.keys() == self._extra_steps.keys():
            return  # only plain verifies since, the level where it was: nothing the factors rest on moved
        if level != self._extra_level:  # every width's ratios are at the level: all again
            self._extra_level, self._extra_fits = level, {}
        for w, steps in self._extra_steps.items():
            if w in widths or w not in self._extra_fits:
                ratios, weights = [(y / level - b) / e for b, e, y in steps], [e * e for _, e, _ in steps]
                self._extra_fits[w] = (ratios, weights, weighted_median(ratios, weights))
        fits = self._extra_fits.values()
        n = sum(len(ratios) for ratios, _, _ in fits)
        pooled = weighted_median([r for rs, _, _ in fits for r in rs], [x for _, ws, _ in fits for x in ws])
        pooled = (n * pooled + EXTRA_PRIOR) / (n + EXTRA_PRIOR)
        scales = np.full(EXTRA_WIDTHS + 1, pooled)
        for w, (rs, _, median) in self._extra_fits.items():
            scales[w] = (len(rs) * median + WIDTH_PRIOR * pooled) / (len(rs) + WIDTH_PRIOR)
        self._extra_scales = np.clip(scales, *EXTRA_RANGE)

    # ---- profiles -------------------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {
            "version": PROFILE_VERSION,
            "verify": dict(zip(VERIFY_TERMS, map(float, self.verify_coef), strict=True)),
            "draft": dict(zip(DRAFT_TERMS, map(float, self.draft_coef), strict=True)),
            "fingerprint": self.fingerprint,
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
        }

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=2))
        tmp.replace(path)  # atomic: a concurrent reader never sees half a profile
        return path

    @classmethod
    def load(cls, path: str | Path, expect: dict | None = None) -> CostModel:
        """Strict load: ProfileError if unreadable, malformed, or measured for a different fingerprint."""
        try:
            data = json.loads(Path(path).read_text())
            if data.get("version") != PROFILE_VERSION:
                raise ProfileError(f"{path}: profile version {data.get('version')!r}, expected {PROFILE_VERSION}")
            verify = np.array([float(data["verify"][t]) for t in VERIFY_TERMS])
            draft = np.array([float(data.get("draft", {}).get(t, 0.0)) for t in DRAFT_TERMS])
            fingerprint = dict(data.get("fingerprint", {}))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            if isinstance(e, ProfileError):
                raise
            raise ProfileError(f"{path}: unreadable calibration profile ({type(e).__name__}: {e})") from None
        if not (np.all(np.isfinite(verify)) and np.all(verify >= 0) and np.all(draft >= 0)):
            raise ProfileError(f"{path}: coefficients must be finite and non-negative")
        if expect is not None and fingerprint != expect:
            diff = sorted(k for k in set(fingerprint) | set(expect) if fingerprint.get(k) != expect.get(k))
            raise ProfileError(f"{path}: profile was measured for another setup (differs in {', '.join(diff)})")
        return cls(verify, draft, fingerprint)


def default_cost_model() -> CostModel:
    """An uncalibrated prior: the fit to a ~135M model's compiled step on two CPU cores (results/cost_attention.json,
    2026-11-24): ~25 ms for 1-5 tokens at batch 1, ~0.6 ms per token past 4 and ~1.2 past 16 (9 tokens ~29 ms,
    8 rows of 9 ~115 ms); attention ~0.6 ms per token and ~1.8 ms per row per 1000 cached tokens. The fit puts
    no cost on a token before the first knee; the prior puts 0.1 ms, so that a draft nobody expects to be
    accepted is never free. The engine replaces it by a probe at load (control/calibrate.py)."""
    coef = dict.fromkeys(VERIFY_TERMS, 0.0)
    coef.update(
        intercept=24.0e-3,
        per_seq=0.2e-3,
        per_token=0.1e-3,
        per_token_past_4=0.5e-3,
        per_token_past_16=0.6e-3,
        per_token_kctx=0.6e-3,
        per_seq_kctx=1.8e-3,
    )
    return CostModel(np.array([coef[t] for t in VERIFY_TERMS]))


def load_or_default(path: str | Path, expect: dict | None = None) -> CostModel:
    """The profile at `path` if present and valid for `expect`; otherwise a warning (if one was there) and
    the default prior. Never raises: a bad profile must not stop serving."""
    if not Path(path).exists():
        return default_cost_model()
    try:
        return CostModel.load(path, expect)
    except ProfileError as e:
        warnings.warn(f"ignoring calibration profile, using the default cost model: {e}", stacklevel=2)
        return default_cost_model()
