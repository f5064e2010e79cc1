"""Per-request acceptance estimates: P(draft j accepted | drafts 1..j-1 accepted), per draft position j.

Counts are exponentially forgotten (every observation of a request scales all its counts by `decay`), and
each position is shrunk towards a prior with weight `prior_weight`. The prior of position j is the estimate
of position j-1 times `prior_decay` (position 1's is `prior_first`), so a new request starts at
0.5, 0.45, 0.405, ... and what is learned at shallow positions carries to deeper ones that were never tried.
Estimates are clipped to [P_MIN, P_MAX]: no position is ever certain, so nothing gets stuck.

The priors also learn across requests: when a request ends, its counts join a pool (the pool's older counts
scaled by `pool_decay` first), and position j's prior is the pooled estimate, itself shrunk towards the chain
above. A new request then starts where the drafter has lately been on this target (the 0.5B draft of the
Qwen2.5-Coder pair is right ~75% of the time on code: 0.5, 0.45, ... priced its drafts at K = 0, and `goodput`
never tried them long enough to learn otherwise within a request), while its own evidence soon outweighs the
pool's. A request's own steps never feed its prior.
"""

from __future__ import annotations

import numpy as np

from specdecode.config import MAX_SPECULATIVE_TOKENS

P_MIN, P_MAX = 0.02, 0.98


class AcceptanceTracker:
    def __init__(
        self,
        prior_first: float = 0.5,
        prior_decay: float = 0.9,
        prior_weight: float = 1.0,
        decay: float = 0.9,
        max_positions: int = MAX_SPECULATIVE_TOKENS,
        pool_decay: float = 0.7,
        pool_weight: float = 1.0,
    ) -> None:
        self.prior_first, self.prior_decay, self.prior_weight = prior_first, prior_decay, prior_weight
        self.decay = decay
        self.pool_decay, self.pool_weight = pool_decay, pool_weight
        self.pool_hits = np.zeros(max_positions)  # [max_positions] ended requests' acceptances, forgotten per request
        self.pool_trials = np.zeros(max_positions)  # [max_positions] ended requests' drafts tried
        self.max_positions = max_positions
        self.hits: dict[str, np.ndarray] = {}  # [max_positions] forgotten count of acceptances at position j
        self.trials: dict[str, np.ndarray] = {}  # [max_positions] forgotten count of drafts tried at position j
        self.first_totals: dict[str, tuple[float, float]] = {}  # (hits, tries) of first drafts, never forgotten
        # [2, 2] per request: forgotten (hits, tries) of its first drafts the drafter was sure of (row 0: at least its
        # stop) and unsure of (row 1), where the drafter stops when unsure (`update`'s `confident`); and the pool's
        self.by_confidence: dict[str, np.ndarray] = {}
        self.pool_by_confidence = np.zeros((2, 2))

    def estimate(self, request_id: str, k: int) -> np.ndarray:
        """[k] conditional acceptance probability of draft positions 1..k."""
        # In Python floats (the same IEEE doubles as numpy's scalars, without their per-operation cost)
        hits, trials = self.hits.get(request_id), self.trials.get(request_id)
        own = [(0.0, 0.0)] * k if hits is None else list(zip(hits[:k].tolist(), trials[:k].tolist(), strict=True))
        pool = zip(self.pool_hits[:k].tolist(), self.pool_trials[:k].tolist(), strict=True)
        out = []
        chain = self.prior_first
        for (ph, pn), (h, n) in zip(pool, own, strict=True):  # sequential: each prior starts from the previous estimate
            pooled = (ph + self.pool_weight * chain) / (pn + self.pool_weight)
            out.append(min(max((h + self.prior_weight * pooled) / (n + self.prior_weight), P_MIN), P_MAX))
            chain = out[-1] * self.prior_decay
        return np.array(out)

    def update(self, request_id: str, num_proposed: int, num_accepted: int, confident: bool | None = None) -> None:
        """A row with k drafts and a accepted: successes at positions 1..a, a failure at a + 1 if a < k; deeper
        positions were never tried and only forget. confident: whether the drafter was sure of the first draft (its
        confidence at least its stop; None: unknown), which counts it by confidence too (`first_by_confidence`)."""
        if num_proposed <= 0:
            return
        hits = self.hits.setdefault(request_id, np.zeros(self.max_positions))
        trials = self.trials.setdefault(request_id, np.zeros(self.max_positions))
        hits *= self.decay
        trials *= self.decay
        if request_id in self.by_confidence or confident is not None:
            split = self.by_confidence.setdefault(request_id, np.zeros((2, 2)))
            split *= self.decay
            if confident is not None:
                split[int(not confident)] += (float(num_accepted > 0), 1.0)
        hits[:num_accepted] += 1.0
        trials[: min(num_accepted + 1, num_proposed)] += 1.0
        h, n = self.first_totals.get(request_id, (0.0, 0.0))
        self.first_totals[request_id] = (h + (num_accepted > 0), n + 1.0)

    def long_run_first(self, request_id: str) -> float:
        """P(first draft accepted) from all of the request's first drafts, none forgotten, shrunk toward the pool's
        first position as `estimate` is: what a decision that cannot be undone should rest on (goodput.py's stop
        for good), where the forgotten counts follow the last ~10 drafts."""
        h, n = self.first_totals.get(request_id, (0.0, 0.0))
        pooled = (self.pool_hits[0] + self.pool_weight * self.prior_first) / (self.pool_trials[0] + self.pool_weight)
        return min(max((h + self.prior_weight * pooled) / (n + self.prior_weight), P_MIN), P_MAX)

    def first_by_confidence(self, request_id: str) -> np.ndarray:
        """[2] P(first draft accepted) where the drafter was sure of it, and where it was not: the request's own
        counts shrunk toward the pool's, as `estimate` does, each class of the pool toward the pool's first position.
        A drafter that stops when unsure is right far more often where it goes on (the 0.5B: 0.91 against 0.33 on
        the load probe's text), and which of the two a miss was tells the deeper drafts apart (goodput.py)."""
        w, prior = self.pool_weight, self.prior_weight
        first = (float(self.pool_hits[0]) + w * self.prior_first) / (float(self.pool_trials[0]) + w)
        split = self.by_confidence.get(request_id)
        own = [[0.0, 0.0]] * 2 if split is None else split.tolist()  # [2, 2] (hits, tries): sure, unsure
        out = []
        for (ph, pn), (h, n) in zip(self.pool_by_confidence.tolist(), own, strict=True):
            pooled = (ph + w * first) / (pn + w)
            out.append(min(max((h + prior * pooled) / (n + prior), P_MIN), P_MAX))
        return np.array(out)  # [2]

    def seed_by_confidence(self, rates: tuple[float, float], weight: float) -> None:
        """Start the pool's first drafts by confidence (sure, unsure) at `rates`, worth `weight` drafts each."""
        self.pool_by_confidence = weight * np.array([[min(max(r, P_MIN), P_MAX), 1.0] for r in rates])

    def soften(self, request_id: str, keep: float) -> None:
        """Scale a request's evidence by `keep`: before a probe, so that the probe's outcome is not drowned by
        counts from long ago (a request at K = 0 observes nothing, so its counts never age on their own)."""
        if request_id in self.hits:
            self.hits[request_id] *= keep
            self.trials[request_id] *= keep
        if request_id in self.by_confidence:
            self.by_confidence[request_id] *= keep

    def seed_pool(self, acceptance: float, weight: float) -> None:
        """Start the pool at `acceptance` for every position, worth `weight` drafts tried at each (a probe at
        load, control/pair_probe.py): the first requests' prior, until ended requests' counts outweigh it."""
        self.pool_hits[:] = weight * min(max(acceptance, P_MIN), P_MAX)
        self.pool_trials[:] = weight

    def forget(self, request_id: str) -> None:
        """The request ended: its counts join the pool, the next requests' prior."""
        hits, trials = self.hits.pop(request_id, None), self.trials.pop(request_id, None)
        self.first_totals.pop(request_id, None)
        split = self.by_confidence.pop(request_id, None)
        if split is not None:
            self.pool_by_confidence = self.pool_decay * self.pool_by_confidence + split
        if hits is not None and trials is not None:
            self.pool_hits = self.pool_decay * self.pool_hits + hits
            self.pool_trials = self.pool_decay * self.pool_trials + trials

    def evidence(self, request_id: str) -> float:
        """The request's own (forgotten) count of first drafts tried: 0 before it drafts."""
        trials = self.trials.get(request_id)
        return 0.0 if trials is None else float(trials[0])

    def trials_at(self, request_id: str, k: int) -> np.ndarray:
        """[k] the request's own (forgotten) count of drafts tried at positions 1..k: zeros before it drafts."""
        trials = self.trials.get(request_id)
        return np.zeros(k) if trials is None else trials[:k].copy()

    def has_drafted(self, request_id: str) -> bool:
        """Whether the request has had drafts verified (it has counts of its own)."""
        return request_id in self.trials

    def request_ids(self) -> set[str]:
        return set(self.hits) | set(self.trials) | set(self.first_totals) | set(self.by_confidence)
