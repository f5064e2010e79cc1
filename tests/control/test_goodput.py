"""The goodput controller on synthetic traces: acceptance falling and recovering, a compute-bound target,
hysteresis on a noisy stationary trace, per-row trimming and the cost of probing.

choose() decides K when drafting costs something (a draft model), hence cheap_draft=0 in those traces; with
free drafts (n-gram) it asks for K_max and truncate() decides, tested at the end."""

from __future__ import annotations

import numpy as np
import pytest

from specdecode.config import SamplingParams
from specdecode.control import cost as cost_module
from specdecode.control import goodput
from specdecode.control.acceptance import AcceptanceTracker
from specdecode.control.base import StepStats
from specdecode.control.cost import CostModel
from specdecode.control.goodput import GoodputController, expected_tokens
from specdecode.step.sequence import Sequence

K_MAX = 8


def compute_bound() -> CostModel:
    """A target whose every token costs 10x the step's fixed part."""
    return CostModel.linear(1e-3, 0.0, 10e-3, 0.0)


def step_cost() -> CostModel:
    """The traces' step, a fresh model each time (controllers update theirs): every token adds 2.4 ms to ~22
    ms. Fixed here rather than the prior, so the traces do not move when the prior does."""
    return CostModel.linear(20.1e-3, 1.5e-3, 2.4e-3, 0.3e-3)


def make_seqs(n: int) -> list[Sequence]:
    return [Sequence(f"r{i}", [1, 2, 3], SamplingParams(max_tokens=100_000), max_len=200_000) for i in range(n)]


def run(
    ctrl: GoodputController,
    seqs: list[Sequence],
    accept_p: list[float],
    steps: int,
    seed: int = 0,
    truth: CostModel | None = None,
) -> list[list[int]]:
    """Each row accepts each draft with its own probability until the first rejection; the step takes what
    `truth` (a fresh `step_cost()` unless given: the controllers' own model) predicts, so only acceptance is
    being learned."""
    rng = np.random.default_rng(seed)
    truth = truth or step_cost()
    history = []
    for _ in range(steps):
        ks = ctrl.choose(seqs, K_MAX)
        accepted = [int(np.argmin(np.append(rng.random(k) < p, False))) for k, p in zip(ks, accept_p, strict=True)]
        width = max(ks)
        seconds = truth.predict(len(seqs), width, 3)
        ctrl.observe(StepStats(seqs, ks, accepted, seconds, len(seqs) * (width + 1), 3.0, 0.0, seconds))
        history.append(ks)
    return history


def test_expected_tokens_table():
    reach = np.array([[0.5, 0.25, 0.1], [0.9, 0.8, 0.7]])  # P(drafts 1..j accepted)
    out = expected_tokens(reach, np.array([3, 1]))
    np.testing.assert_allclose(out, [[1, 1.5, 1.75, 1.85], [1, 1.9, 1.9, 1.9]])  # row 2 is capped at K = 1


def test_k_falls_when_acceptance_drops():
    ctrl = GoodputController(cost=step_cost(), cheap_draft=0.0)
    seqs = make_seqs(1)
    good = run(ctrl, seqs, [0.95], 60)
    assert good[-1][0] >= 5
    bad = run(ctrl, seqs, [0.05], 60)
    assert max(k[0] for k in bad[-20:]) <= 1


def test_compute_bound_target_turns_speculation_off():
    seqs = make_seqs(4)
    bound = run(GoodputController(cost=compute_bound(), cheap_draft=0.0), seqs, [0.9] * 4, 200, truth=compute_bound())
    cheap = run(GoodputController(cost=step_cost(), cheap_draft=0.0), make_seqs(4), [0.9] * 4, 200)
    assert max(max(ks) for ks in cheap[-50:]) >= 4  # control: the same acceptance with cheap tokens speculates
    steps_speculating = sum(max(ks) > 0 for ks in bound[50:])
    assert steps_speculating <= 150 / 16 + 1  # only bounded probes remain
    assert all(ks.count(0) >= 3 for ks in bound[50:])  # a probe touches one row at a time


def test_recovers_within_bounded_steps():
    ctrl = GoodputController(cost=step_cost(), cheap_draft=0.0, probe_every=16)
    seqs = make_seqs(1)
    dead = run(ctrl, seqs, [0.0], 100)
    assert dead[-1] == [0]
    recovering = run(ctrl, seqs, [0.95], 60)
    first = next(i for i, ks in enumerate(recovering) if ks[0] >= 4)
    assert first <= 16 + 20  # one probe period, then a few steps of evidence


def probe_trace(make_cost, steps: int, extra_s: float, **kwargs) -> tuple[int, float, int]:
    """A hopeless row (every draft rejected) whose probes each cost extra_s of drafting over the step (a draft
    model catching up on every token since it last drafted; a drafting step right after another costs 1 ms a
    draft), steps timed by make_cost() (the controller gets a model of its own). Returns the probes (drafting
    steps after a step without drafts), the share of all time their catching up cost, and the longest run of
    steps without drafts."""
    # No plain step (`_plain_probe_due`): the trace charges any drafting step after a silent one a probe's catch-up,
    # where after one plain step the draft reads a token
    kwargs.setdefault("plain_doubt", 0.0)
    truth, ctrl = make_cost(), GoodputController(cost=make_cost(), cheap_draft=0.0, **kwargs)
    seqs, probes, total, drafted, silent, longest = make_seqs(1), 0, 0.0, False, 0, 0
    for _ in range(steps):
        ks = ctrl.choose(seqs, K_MAX)
        probe = max(ks) > 0 and not drafted
        propose = extra_s if probe else 1e-3 * max(ks)
        seconds = truth.predict(1, max(ks), 3) + propose
        ctrl.observe(StepStats(seqs, ks, [0], seconds, max(ks) + 1, 3.0, propose, seconds - propose))
        probes, total, drafted = probes + probe, total + seconds, max(ks) > 0
        silent = 0 if drafted else silent + 1
        longest = max(longest, silent)
    return probes, probes * extra_s / total, longest


def test_probes_that_cost_much_are_spaced_within_the_probe_budget():
    """A probe costing 20 plain steps (the 0.5B draft fed 17 idle tokens) is repeated only as often as keeps all
    probes within 3% of the time (the first one, priced once it ran, adds ~2% here); probes costing little
    keep the `probe_every` rhythm: the row is never silent longer than that (after a probe it may draft a few
    steps more, at 1 ms a draft, before its rejections outweigh the probe's softened estimate). The control, no
    budget, probes every 16 steps and loses about half the time."""
    plain = step_cost().predict(1, 0, 3)
    probes, share, _ = probe_trace(step_cost, 1000, 20 * plain)
    assert probes <= 3 and share <= 0.06
    cheap, _, longest = probe_trace(step_cost, 1000, 0.0)
    assert longest <= 16 and cheap >= 1000 // (16 + 8)
    probes, share, _ = probe_trace(step_cost, 1000, 20 * plain, probe_budget=float("inf"))
    assert probes >= 1000 // (16 + 8) and share > 0.4


def count_switches(history: list[list[int]]) -> int:
    widths = [max(ks) for ks in history]
    return sum(a != b for a, b in zip(widths, widths[1:], strict=False))


def test_hysteresis_keeps_k_steady_on_a_noisy_stationary_trace():
    switches = {}
    for margin in (0.03, 0.0):
        ctrl = GoodputController(cost=step_cost(), cheap_draft=0.0, margin=margin)
        switches[margin] = count_switches(run(ctrl, make_seqs(1), [0.7], 400, seed=3)[50:])
    assert switches[0.03] <= 20  # a few in 350 steps
    assert switches[0.0] > switches[0.03]  # control: without the margin the same trace does oscillate


def test_hopeless_row_is_trimmed_while_the_batch_speculates():
    ctrl = GoodputController(cost=step_cost(), cheap_draft=0.0)
    history = run(ctrl, make_seqs(2), [0.95, 0.0], 100)
    good, hopeless = zip(*history[-32:], strict=True)
    assert min(good) >= 4
    assert sum(k > 0 for k in hopeless) <= 5  # zero except for probes (free here: the batch is padded anyway)


def test_forget_drops_the_request_and_its_history_becomes_the_prior():
    ctrl = GoodputController(cost=step_cost(), cheap_draft=0.0)
    seqs = make_seqs(1)
    run(ctrl, seqs, [0.0], 50)
    ctrl.forget(seqs[0])
    ctrl.k_batch = None
    assert seqs[0].request_id not in ctrl.acceptance.request_ids()
    assert ctrl.choose(seqs, K_MAX)[0] == 0  # the pool: this drafter's drafts were all rejected lately
    ctrl.acceptance.pool_hits[:] = 0.0  # without that history ...
    ctrl.acceptance.pool_trials[:] = 0.0
    ctrl.k_batch = None
    assert ctrl.choose(seqs, K_MAX)[0] > 0  # ... back to the fixed prior


def test_a_request_after_good_ones_speculates_from_its_first_step():
    """The 0.5B draft's case: drafts that pay only once acceptance is known to be high. A fresh controller starts
    a request at K = 0 (0.5, 0.45, ... do not pay for a costly draft); after requests that accepted 90%, the next
    one speculates at once."""
    costly = CostModel.linear(20.1e-3, 1.5e-3, 2.4e-3, 0.3e-3)
    costly.draft_coef[:] = [10e-3, 0.0, 0.0, 0.0]  # a draft model: 10 ms a drafted token, half a plain step
    ctrl = GoodputController(cost=costly, cheap_draft=0.0)
    first = make_seqs(1)[0]
    assert ctrl.choose([first], K_MAX)[0] == 0
    rng = np.random.default_rng(0)
    for i in range(3):
        seqs = [Sequence(f"done{i}", [1, 2, 3], SamplingParams(max_tokens=100_000), max_len=200_000)]
        for _ in range(30):
            ctrl.acceptance.update(seqs[0].request_id, 4, int(np.argmin(np.append(rng.random(4) < 0.9, False))))
        ctrl.forget(seqs[0])
    ctrl.k_batch = None
    assert ctrl.choose(make_seqs(1), K_MAX)[0] >= 2


def drafting_steps(hits: list[bool], explore: float = 1.0, thin: float = 6.0) -> list[int]:
    """A row on a step where one draft pays only above 0.5 acceptance (60 ms plain, 70 ms to verify two tokens,
    20 ms a draft: a long context), the pool at 0.75, whose i-th draft (the i-th step that drafts) is accepted
    as hits[i] says (a second draft in a step is always rejected): whether it drafted, step by step."""
    ctrl = GoodputController(cost=CostModel.linear(50e-3, 0.0, 10e-3, 0.0), cheap_draft=0.0, explore=explore, thin=thin)
    ctrl.cost.seed_draft(20e-3)
    ctrl.acceptance.seed_pool(0.75, 8.0)
    seqs, asked, outcomes = make_seqs(1), [], iter(hits)
    for _ in range(len(hits)):
        ks = ctrl.choose(seqs, K_MAX)
        accepted = int(next(outcomes)) if ks[0] else 0
        seconds = ctrl.cost.predict(1, ks[0], 3)
        ctrl.observe(StepStats(seqs, ks, [accepted], seconds, ks[0] + 1, 3.0, 20e-3 * ks[0], seconds - 20e-3 * ks[0]))
        asked.append(min(ks[0], 1))
    return asked


def test_one_early_miss_does_not_stop_a_draft_that_pays_and_misses_keep_stopping_it():
    """The pool says 0.75, the first draft misses (0.375 now, below the 0.5 a draft needs): with thin evidence
    the row drafts once more; a second miss stops it, and it stays stopped. Control: no exploration, the first
    miss stops it (until a probe)."""
    assert drafting_steps([False] * 10) == [1, 1] + [0] * 8
    assert drafting_steps([False] * 10, explore=0.0) == [1] + [0] * 9


def test_a_good_draft_with_an_unlucky_start_keeps_drafting():
    """A draft right 80% of the time whose early drafts go miss, hit, miss (0.45 with the pool, below the 0.5 a
    draft needs here): its few drafts say little, so it drafts on and its later hits carry it. Measured on the
    pair at 2,048 tokens (goodput.py `_explore`): judged on its estimate after its first ~3 drafts, the row sat
    at K = 0 until a probe 16 steps on. Control: exploration only for a row's first ~3 drafts (thin = 2, as
    before) stops it after its third draft."""
    hits = [False, True, False] + [True, True, True, True, False] * 3

    def drafting_share(thin: float) -> float:
        return sum(drafting_steps(hits, thin=thin)) / len(hits)

    assert drafting_share(6.0) >= 0.8
    assert drafting_share(2.0) <= 0.25


def pair_drafting_steps(hits: list[bool], final_explore: float) -> list[int]:
    """`drafting_steps` for a draft model priced at load as the pair's (20 ms a draft, 10 ms to read a token it
    fell behind: more than the 1.8 ms a step the probe budget earns) whose backlog is the steps since it last
    drafted: whether it drafted, step by step."""
    # No plain steps (`_plain_probe_due`): a step costs what the model prices, and the trace counts drafting steps.
    cost = CostModel.linear(50e-3, 0.0, 10e-3, 0.0)
    ctrl = GoodputController(cost=cost, final_explore=final_explore, plain_doubt=0.0)
    ctrl.seed_pair(0.75, 20e-3, draft_read_s=10e-3)
    backlog = {"r0": 0}
    ctrl.unread = lambda seq: backlog[seq.request_id]
    seqs, asked, outcomes = make_seqs(1), [], iter(hits)
    for _ in range(len(hits)):
        ks = ctrl.choose(seqs, K_MAX)
        k = min(ks[0], 1)  # one draft a step: the second is always rejected
        accepted = int(next(outcomes)) if k else 0
        backlog["r0"] = accepted + 1 if k else backlog["r0"] + 1
        seconds = ctrl.cost.predict(1, k, 3)
        ctrl.observe(StepStats(seqs, [k], [accepted], seconds, k + 1, 3.0, 20e-3 * k, seconds - 20e-3 * k))
        asked.append(k)
    return asked


def test_a_draft_model_that_would_stop_for_good_is_stopped_on_firmer_evidence():
    """A draft model that cannot afford to fall behind (no probe would pay its backlog): a row right 75% of the
    time whose first four drafts miss drafts on, and one whose drafts all miss stops within 7 drafts (the pool
    weighs two of a row's drafts: `seed_pair`) and stays stopped. Control: judged at one deviation as a stop that
    probes can undo, the four misses stop the good row."""
    unlucky = [False] * 4 + [True, True, True, False] * 5
    assert sum(pair_drafting_steps(unlucky, final_explore=2.0)) >= 0.8 * len(unlucky)
    hopeless = pair_drafting_steps([False] * 22, final_explore=2.0)
    assert sum(hopeless) <= 7 and hopeless[-10:] == [0] * 10
    assert sum(pair_drafting_steps(unlucky, final_explore=1.0)) <= 5


def test_a_stop_for_good_rests_on_all_of_a_rows_drafts_not_its_last_few(monkeypatch):
    """A draft model that cannot afford to fall behind: a row right 75% of the time whose five drafts after its
    16th all miss (its last ~10 drafts then say ~0.35, where a draft pays from ~0.5) drafts on, judged on all its
    first drafts; a row right 25% of the time still stops within a dozen drafts and stays stopped. Control: on
    its last ~10 drafts alone, the good row stops for good at the streak."""
    streak = [True, True, True, False] * 4 + [False] * 5 + [True, True, True, False] * 6
    assert sum(pair_drafting_steps(streak, final_explore=2.0)) == len(streak)
    poor = pair_drafting_steps([True, False, False, False] * 10, final_explore=2.0)
    assert sum(poor) <= 12 and poor[-20:] == [0] * 20
    monkeypatch.setattr(AcceptanceTracker, "long_run_first", lambda self, request_id: 0.0)
    assert sum(pair_drafting_steps(streak, final_explore=2.0)) <= 22


def explores(rows: int, per_row_bonus: bool = False) -> int:
    """K `_explore` asks for `rows` rows whose one draft each was rejected (0.45 now; 50 ms a step, 10 ms a verified
    token, 5 ms a draft: one draft a row pays from ~0.5 at one row and from ~0.7 at eight)."""
    ctrl = GoodputController(cost=CostModel.linear(50e-3, 0.0, 10e-3, 0.0))
    ctrl.cost.seed_draft(5e-3)
    if per_row_bonus:  # the rule before: each row its own standard deviation, summed over the batch
        ctrl._bonus = lambda var: ctrl.explore * np.sqrt(var)
    seqs = make_seqs(rows)
    for s in seqs:
        ctrl.acceptance.update(s.request_id, 1, 0)
    return ctrl._explore(seqs, np.full((rows, K_MAX), 0.45), np.full(rows, K_MAX), 3.0)


def test_a_batch_explores_on_its_sums_deviation_not_on_every_rows():
    """One thin row is explored at its standard deviation above its estimate (0.8: a draft pays); eight are
    explored at one standard deviation of their sum (0.58 each: it does not pay at eight rows). Control: a
    deviation for every row, as before, has the whole batch draft on a bonus eight times too large."""
    assert explores(1) == 1
    assert explores(8) == 0
    assert explores(8, per_row_bonus=True) == 1


def rows_probed_beside_a_drafting_row(riders: int, following: bool = False) -> int:
    """Rows of 8 given drafts in a step where row 0 drafts anyway and the 7 others have been silent for
    `probe_every` steps, for a draft model (50 ms a step, 10 ms a verified token, 20 ms a draft), with `riders`
    silent rows allowed to join; following: row 0's draft is a widening probe's follow-up."""
    ctrl = GoodputController(cost=CostModel.linear(50e-3, 0.0, 10e-3, 0.0))
    ctrl.cost.seed_draft(20e-3)
    ctrl.probe_riders = riders
    seqs = make_seqs(8)
    ctrl.idle = {s.request_id: ctrl.probe_every for s in seqs[1:]}
    ctrl.following = following
    return sum(k > 0 for k in ctrl._probe(seqs, [1] + [0] * 7, [K_MAX] * 8, 3.0))


def test_silent_rows_of_a_draft_model_join_a_drafting_step_one_at_a_time():
    """A step that drafts anyway lets silent rows join; each first catches up on every token since it last
    drafted, so with a draft model one joins a step (on the pair at 2,048 tokens and batch 8, all 7 did, and the
    batch then explored at K = 1), and none joins a probe's follow-up, whose draft is there to price a steady
    draft (a rider's catch-up would spoil it). Control: every silent row may join, as before."""
    assert rows_probed_beside_a_drafting_row(riders=1) == 2
    assert rows_probed_beside_a_drafting_row(riders=1, following=True) == 1
    assert rows_probed_beside_a_drafting_row(riders=8) == 8


def pair_at_2048() -> GoodputController:
    """`goodput` over the pair at 2,048 tokens on a CPU (packed: 30 ms a step and 12 ms a verified token)."""
    ctrl = GoodputController(cost=CostModel.linear(30e-3, 0.0, 12e-3, 0.0))
    ctrl.cost.packed = True
    return ctrl


def steps_that_drafted(ctrl: GoodputController, rows: int, steps: int, propose_s) -> int:
    """Steps that drafted, of `steps`, for `rows` rows with every draft rejected: a step takes what ctrl's model
    prices its verify at, plus propose_s(ks) of drafting."""
    seqs, drafting = make_seqs(rows), 0
    for _ in range(steps):
        ks = ctrl.choose(seqs, K_MAX)
        propose = propose_s(ks)
        seconds = ctrl.cost.predict_rows(np.array(ks), 3.0) + propose
        ctrl.observe(StepStats(seqs, ks, [0] * rows, seconds, rows + sum(ks), 3.0, propose, seconds - propose))
        drafting += max(ks) > 0
    return drafting


def drafting_steps_at(rows: int, steps: int = 200) -> int:
    """Steps that drafted, of `steps`, for `rows` rows of `pair_at_2048` (a draft step 11 ms for one row, 23 for
    four; the pool at 0.75); every draft is rejected."""
    ctrl = pair_at_2048()
    ctrl.cost.seed_draft(11e-3, weight=2.0)
    ctrl.cost.seed_draft(23e-3, weight=2.0, num_seqs=4)
    ctrl.acceptance.seed_pool(0.75, 8.0)
    return steps_that_drafted(
        ctrl, rows, steps, lambda ks: ctrl.cost.predict_draft(sum(k > 0 for k in ks), max(ks), 3.0)
    )


def test_no_widening_probe_where_not_even_a_perfect_row_could_pay(monkeypatch):
    """At 8 rows one row's draft (11 ms, and 12 ms to verify) cannot pay even if always accepted (a plain step
    makes a token in 15.75 ms): once a drafting step has priced the draft, no more probes (the first and its
    follow-up only). At 1 row the same draft pays: probes go on. Control: probes allowed whatever they could find,
    as before: the batch of 8 keeps probing."""
    assert drafting_steps_at(8) <= 2
    assert drafting_steps_at(1) > 4
    monkeypatch.setattr(GoodputController, "_alone_could_pay", lambda self, *args: True)
    assert drafting_steps_at(8) > 4


def probing_steps(rows: int, seed_s: float, steps: int = 100) -> int:
    """Steps that drafted, of `steps`, for `rows` rows of `pair_at_2048`, with the draft seeded at seed_s a draft
    where drafting takes 11 ms a draft: every draft is rejected, so only probes (and their follow-ups) draft."""
    ctrl = pair_at_2048()
    ctrl.cost.seed_draft(seed_s)
    ctrl.acceptance.seed_pool(0.3, 8.0)  # a draft that does not pay: the batch sits at K = 0 between probes
    return steps_that_drafted(ctrl, rows, steps, lambda ks: 11e-3 * max(ks))


def test_before_a_draft_is_priced_a_probe_needs_a_row_that_could_pay_at_a_busy_seeds_price(monkeypatch):
    """Until a drafting step has priced the draft, its price is the load probe's, which a busy machine put at 2.5x:
    a widening probe is judged at 1 / SEED_DOUBT of it. At 8 rows one row's drafts could not pay even then (a
    verified token alone, 12 ms, nearly matches a plain step's 15.75 ms a token): no probe at all. At 1 row a draft
    seeded at 2.5x its 11 ms (27.5: one draft, always accepted, would not pay at that) is still probed, priced, and
    probed again. Controls: probing whatever the price until it is measured, as before, spent the first probe and
    its follow-up at 8 rows; judging the busy seed at face value never probes the row at all."""
    assert probing_steps(8, 11e-3) == 0
    assert probing_steps(1, 27.5e-3) > 2
    monkeypatch.setattr(goodput, "SEED_DOUBT", 1.0)
    assert probing_steps(1, 27.5e-3) == 0
    monkeypatch.setattr(
        GoodputController,
        "_may_widen",
        lambda self, n, k, c: not self.cost.draft_measured or self._alone_could_pay(n, k, c),
    )
    assert probing_steps(8, 11e-3) == 2


def first_widening_probe(rows: int, monkeypatch=None) -> int:
    """The step at which a batch of `rows` at K = 0 (no row has drafted: a draft right 10% of the time, where
    drafting does not pay) first widens for a probe; 50 ms a step and 10 ms a verified token, as in service
    where padding every row to the probe's width costs the target that much."""
    ctrl = GoodputController(cost=CostModel.linear(50e-3, 0.0, 10e-3, 0.0))
    ctrl.cost.seed_draft(20e-3)
    ctrl.acceptance.seed_pool(0.1, 8.0)
    seqs = make_seqs(rows)
    for step in range(1, 200):
        ks = ctrl.choose(seqs, K_MAX)
        if max(ks):
            return step
        seconds = ctrl.cost.predict_verify(rows, 0, 3)
        ctrl.observe(StepStats(seqs, ks, [0] * rows, seconds, rows, 3.0, 0.0, seconds))
    return 0


def test_a_widening_probe_waits_for_what_padding_the_batch_costs(monkeypatch):
    """At 8 rows a probe pads the verify from 8 tokens to 16 (50 + 80 ms to 50 + 160): the first one waits until
    the steps since earn that at the 3% probe budget (21 steps), not `probe_every`'s 16 silent ones; one row (60
    to 70 ms) keeps the 16. Control: without the padding's price the batch of 8 probes after 16 as before. (The
    spacing alone: a probe is let through wherever it could not pay, `_may_widen`, tested above.)"""
    monkeypatch.setattr(GoodputController, "_may_widen", lambda self, *args: True)
    assert first_widening_probe(1) == 17  # 16 silent steps, then the probe
    assert first_widening_probe(8) == 21
    monkeypatch.setattr(GoodputController, "_widening_spacing", lambda self, num_seqs, context: 0)
    assert first_widening_probe(8) == 17


def drafting_steps_where_plain_is_cheaper_than_priced(plain_doubt: float, steps: int = 100) -> int:
    """Steps that verified drafts, of `steps`, for 8 rows of a draft model right 80% of the time whose calibration
    prices a plain verify at 120 ms and one of two tokens a row at 154 (86 ms and 4.25 a token) where they take 93
    and 150 (36 ms and 7.1 a token: the pair at 8 rows of 8,192 tokens, where the second query's attention costs
    more than the calibration at short contexts said); drafting 50 ms a step. Truth: K = 0 makes 0.086 tokens a
    ms, K = 1 0.072; believed: 0.067 and 0.069."""
    ctrl = GoodputController(cost=CostModel.linear(86e-3, 0.0, 4.25e-3, 0.0), cheap_draft=0.0, plain_doubt=plain_doubt)
    ctrl.cost.packed = True
    ctrl.cost.seed_draft(50e-3, num_seqs=8)
    ctrl.acceptance.seed_pool(0.8, 8.0)
    truth = CostModel.linear(36e-3, 0.0, 7.1e-3, 0.0)
    rng = np.random.default_rng(0)
    seqs, drafting = make_seqs(8), 0
    for _ in range(steps):
        ks = ctrl.choose(seqs, 1)
        accepted = [int(k > 0 and rng.random() < 0.8) for k in ks]
        propose = 50e-3 if max(ks) else 0.0
        verify = truth.predict_rows(np.array(ks), 3.0)
        tokens = 8 + sum(ks)
        ctrl.observe(StepStats(seqs, ks, accepted, verify + propose, tokens, 3.0, propose, verify))
        drafting += max(ks) > 0
    return drafting


def test_a_plain_step_is_given_to_price_one_where_the_choice_is_close():
    """A controller that drafts from its first step never sees a plain verify, and prices it by the calibration's
    shape at the level its drafting steps set: here K = 1 looks 4% better than K = 0 where it is 16% worse. A plain
    step after the first drafting one measures K = 0, and drafting stops (no later step of the 100 drafts:
    no widening probe is due). Control: no plain step (plain_doubt 0), and it drafts every step."""
    assert drafting_steps_where_plain_is_cheaper_than_priced(0.3) <= 2
    assert drafting_steps_where_plain_is_cheaper_than_priced(0.0) == 100


@pytest.mark.parametrize("k_max", [0, 1])
def test_respects_k_max(k_max):
    ctrl = GoodputController(cost=step_cost(), cheap_draft=0.0)
    assert all(k <= k_max for ks in run_k(ctrl, k_max) for k in ks)


def run_k(ctrl: GoodputController, k_max: int) -> list[list[int]]:
    seqs = make_seqs(2)
    out = []
    for _ in range(40):
        ks = ctrl.choose(seqs, k_max)
        ctrl.observe(StepStats(seqs, ks, ks, 0.02, 2 * (max(ks) + 1)))
        out.append(ks)
    return out


def sparse_proposal(num_seqs: int, drafts_in_row0: int):
    """Only row 0 has drafts (an n-gram drafter that matched once in the batch)."""
    import torch

    from specdecode.drafters.base import Proposal

    rows = [[5] * drafts_in_row0] + [[] for _ in range(num_seqs - 1)]
    return Proposal.from_lists(rows, drafts_in_row0, torch.device("cpu"))


@pytest.mark.parametrize("num_seqs", [1, 16])
def test_truncate_cuts_drafts_that_do_not_pay_for_the_batch(num_seqs):
    """One row with 4 good drafts: worth a wider verify at batch 1, not when 15 other rows are padded for it."""
    kept, width = kept_of_one_good_row(num_seqs, packed=False)
    assert kept[1:] == [0] * (num_seqs - 1)
    assert (kept[0] >= 2) if num_seqs == 1 else (kept[0] == 0)
    assert width == kept[0]


def kept_of_one_good_row(num_seqs: int, packed: bool) -> tuple[list[int], int]:
    """Row 0 of num_seqs has 4 drafts (accepted all, or only 2, alternately): the drafts truncate keeps per row,
    and the verify's width."""
    ctrl = GoodputController(cost=step_cost())
    ctrl.cost.packed = packed
    seqs = make_seqs(num_seqs)
    for step in range(20):
        ctrl.observe(StepStats(seqs[:1], [4], [4 if step % 2 else 2], 0.03, 5, 3.0, 0.0, 0.03))
    out = ctrl.truncate(seqs, sparse_proposal(num_seqs, 4))
    return out.num_tokens.tolist(), out.token_ids.shape[1]


def test_a_target_that_runs_real_tokens_alone_verifies_one_rows_drafts_in_a_batch():
    """Where the target computes each row's own tokens (models/llama.packs_rows), the good row's drafts cost 2-4
    tokens, not 15 rows' padding: kept at 16 rows as at one (the padded control is the test above, 0 kept)."""
    kept, width = kept_of_one_good_row(16, packed=True)
    assert kept[0] >= 2 and kept[1:] == [0] * 15 and width == kept[0]


def kept_of_one_good_row_among_poor(one_width: bool) -> list[int]:
    """8 rows of 4 drafts each, on a target that computes each row's own tokens (a token 1 ms over a 20 ms step):
    row 0's drafts are accepted 95% of the time, the others' 20%. The drafts truncate keeps per row; one_width:
    with the fault that every row keeps the same width (the padded verify's rule, `_one_width`)."""
    ctrl = GoodputController(cost=CostModel.linear(20e-3, 0.0, 1e-3, 0.0))
    ctrl.cost.packed = True
    if one_width:
        ctrl._packed_widths = ctrl._one_width
    seqs = make_seqs(8)
    ctrl.acceptance.estimate = lambda request_id, n: np.full(n, 0.95 if request_id == "r0" else 0.2)
    import torch

    from specdecode.drafters.base import Proposal

    return ctrl.truncate(seqs, Proposal.from_lists([[5] * 4] * 8, 4, torch.device("cpu"))).num_tokens.tolist()


def test_a_packed_verify_keeps_each_rows_own_width():
    """Row 0's four good drafts each pay for their token (0.95-0.81 expected against ~0.3 a ms); the poor rows'
    do not: kept [4, 0, ...]. Control: one width for every row keeps none (any width's poor drafts outweigh
    row 0's)."""
    assert kept_of_one_good_row_among_poor(one_width=False) == [4] + [0] * 7
    assert kept_of_one_good_row_among_poor(one_width=True) == [0] * 8


def kept_after_one_miss(explore: float) -> list[int]:
    """8 rows on a target that computes each row's own tokens (a token 0.5 ms over a 40 ms step); row 0's one
    draft so far missed (its estimate 0.25, on one draft's evidence), and it has a draft now: what truncate keeps."""
    ctrl = GoodputController(cost=CostModel.linear(40e-3, 0.0, 0.5e-3, 0.0), explore=explore)
    ctrl.cost.packed = True
    seqs = make_seqs(8)
    ctrl.acceptance.update("r0", 1, 0)
    assert ctrl.acceptance.estimate("r0", 1)[0] == pytest.approx(0.25)
    return ctrl.truncate(seqs, sparse_proposal(8, 1)).num_tokens.tolist()


def test_a_row_whose_first_draft_missed_is_still_verified_while_its_evidence_is_thin():
    """Each row kept on its own estimate, one early miss (0.25: +2% predicted) would cut a row for good and it
    would never learn otherwise; judged a standard deviation up (0.56: +6%) its draft is verified. Control: no
    exploration cuts it."""
    assert kept_after_one_miss(explore=1.0) == [1] + [0] * 7
    assert kept_after_one_miss(explore=0.0) == [0] * 8


def draft_price_learned_at(forget_made: bool) -> int:
    """Two rows asked for 5 lookups each, truncate keeping 1 of row 0's: the drafts a step the cost model learns
    drafting's price at. forget_made: the fault that the controller loses what was made before it observes."""
    ctrl = GoodputController(cost=CostModel.linear(20e-3, 0.0, 1e-3, 0.0))
    seqs = make_seqs(2)
    ctrl.asked = {"r0": 5, "r1": 5}
    ctrl.acceptance.estimate = lambda request_id, n: np.array([0.9] + [0.02] * (n - 1))
    import torch

    from specdecode.drafters.base import Proposal

    kept = ctrl.truncate(seqs, Proposal.from_lists([[5] * 5, [5] * 5], 5, torch.device("cpu"))).num_tokens.tolist()
    assert kept == [1, 1]
    if forget_made:
        ctrl.made = {}
    seen = []
    ctrl.cost.observe = lambda num_seqs, k, *args, **kwargs: seen.append(k)
    ctrl.observe(StepStats(seqs, kept, [1, 0], 0.03, 4, 3.0, 0.004, 0.026))
    return seen[0]


def test_drafting_is_priced_at_the_drafts_made_not_those_verified():
    """A lookup made 5 drafts a row and truncate kept 1: the step's drafting time bought 5. Control: without the
    record of what was made, the price is learned at the width verified, 1."""
    assert draft_price_learned_at(forget_made=False) == 5
    assert draft_price_learned_at(forget_made=True) == 1


def marginal_width(margin: float) -> int:
    """Four rows, one with a draft accepted 4 times in 5; a token costs 1 ms over a 20 ms step: verifying it is
    predicted to pay ~3% (4.8 tokens in 28 ms against 4 in 24). The verify width truncate keeps."""
    ctrl = GoodputController(cost=CostModel.linear(20e-3, 0.0, 1e-3, 0.0), widen_margin=margin)
    ctrl.acceptance.estimate = lambda request_id, n: np.full(n, 0.8)
    seqs = make_seqs(4)
    return int(ctrl.truncate(seqs, sparse_proposal(4, 1)).num_tokens.max())


def test_a_width_predicted_to_pay_within_the_models_error_is_not_verified():
    """A predicted gain of 3% is inside the cost model's error: the batch verifies no draft. Control: with no
    margin the same drafts are verified."""
    assert (4 + 0.8) / 28 / (4 / 24) == pytest.approx(1.029, abs=1e-3)
    assert marginal_width(0.05) == 0
    assert marginal_width(0.0) == 1


def test_cheap_drafts_are_all_requested_and_truncate_decides():
    """With (near) free drafting, as n-gram, choose asks every row for K_max; a costly drafter is capped."""
    seqs = make_seqs(4)
    free = GoodputController(cost=step_cost())
    assert free.choose(seqs, K_MAX) == [K_MAX] * 4
    costly = step_cost()
    costly.draft_coef = np.array([5e-3, 1e-3, 0.0, 0.0])  # 5 ms per drafted position: a draft model
    assert max(GoodputController(cost=costly).choose(seqs, K_MAX)) < K_MAX


@pytest.mark.parametrize("num_seqs", [1, 32])
def test_cheap_drafts_are_not_looked_up_when_no_width_can_pay(num_seqs):
    """A compute-bound step (every token 10x the fixed part): even drafts as good as the rows' histories
    cannot pay for widening 32 rows, so choose asks for none (the lookups would only be thrown away by
    truncate, ~5% of such a step), nor probes a silent row: one row's drafts, the verify padded to them, could not
    pay even if all were accepted (`_may_widen`; it had probed one at step 20, before any drafting step had priced
    the lookups); one row is asked for all."""
    ctrl = GoodputController(cost=CostModel.linear(20e-3, 0.0, 1e-3, 0.0), probe_every=4)
    seqs = make_seqs(num_seqs)
    asked = []
    for _ in range(24):  # rows that find no drafts: nothing proposed, nothing learned
        asked.append(ctrl.choose(seqs, K_MAX))
        ctrl.observe(StepStats(seqs, [0] * num_seqs, [0] * num_seqs, 0.05, num_seqs, 3.0, 0.0, 0.05))
    if num_seqs == 1:
        assert asked == [[K_MAX]] * 24
    else:
        assert not any(map(sum, asked))


def steps_until_the_gate_moves(
    open_gate: bool = False, join: bool = False, drafted: bool = False, fault: str = ""
) -> int:
    """32 rows of a lookup drafter on a compute-bound step. Closed gate: no width pays at the pool's prior, so
    choose asks nothing, and holds that for the same rows without pricing it again (`_gate_holds`); then every
    row's drafts become right 95% of the time, which pays, with no draft observed to say so. Open gate: the other
    way round (95% at first, then 1%). join: a 33rd row joins then; drafted: a step verifies a draft of row 0
    then. Returns the steps until choose's answer changes. fault "rows": a hold that ignores which rows it was
    priced for; "drafted": one that outlives a draft observed past a closed gate."""
    ctrl = GoodputController(cost=CostModel.linear(20e-3, 0.0, 1e-3, 0.0), probe_every=10**6)
    seqs = make_seqs(33)
    batch = seqs[:32]
    if open_gate:
        ctrl.acceptance.estimate = lambda request_id, n: np.full(n, 0.95)
    first = ctrl.choose(batch, K_MAX)
    assert first == ([K_MAX] * 32 if open_gate else [0] * 32)
    if fault == "rows":
        holds = ctrl._gate_holds
        ctrl._gate_holds = lambda key: holds((ctrl.gate_key[0], key[1]) if ctrl.gate_key else key)
    ctrl.acceptance.estimate = lambda request_id, n: np.full(n, 0.01 if open_gate else 0.95)
    if drafted:
        held = ctrl.gate_key
        ks = [1] + [0] * 31
        ctrl.observe(StepStats(batch, ks, ks, 0.06, 33, 3.0, 0.0, 0.06))
        ctrl.gate_key = held if fault == "drafted" else ctrl.gate_key
    batch = seqs if join else batch
    for step in range(1, 4 * goodput.GATE_STEPS):
        if any(ctrl.choose(batch, K_MAX)) != open_gate:
            return step
    return 4 * goodput.GATE_STEPS


@pytest.mark.parametrize("open_gate", [False, True])
def test_a_lookup_gate_is_priced_again_when_a_row_joins_and_every_few_steps(open_gate):
    """A cheap drafter's gate (every draft asked, or none) stands for the same rows GATE_STEPS steps (pricing it
    cost ~0.3-0.4 ms a step in the engine, 2-5% of SmolLM2's step), then is priced again; a new row, or a draft
    verified past a closed gate (a probe's), is priced at once. The controls, a hold blind to the rows and one
    that outlives a draft, hold as long as for unchanged rows."""
    assert steps_until_the_gate_moves(open_gate) == goodput.GATE_STEPS
    assert steps_until_the_gate_moves(open_gate, join=True) == 1
    assert steps_until_the_gate_moves(open_gate, join=True, fault="rows") == goodput.GATE_STEPS
    if not open_gate:
        assert steps_until_the_gate_moves(drafted=True) == 1
        assert steps_until_the_gate_moves(drafted=True, fault="drafted") == goodput.GATE_STEPS


def lookups_asked_of_one_good_row(packed: bool) -> int:
    """8 rows of a lookup drafter, row 0's drafts right 95% of the time and the others' 10%; 50 ms a step and 10 ms a
    verified token. The drafts choose asks of the batch (in all rows)."""
    ctrl = GoodputController(cost=CostModel.linear(50e-3, 0.0, 10e-3, 0.0))
    ctrl.cost.packed = packed
    ctrl.acceptance.estimate = lambda request_id, n: np.full(n, 0.95 if request_id == "r0" else 0.1)
    return sum(ctrl.choose(make_seqs(8), K_MAX))


def test_lookups_are_asked_where_one_rows_drafts_pay_on_a_target_that_runs_real_tokens():
    """Drafts for every row cannot pay (K = 1: 9.65 tokens in 210 ms against 8 in 130), but row 0's alone can where
    the target computes each row's own tokens (K = 8: ~14.6 tokens in 210 ms): the lookups are asked, truncate keeps
    what pays. Control: a padded target, where row 0's drafts pad every row, asks none."""
    assert lookups_asked_of_one_good_row(packed=True) == 8 * K_MAX
    assert lookups_asked_of_one_good_row(packed=False) == 0


def lookups_asked(margin: float) -> int:
    """32 rows whose histories say 0.665 a draft, tokens at 1 ms over a 20 ms step: one draft a row is predicted
    to pay ~3% (32 x 1.665 tokens in 84 ms against 32 in 52), more drafts less. The drafts choose asks for."""
    ctrl = GoodputController(cost=CostModel.linear(20e-3, 0.0, 1e-3, 0.0), widen_margin=margin)
    ctrl.acceptance.estimate = lambda request_id, n: np.full(n, 0.665)
    return sum(ctrl.choose(make_seqs(32), K_MAX))


def test_cheap_drafts_are_not_looked_up_for_a_gain_truncate_would_cut():
    """A gain inside truncate's margin would be cut there after every row's lookup was paid for, so choose asks
    for none. Control: with no margin the same rows are asked for every draft."""
    assert (32 * 1.665 / 84) / (32 / 52) == pytest.approx(1.031, abs=1e-3)
    assert lookups_asked(0.05) == 0
    assert lookups_asked(0.0) == 32 * K_MAX


@pytest.mark.parametrize("sets_width", [True, False])
def test_a_drafter_whose_confidences_set_the_width_is_always_asked(sets_width):
    """The skip above goes by the rows' histories, which do not decide a suffix chain's width (its
    frequencies do, in truncate): once such a chain was seen, every row is asked at any batch. Control: an
    n-gram-like chain (no such claim), in the same compute-bound batch, is not asked."""
    ctrl = GoodputController(cost=CostModel.linear(20e-3, 0.0, 1e-3, 0.0))
    seqs = make_seqs(32)
    ctrl.truncate(seqs[:1], chain([0.9] * 4, sets_width))
    assert ctrl.choose(seqs, K_MAX) == ([K_MAX] * 32 if sets_width else [0] * 32)


def features_without_per_row(draft_row):
    """The fault: a drafting step's regressors (cost.draft_row) with the per-row and context terms zeroed (a lookup
    charged per position)."""
    return lambda b, k, c=0.0: [v * m for v, m in zip(draft_row(b, k, c), [1.0, 1.0, 0.0, 0.0], strict=True)]


def lookup_cost_is_cheap_after_short_steps() -> bool:
    """An n-gram lookup costs 0.5 ms per row whatever K; the controller has only seen steps of K = 1-3 (a
    short chain found): does it still call K_max drafts cheap at batch 1?"""
    ctrl = GoodputController(cost=step_cost())
    for k in [1, 2, 3] * 10:
        ctrl.cost.observe(1, k, 256, ctrl.cost.predict_verify(1, k, 256), 0.5e-3)
    return ctrl.choose(make_seqs(1), K_MAX) == [K_MAX]


def test_a_lookup_cost_per_row_is_not_charged_per_position(monkeypatch):
    """Charged per position instead (the fit without the per-row term), 0.5 ms at K = 2 is 2 ms at K = 8, ~10%
    of a step: the controller then capped n-gram drafts before the lookup and lost the long accepted runs."""
    assert lookup_cost_is_cheap_after_short_steps()
    monkeypatch.setattr(cost_module, "draft_row", features_without_per_row(cost_module.draft_row))
    assert not lookup_cost_is_cheap_after_short_steps()


def slow_lookup_asks_for_everything() -> bool:
    """A lookup that costs 2 ms per row whatever K (~10% of a step, as suffix's three histories can): does
    choose still ask for K_max, leaving the width to truncate?"""
    ctrl = GoodputController(cost=step_cost())
    for k in [1, 2, 3, 8] * 10:
        ctrl.cost.observe(1, k, 256, ctrl.cost.predict_verify(1, k, 256), 2e-3)
    return ctrl.choose(make_seqs(1), K_MAX) == [K_MAX]


def test_a_costly_lookup_is_still_asked_for_every_draft(monkeypatch):
    """Only the cost of the extra positions counts. Control: the same propose times charged per position (a
    draft model's shape) make K_max 16 ms dearer than K = 1, and choose caps it."""
    assert slow_lookup_asks_for_everything()
    monkeypatch.setattr(cost_module, "draft_row", features_without_per_row(cost_module.draft_row))
    assert not slow_lookup_asks_for_everything()


def chain(conditional: list[float], sets_width: bool = True, sampled: bool = False):
    """A one-row chain of len(conditional) drafts with those per-draft confidences; sampled: q attached."""
    import torch

    from specdecode.drafters.base import Proposal

    n = len(conditional)
    proposal = Proposal.from_lists([[5] * n], n, torch.device("cpu"), [conditional], sets_width)
    if sampled:
        proposal.probs = torch.full((1, n, 8), 1 / 8)  # [1, n, vocab] a drafter's q
    return proposal


def chain_width(conditional: list[float], sets_width: bool = True, sampled: bool = False) -> int:
    """The width kept for one chain at batch 1, after a history in which the row accepted 1 draft of 4."""
    ctrl = GoodputController(cost=step_cost())
    seqs = make_seqs(1)
    for _ in range(20):
        ctrl.observe(StepStats(seqs, [4], [1], 0.03, 5, 3.0, 0.0, 0.03))
    return int(ctrl.truncate(seqs, chain(conditional, sets_width, sampled)).num_tokens[0])


def test_a_chain_whose_confidences_are_frequencies_is_cut_by_them():
    """A suffix continuation seen 40 times in 40 is worth 6 drafts even for a row that lately accepted 1 of 4;
    one whose drafts each held in a third of the occurrences is not. A chain whose drafter does not vouch for
    its confidences (n-gram) goes by the row's history: both the same width."""
    assert chain_width([1.0] * 6) == 6
    assert chain_width([0.3] * 6) <= 2
    assert chain_width([1.0] * 6, sets_width=False) == chain_width([0.3] * 6, sets_width=False) < 6


def test_a_sampled_chain_is_not_cut_by_what_was_drawn():
    """With q attached (a draft model under sampling) the width may not depend on the drafts' confidences:
    keeping draft j for the confidence of draft j + 1, drawn after it, would bias draft j away from q."""
    assert chain_width([1.0] * 6, sampled=True) == chain_width([0.3] * 6, sampled=True) < 6


def drafts_verified(drafting_counts: bool) -> int:
    """Of 4 drafts a pair-like draft model made (12 ms each, right ~0.75 of the time), the ones `truncate` keeps for
    a verify of 36 ms and 4 ms a token, +6 more for each past 4 (the bend a weight-streaming GEMM turns at).
    drafting_counts=False: the fault that the step's drafting is left out of its time."""
    import torch

    from specdecode.drafters.base import Proposal

    cost = CostModel(np.array([32e-3, 0.0, 4e-3, 6e-3, 0.0, 0.0, 0.0, 0.0]))
    ctrl = GoodputController(cost=cost, cheap_draft=0.0)
    ctrl.seed_pair(0.75, 12e-3)
    if not drafting_counts:
        cost.predict_draft = lambda num_seqs, k, context=0.0: 0.0
    seqs = make_seqs(1)
    return ctrl.truncate(seqs, Proposal.from_lists([[5] * 4], 4, torch.device("cpu"))).num_tokens.tolist()[0]


def test_truncate_prices_a_width_over_the_whole_step_drafting_included():
    """The 4th draft adds 0.32 tokens for 10 ms of verify: dear against the verify's ~48 ms alone, worth it against
    the step's ~96 with the drafting that made it (drafts already made are paid either way)."""
    assert drafts_verified(drafting_counts=True) == 4
    assert drafts_verified(drafting_counts=False) == 3


def steps_at_k1_after_a_deep_miss(optimism: bool, steps: int = 30) -> int:
    """A pair's `goodput` at batch 1 (right 0.75 of the time by the load probe, 9 ms a draft on a ~22 ms step): its
    first step that asks 2 or more drafts has the first accepted and the second rejected; every draft after is
    accepted. Returns how many of the next `steps` steps ask for fewer than 2. optimism=False: the fault, deeper
    positions judged on their mean estimate alone (`_deep_optimism` made the identity)."""
    ctrl = GoodputController(cost=step_cost(), cheap_draft=0.0)
    ctrl.seed_pair(0.75, 9e-3)
    if not optimism:
        ctrl._deep_optimism = lambda seqs, p: p
    seqs = make_seqs(1)
    missed, shallow = False, 0
    for _ in range(steps + 50):
        k = ctrl.choose(seqs, 4)[0]
        accepted = 1 if (k >= 2 and not missed) else k
        if missed:
            shallow += k < 2
            steps -= 1
            if steps == 0:
                break
        missed |= k >= 2
        seconds = step_cost().predict(1, k, 3.0) + 9e-3 * k
        ctrl.observe(StepStats(seqs, [k], [accepted], seconds, k + 1, 3.0, 9e-3 * k, seconds - 9e-3 * k))
    return shallow


def test_one_miss_at_a_deeper_draft_does_not_hold_k_below_it():
    """A second draft rejected once, then right every time: `goodput` tries two drafts again within a few steps
    (the position's thin evidence judged a deviation up, as a first draft's is). Control: judged on the mean
    estimate alone, one miss held K = 1 for 24 of the next 30 steps."""
    assert steps_at_k1_after_a_deep_miss(optimism=True) <= 3
    assert steps_at_k1_after_a_deep_miss(optimism=False) >= 10


def verify_estimates(consistent: bool) -> tuple[np.ndarray, np.ndarray]:
    """(truncate's estimates, choose's reach's per-position estimates) [4] each, for a pair-like row whose second draft
    missed once (thin evidence there); consistent=False: the fault, truncate's estimates as before 16k's fix (the
    first position's bonus alone, deeper positions at their mean)."""
    cost = CostModel.linear(30e-3, 0.0, 6e-3, 0.0)
    cost.packed = True
    ctrl = GoodputController(cost=cost, cheap_draft=0.0)
    ctrl.seed_pair(0.75, 9e-3)
    if not consistent:

        def before(seqs, widest, context):
            p = ctrl._estimates(seqs, widest, context)
            p[:, 0] = np.minimum(p[:, 0] + ctrl._thin_bonus(seqs, p[:, 0], context), 1.0)
            return p

        ctrl._verify_estimates = before
    seqs = make_seqs(1)
    for accepted in (1, 1, 1, 1):
        ctrl.acceptance.update(seqs[0].request_id, 1, accepted)
    ctrl.acceptance.update(seqs[0].request_id, 2, 1)  # the second draft rejected once
    p = ctrl._estimates(seqs, 4, 3.0)  # [1, 4]
    return ctrl._verify_estimates(seqs, 4, 3.0)[0], ctrl._deep_optimism(seqs, p)[0]


def test_truncate_judges_deeper_drafts_as_choose_asked_for_them():
    """A deeper draft `choose` asked for on thin evidence judged up (`_deep_optimism`) is judged the same way when
    `truncate` decides whether to verify it: judged at its mean there, it was made and cut, never verified, its
    evidence stayed thin and choose kept asking (the pair at 16,384 tokens: 3.54 drafts asked a step, 1.68 verified,
    0.899x the best fixed K; with this, on the dev code text, 0.949x -> 0.984x)."""
    kept, asked = verify_estimates(consistent=True)
    assert np.abs(asked[1:] - kept[1:]).max() < 1e-12
    kept, asked = verify_estimates(consistent=False)  # the same comparison with the fault: well apart
    assert asked[1] - kept[1] > 0.05


def lookup_gate_after_one_miss(judged_up: bool = True) -> list[int]:
    """8 rows of a lookup drafter on a target that runs each row's own tokens, each row's first draft missed once
    (its estimate ~0.25, where drafts pay from ~0.3). What choose asks. judged_up=False: the fault of a gate
    judged on the rows' mean estimates where `truncate` judges thin ones up."""
    cost = CostModel.linear(20e-3, 0.0, 0.8e-3, 0.0)
    cost.packed = True
    ctrl = GoodputController(cost=cost, probe_every=10**6)
    seqs = make_seqs(8)
    for s in seqs:
        ctrl.acceptance.update(s.request_id, 1, 0)
    if not judged_up:
        ctrl._thin_bonus = lambda seqs, first, context: np.zeros(len(seqs))
    return ctrl.choose(seqs, K_MAX)


def test_a_lookup_gate_judges_thin_first_drafts_as_truncate_does():
    """A row whose few first drafts missed is judged a deviation up, as `truncate` judges it: the gate stays open
    and the rows show what they are worth. On their mean the gate closed, and a closed gate learns from probes
    only (SmolLM2's n-gram, 8 rows at 7,900 tokens: K = 0 in every repeat where fixed K = 1 made 1.19x K = 0)."""
    assert lookup_gate_after_one_miss() == [K_MAX] * 8
    assert lookup_gate_after_one_miss(judged_up=False) == [0] * 8


def one_row_width_mismatches(fault: bool = False, cases: int = 400) -> int:
    """Random one-row truncations (reach non-increasing, 0-8 drafts, a random linear verify price and drafting
    paid): how often the one-row path keeps another width than the batch path. fault: a one-row path that
    ignores the margin over verifying nothing."""
    rng = np.random.default_rng(1)
    wrong = 0
    for _ in range(cases):
        cost = CostModel.linear(rng.uniform(5e-3, 30e-3), 0.0, rng.uniform(0.1e-3, 5e-3), 0.0)
        cost.packed = True
        ctrl = GoodputController(cost=cost, widen_margin=0.0 if fault else 0.05)
        widest = int(rng.integers(1, 9))
        reach = np.cumprod(rng.uniform(0.0, 1.0, widest))[None]  # [1, widest]
        drafts = np.array([int(rng.integers(0, widest + 1))])
        paid = float(rng.uniform(0.0, 5e-3))
        one = ctrl._one_row_width(reach[0].tolist(), int(drafts[0]), 3.0, paid)
        ctrl.widen_margin = 0.05
        wrong += one != int(ctrl._packed_widths_batch(reach, drafts, 3.0, paid)[0])
    return wrong


def test_one_rows_width_is_the_batch_width():
    """The one-row truncation keeps the width the batch path keeps in all 400 cases; the control, without the
    margin, keeps another in 11."""
    assert one_row_width_mismatches() == 0
    assert one_row_width_mismatches(fault=True) >= 5


class LookupDraftStub:
    """A draft model with a prompt lookup as `goodput` sees it: what it has left to read of each row, the rows it is
    told to hold to the lookup. lookup=False: the same draft model without one."""

    prefill_budget = 512

    def __init__(self, unread: int, lookup: bool = True) -> None:
        self.lookup = object() if lookup else None
        self.to_read = unread
        self.holds: list[set[str]] = []

    def unread(self, seq: Sequence) -> int:
        return self.to_read

    def hold_model(self, request_ids: set[str]) -> None:
        self.holds.append(set(request_ids))


def short_answers(n: int) -> list[Sequence]:
    """Rows of a 128-token answer: too few tokens to earn back 1,000 tokens of reading."""
    return [Sequence(f"r{i}", [1, 2, 3], SamplingParams(max_tokens=128), max_len=4096) for i in range(n)]


def dear_reader(drafter: LookupDraftStub) -> GoodputController:
    """The pair's `goodput` at batch 1 (right 0.75 of the time, 9 ms a draft), its draft model 5 ms a token to read."""
    ctrl = GoodputController(cost=step_cost(), cheap_draft=0.0)
    ctrl.seed_pair(0.75, 9e-3, draft_read_s=5e-3)
    ctrl.bind_drafter(drafter)
    return ctrl


@pytest.mark.parametrize("lookup", [True, False])
def test_a_row_too_dear_to_read_takes_the_lookups_drafts_alone(lookup):
    """A 1,000-token prompt the draft has not read (5 s of reading for a row that saves far less) is asked no model
    drafts; with a lookup beside the model it is asked the lookup's, its room of them, and held to the lookup. A row
    the draft has read drafts from the model as before. Control: the same draft model without a lookup asks nothing
    of the unread row."""
    drafter = LookupDraftStub(1000, lookup)
    ctrl = dear_reader(drafter)
    seqs = short_answers(1)
    ks = ctrl.choose(seqs, 4)
    assert ks == ([4] if lookup else [0])
    assert drafter.holds == ([{"r0"}] if lookup else [])
    drafter.to_read = 0  # caught up: the model's drafts pay
    ks = ctrl.choose(seqs, 4)
    assert ks[0] > 0 and drafter.holds[-1:] == ([set()] if lookup else [])


def cheap_draft_steps_held(fault: bool = False) -> list[bool]:
    """Three steps of four rows under a draft model priced cheap that no width pays for: whether each step held to
    the lookup every row the model was asked nothing for (and asked it for their room). fault: the step skips the
    hold."""
    drafter = LookupDraftStub(0)
    ctrl = GoodputController(cost=step_cost(), cheap_draft=1e9)  # any extra draft is cheap
    ctrl.seed_pair(0.01, 9e-3)  # and right once in a hundred: no width pays
    ctrl.bind_drafter(drafter)
    if fault:
        ctrl._hold = lambda seqs, ks, room: ks
    seqs, held_all = short_answers(4), []
    for _ in range(3):
        ks = ctrl.choose(seqs, 4)
        assert ctrl._drafting_is_cheap(4, 4, 3.0)
        held = drafter.holds[-1] if len(drafter.holds) == len(held_all) + 1 else set()  # this step's, if any
        skipped = {s.request_id for s in seqs} - set(ctrl.asked)
        held_all.append(bool(skipped) and held == skipped and all(k == 4 for k in ks))
    return held_all


def test_a_draft_model_priced_cheap_holds_the_rows_it_asks_nothing():
    """A draft model whose extra drafts are priced cheap (`_drafting_is_cheap`) is asked like a lookup: every draft
    where some width pays, else none but probes. The rows it then asks nothing are held to its lookup as on every
    other path; they were not (the step returned before `_hold`, and left the last step's rows held): a CI run whose
    calibration priced the tiny test draft cheap held no row in 4,000 requests (2026-12-01). Control: the step
    skips the hold, as it did."""
    assert cheap_draft_steps_held() == [True] * 3
    assert cheap_draft_steps_held(fault=True) == [False] * 3


def test_held_rows_learn_the_lookups_acceptance_and_never_the_drafts_price():
    """A held row's verified lookup drafts (all rejected here) teach its lookup estimate, not the model's, nor the
    model's price (its lookups took no forward); `truncate` verifies fewer of them as the misses come in. Control:
    the same drafts taken as the model's are judged on its history (the load probe's 0.75: all kept), and teach its
    estimate and, once steady, its price."""
    import torch

    from specdecode.drafters.base import Proposal

    def step(ctrl: GoodputController, seqs: list[Sequence], held: bool) -> int:
        ctrl.choose(seqs, 4)
        if not held:
            ctrl.held.clear()
        n = ctrl.truncate(seqs, Proposal.from_lists([[5, 6, 7]], 3, torch.device("cpu"))).num_tokens.tolist()[0]
        ctrl.observe(StepStats(seqs, [n], [0], 30e-3, n + 1, 3.0, 0.1e-3, 30e-3 - 0.1e-3))
        return n

    ctrl, seqs = dear_reader(LookupDraftStub(1000)), short_answers(1)
    ctrl.hold_ledger.min_steps = float("inf")  # held throughout, however little it pays (the ledger: its own tests)
    price = ctrl.cost.predict_draft(1, 3)
    kept = [step(ctrl, seqs, held=True) for _ in range(12)]
    assert kept[0] > kept[-1]
    assert ctrl.lookup_acceptance.estimate("r0", 1)[0] < 0.1
    assert not ctrl.acceptance.has_drafted("r0") and ctrl.cost.predict_draft(1, 3) == price
    assert [step(ctrl, seqs, held=False) for _ in range(2)][0] == 3
    assert ctrl.acceptance.has_drafted("r0") and ctrl.cost.predict_draft(1, 3) < price / 2


def one_row_optimism_mismatches(fault: bool = False, cases: int = 400) -> int:
    """Random estimates and evidence of one row: cases where `_deep_optimism`'s one-row path differs from its batch
    path on the same row. fault: the one-row path's `explore` read 10% high."""
    rng = np.random.default_rng(0)
    ctrl = GoodputController(cost=step_cost())
    seqs = make_seqs(1)
    misses = 0
    for _ in range(cases):
        k = int(rng.integers(2, 7))
        p = rng.uniform(0.02, 0.98, (1, k))  # [1, k]
        trials = np.where(rng.random(k) < 0.3, 0.0, rng.uniform(0.0, 9.0, k))  # [k] some untried, some thin
        ctrl.acceptance.trials["r0"] = np.concatenate([trials, np.zeros(ctrl.acceptance.max_positions - k)])
        batch = ctrl._deep_optimism_batch(seqs, p.copy())
        ctrl.explore = 1.1 if fault else 1.0
        one = ctrl._deep_optimism(seqs, p.copy())
        ctrl.explore = 1.0
        misses += not np.array_equal(one, batch)
    return misses


def test_one_rows_optimism_is_the_batchs():
    """The one-row path gives the batch path's estimates bit for bit in all 400 cases; the control, its explore 10%
    high, differs in most."""
    assert one_row_optimism_mismatches() == 0
    assert one_row_optimism_mismatches(fault=True) >= 200


def one_row_thin_bonus_mismatches(fault: bool = False, cases: int = 400) -> int:
    """Random first-draft estimates and evidence of one row, its draft model caught up or not (a stop for good or
    not): cases where `_thin_bonus`'s one-row path differs from its batch path on the same row. fault: the one-row
    path's `explore` read 10% high."""
    rng = np.random.default_rng(2)
    drafter = LookupDraftStub(0)
    ctrl = dear_reader(drafter)
    seqs = make_seqs(1)
    misses = 0
    for _ in range(cases):
        first = np.array([rng.uniform(0.02, 0.98)])  # [1]
        tried = 0.0 if rng.random() < 0.2 else float(rng.uniform(0.0, 9.0))  # untried, thin or not
        ctrl.acceptance.trials["r0"] = np.concatenate([[tried], np.zeros(ctrl.acceptance.max_positions - 1)])
        drafter.to_read = int(rng.choice([0, 100]))  # caught up (a stop may be final) or behind
        context = float(rng.uniform(0, 8192))
        batch = ctrl._thin_bonus_batch(seqs, first, context)
        ctrl.explore = 1.1 if fault else 1.0
        one = ctrl._thin_bonus(seqs, first, context)
        ctrl.explore = 1.0
        misses += not np.array_equal(one, batch)
    return misses


def test_one_rows_thin_bonus_is_the_batchs():
    """The one-row path gives the batch path's bonus bit for bit in all 400 cases; the control (explore 10% high)
    differs in the 150 where the row is thin."""
    assert one_row_thin_bonus_mismatches() == 0
    assert one_row_thin_bonus_mismatches(fault=True) >= 100


def steps_holding(found: int, steps: int = 40, monkeypatch=None) -> list[bool]:
    """8 rows too dear for the draft model to read (each held to the lookup), the drafter's step 2 ms where only
    lookups ran, each held row's lookup finding `found` drafts a step, all accepted: whether each step held them."""
    drafter = LookupDraftStub(1000)
    ctrl = dear_reader(drafter)
    seqs = short_answers(8)
    for s in seqs:
        s.params = SamplingParams(max_tokens=100_000)  # rows that never run out of tokens to write
    out = []
    for _ in range(steps):
        ctrl.choose(seqs, 4)
        out.append(bool(ctrl.held))
        n = [found if out[-1] else 0] * 8
        ctrl.observe(StepStats(seqs, n, n, 40e-3, 8 + sum(n), 256.0, 2e-3 if out[-1] else 0.0, 38e-3))
    return out


def test_rows_are_held_to_the_lookup_only_while_its_drafts_pay_for_it():
    """Lookups that find nothing for 8 held rows cost the drafter's 2 ms a step and save nothing: after the first
    steps (too few to judge) `goodput` stops holding the rows and holds them again once every 16 steps, to look.
    Lookups whose drafts are accepted (one a row a step) save a plain step's share for each, and every step holds.
    Control: a ledger that counts no cost holds every step of the barren run too."""
    barren = steps_holding(found=0)
    assert all(barren[:4]) and sum(barren[4:]) <= 4 and any(barren[20:])
    assert all(steps_holding(found=1))


def test_control_a_hold_ledger_blind_to_cost_holds_for_nothing(monkeypatch):
    from specdecode.control.hold_ledger import HoldLedger

    real = HoldLedger.record
    blind = lambda self, rows, saved, verify, propose: real(self, rows, saved, 0.0, 0.0)  # noqa: E731
    monkeypatch.setattr(HoldLedger, "record", blind)
    assert all(steps_holding(found=0))


def idle_batch_run(standing: bool, steps: int = 64) -> tuple[list[list[int]], int]:
    """8 rows of the traces' target with a draft model (bound as one: not a lookup) whose drafts are right 10% of the
    time: a few drafting steps, then K = 0. (each step's K, how many times the batch's estimates were priced)."""

    class DraftModelStub:
        prefill_budget = 512  # a drafter with a cache of its own: `bind_drafter` does not gate it

    ctrl = GoodputController(cost=step_cost(), cheap_draft=0.0)
    ctrl.bind_drafter(DraftModelStub())
    if not standing:
        ctrl._stand_idle = lambda key, caps: None
    priced = []
    estimates = ctrl._estimates
    ctrl._estimates = lambda *a: priced.append(1) or estimates(*a)
    ks = run(ctrl, make_seqs(8), [0.1] * 8, steps)
    return ks, len(priced)


def test_a_draft_model_asked_nothing_at_a_batch_is_priced_again_every_eighth_step():
    """At K = 0 nothing the batch's price reads moves but the cost model's level: a batch of 8 priced once in
    GATE_STEPS steps once it stands at K = 0 takes the same K in all 64 steps (its first drafting steps included) as
    one priced every step. Control: the same run without standing idle prices all 64."""
    standing, priced = idle_batch_run(standing=True)
    every, priced_every = idle_batch_run(standing=False)
    assert standing == every and any(map(any, every))  # the same decisions, probes among them
    assert priced_every >= 64 and priced <= 64 // 8 + 8
