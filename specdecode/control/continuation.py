"""How often a drafter that may stop early goes on to its next draft: P(draft j is made | draft j - 1 was, j <= K).

A draft model with a confidence stop (`--draft-stop-below`) drafts past a draft only if it was confident of it, so
asking K is a cap, not a price: on the Qwen2.5-Coder pair at 2,048 tokens, K = 3 with the stop at 0.7 was the
best fixed arm, 1.11x K = 3 without it, while `goodput`, pricing K as K drafts, asked ~1 a step (0.94x the best,
results/goodput_replay.json). Counted from the drafts each row made against the K it was asked (a row asked
for 3 that made 1 tried position 2 and stopped), pooled over requests and forgotten by `decay` each row-step,
twice: over every row (what drafting costs) and over rows whose draft j - 1 was accepted (what drafts return: a
drafter that stops when unsure goes on after the confident drafts, the ones likelier right).
A drafter without a stop always goes on (every estimate tends to 1), and the prior is that it does. A draft model
measured at load (control/pair_probe.py: its confidence at each token of the probe's text) starts where the probe
saw it go on instead (`seed`; `GoodputController.bind_drafter`).

A row that made every draft it was asked for says nothing, by what it made, of the position past them; but its last
draft's confidence does: the drafter would have gone on exactly where it was at least the stop. Counting only
what rows made kept that position at its prior (always goes on) wherever K was small, so K + 1 was priced as
K + 1 drafts made, looked dear and was never asked: on the pair at 8,192 tokens `goodput` asked ~1.6 a step and
priced K = 5 at 158 ms where it cost ~102 (the drafter went on ~0.6 of the time, not 1), 0.957x the best fixed
K on the dev code replay. So `update` takes that last confidence's verdict (`would_go_on`) where the row has one.
"""

from __future__ import annotations

import numpy as np

from specdecode.config import MAX_SPECULATIVE_TOKENS


class DraftContinuation:
    def __init__(self, decay: float = 0.98, prior_weight: float = 2.0, max_positions: int = MAX_SPECULATIVE_TOKENS):
        self.decay, self.prior_weight = decay, prior_weight
        # [2, max_positions] forgotten counts at position j, of every row that made draft j - 1 (row 0: what
        # drafting costs) and of those whose draft j - 1 was also accepted (row 1: what the drafts return; a
        # confident draft is likelier right, so the drafter goes on more often after an accepted one)
        self.went_on = np.zeros((2, max_positions))
        self.reached = np.zeros((2, max_positions))

    def estimate(self, k: int, after_accepted: bool = False) -> np.ndarray:
        """[k] P(draft j made | draft j - 1 made (after_accepted: and accepted)), j = 1..k; the first draft of a
        row asked for any is always made. Each position leans on the one before (position 2 on 1.0, no stop): a
        position never reached, as the third where K <= 2 was asked, is taken to go on as the second does."""
        row = int(after_accepted)
        go_on = np.ones(k)
        for j in range(1, k):
            prior = self.prior_weight * go_on[j - 1]
            go_on[j] = (self.went_on[row, j] + prior) / (self.reached[row, j] + self.prior_weight)
        return go_on

    def seed(self, go_on: float, go_on_accepted: float, weight: float) -> None:
        """Start every position past the first at these rates (of every row, and after an accepted draft), worth
        `weight` rows that reached it: a load probe's measure of the drafter's stop (`GoodputController.bind_drafter`)
        in place of the prior that it always goes on."""
        self.went_on[:, 1:] = weight * np.array([[go_on], [go_on_accepted]])
        self.reached[:, 1:] = weight

    def update(self, asked: int, made: int, accepted: int, would_go_on: bool | None = None) -> None:
        """A row asked for `asked` drafts made `made` (<= asked) and had `accepted` of them accepted: it went on
        at positions 2..made, stopped at made + 1 if that was asked for; after an accepted draft j - 1 when
        j - 1 <= accepted. would_go_on: where it made all it was asked for, whether its last draft would have let
        it go on (its confidence at least the stop; None: unknown), which counts at position made + 1."""
        told = would_go_on is not None and made == asked and made < self.went_on.shape[1]
        if made < 1 or (asked < 2 and not told):  # nothing to learn (a row still reading its backlog makes none)
            return
        self.went_on *= self.decay
        self.reached *= self.decay
        self.went_on[0, 1:made] += 1.0
        self.reached[0, 1 : min(made + 1, asked)] += 1.0
        self.went_on[1, 1 : min(made, accepted + 1)] += 1.0
        self.reached[1, 1 : min(accepted + 1, asked)] += 1.0
        if told:  # position made + 1, never asked for: what the last draft's confidence says of it
            self.went_on[0, made] += float(would_go_on)
            self.reached[0, made] += 1.0
            if accepted == made:  # ... after an accepted draft
                self.went_on[1, made] += float(would_go_on)
                self.reached[1, made] += 1.0


def width_distribution(go_on: np.ndarray, caps: np.ndarray, k: int) -> np.ndarray:
    """[k + 1] P(the widest row makes n drafts), n = 0..k, for a batch asked for K = k: row i makes up to
    min(k, caps[i]) drafts, going on at each position with go_on[j] ([>= k]), rows independent."""
    return width_distributions(go_on, caps, k)[k]


def width_distributions(go_on: np.ndarray, caps: np.ndarray, k_max: int) -> np.ndarray:
    """[k_max + 1, k_max + 1] row k: `width_distribution(go_on, caps, k)`, zero past n = k; every K at once (the
    controller prices each K of a step: one K at a time cost ~0.1 ms of a step's Python)."""
    made = np.concatenate([[1.0], np.cumprod(go_on[:k_max])])  # [k_max + 1] P(a row asked for k makes >= n)
    ks = np.arange(k_max + 1)  # [k_max + 1] the K asked (rows) and the width n (columns)
    more = made[np.minimum(ks[None, :] + 1, ks[:, None])]  # [k_max + 1, k_max + 1] P(a row makes > n | K = k)
    room = np.minimum(caps[None, :], ks[:, None])  # [k_max + 1, B] what row b may make at K = k
    beyond = np.where(ks[None, None, :] < room[:, :, None], more[:, None, :], 0.0)  # [k + 1, B, n + 1]
    at_most = np.prod(1.0 - beyond, axis=1)  # [k_max + 1, k_max + 1] P(every row makes <= n | K = k)
    return np.diff(np.concatenate([np.zeros((k_max + 1, 1)), at_most], axis=1), axis=1)
