"""The step-time cost model: NNLS fit of a synthetic step-time function, online healing, profile files."""

from __future__ import annotations

import copy
import itertools
import json
import statistics

import numpy as np
import pytest

from specdecode.control import cost as cost_module
from specdecode.control.cost import (
    CostModel,
    ProfileError,
    default_cost_model,
    load_or_default,
    nnls,
    verify_features,
)

# seconds: fixed, per row, per token, per token past each knee (4, 16, 64), per token and per row per 1k context:
# flat for a few tokens, then compute-bound, each row reading its own cache, as the compiled CPU step is
TRUE = np.array([15e-3, 2e-3, 0.3e-3, 3e-3, 1e-3, 0.0, 0.4e-3, 1.5e-3])
GRID = [(b, t, c) for b in (1, 2, 4, 8) for t in (1, 3, 6, 9) for c in (64, 512, 1500)]
FP = {"model_type": "llama", "num_params": 123, "device": "cpu", "dtype": "float32", "torch": "x"}


def synthetic_samples(noise: float, seed: int = 0) -> list[tuple[float, float, float, float]]:
    rng = np.random.default_rng(seed)
    return [
        (b, b * t, c, float(verify_features(b, b * t, c) @ TRUE) * (1 + noise * rng.standard_normal()))
        for b, t, c in GRID
    ]


def max_relative_error(model: CostModel) -> float:
    errs = [abs(model.predict(b, t - 1, c) / float(verify_features(b, b * t, c) @ TRUE) - 1) for b, t, c in GRID]
    return max(errs)


def test_fit_recovers_synthetic_step_time():
    fitted = CostModel.fit(synthetic_samples(noise=0.02))
    assert max_relative_error(fitted) < 0.05
    assert max_relative_error(default_cost_model()) > 0.05  # negative control: a different model is caught


def test_the_bend_is_priced_where_a_straight_line_would_miss_it(monkeypatch):
    """A step flat for a few tokens and steep after: the fit prices short verifies (what speculation at small
    batch is made of) to within 5%. Negative control: the same fit without the hinge terms, the straight line
    the model used to be, overprices them by far."""
    fitted = CostModel.fit(synthetic_samples(noise=0.02))
    short = [(1, t, 256) for t in (1, 2, 3, 4)]  # batch 1, 1-4 tokens

    def worst(model: CostModel) -> float:
        return max(
            abs(model.predict(b, t - 1, c) / float(verify_features(b, b * t, c) @ TRUE) - 1) for b, t, c in short
        )

    assert worst(fitted) < 0.05
    samples = synthetic_samples(noise=0.02)  # the truth, computed with the hinges
    with monkeypatch.context() as m:
        m.setattr(cost_module, "KNEES", ())  # the fault: verify_features without its hinge terms
        line = CostModel.fit(samples)
    assert worst(CostModel.linear(*line.verify_coef)) > 0.15


def test_each_rows_cache_read_is_priced(monkeypatch):
    """Many rows of one token over long contexts read many caches: the fit prices batch 8 x 1 token at 1500
    cached tokens to within 5%. Negative control: the fit without the per-row read (its feature zeroed, the
    model as it was) charges context per token only and underprices those steps by far."""
    samples = synthetic_samples(noise=0.02)  # the truth, with the per-row read
    long_rows = [(b, 1, 1500) for b in (4, 8)]

    def worst(model: CostModel) -> float:
        return max(
            abs(model.predict(b, t - 1, c) / float(TRUE @ verify_features(b, b * t, c)) - 1) for b, t, c in long_rows
        )

    assert worst(CostModel.fit(samples)) < 0.05
    real = cost_module.verify_features
    monkeypatch.setattr(cost_module, "verify_features", lambda b, n, c: real(b, n, c) * (np.arange(len(TRUE)) < 7))
    assert worst(CostModel.fit(samples)) > 0.10


def test_nnls_never_goes_negative():
    # y depends on the first column only, with noise that unconstrained least squares fits with a negative weight.
    x = np.array([[1.0, 0.0], [1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    y = np.array([1.0, 0.9, 0.8, 0.7])
    assert np.linalg.lstsq(x, y, rcond=None)[0][1] < 0
    w = nnls(x, y)
    assert np.all(w >= 0) and w[1] == 0 and w[0] == pytest.approx(0.85)


def subset_by_subset(gram: np.ndarray, xty: np.ndarray) -> np.ndarray:
    """NNLS as the feasible optimum over every column subset, solved one subset at a time (the reference)."""
    best, best_obj = np.zeros(len(xty)), 0.0
    for r in range(1, len(xty) + 1):
        for cols in itertools.combinations(range(len(xty)), r):
            idx = list(cols)
            w = np.linalg.pinv(gram[np.ix_(idx, idx)]) @ xty[idx]
            obj = float(w @ gram[np.ix_(idx, idx)] @ w - 2 * xty[idx] @ w)
            if np.all(w >= 0) and obj < best_obj - 1e-9 * abs(obj):
                best, best_obj = np.zeros(len(xty)), obj
                best[idx] = w
    return best


@pytest.mark.parametrize("features", [4, 8])
def test_the_stacked_nnls_solves_as_one_subset_at_a_time(features):
    """All subsets solved in one stacked pseudo-inverse give the reference's coefficients on well-posed problems,
    and where two columns are the same (singular), the reference's objective with the fewest columns."""
    rng = np.random.default_rng(features)
    for trial in range(200):
        x = rng.random((int(rng.integers(features + 1, 20)), features)) * rng.choice([0.01, 1.0, 100.0])
        singular = trial % 2 == 1
        if singular:
            x[:, 1] = 4.0 * x[:, 0]
        y = x @ (rng.random(features) - 0.3) + rng.normal(0.0, 0.01, len(x))
        gram, xty = x.T @ x, x.T @ y
        got, want = cost_module.nnls_gram(gram, xty), subset_by_subset(gram, xty)
        if singular:
            assert got @ gram @ got - 2 * xty @ got == pytest.approx(want @ gram @ want - 2 * xty @ want, rel=1e-9)
            assert np.count_nonzero(got) <= np.count_nonzero(want)
        else:
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-12)


def test_the_vector_prices_are_the_scalar_ones():
    """predict_many, predict_tokens_many, predict_draft_many and predict_one_row price each entry as the scalar
    methods do, at batch 1 and 8, padded and packed; a few prices at once go one at a time through the scalar
    methods' Python floats, more through the feature matrices (`FEW_PRICES`), and both agree."""
    model = CostModel(TRUE.copy(), draft_coef=np.array([8e-3, 1e-3, 0.5e-3, 2e-3]), correction=1.1)
    model.extra_scales = np.linspace(0.3, 1.2, len(model.extra_scales))
    for ks, packed in itertools.product((np.arange(9), np.arange(cost_module.FEW_PRICES * 4)), (False, True)):
        model.packed = packed
        for b, c in ((1, 100.0), (8, 3000.0)):
            np.testing.assert_allclose(model.predict_many(b, ks, c), [model.predict(b, k, c) for k in ks])
            np.testing.assert_allclose(model.predict_draft_many(b, ks, c), [model.predict_draft(b, k, c) for k in ks])
            np.testing.assert_allclose(
                model.predict_tokens_many(b, b + ks, c), [model.predict_tokens(b, b + k, c) for k in ks]
            )
            one = [model.predict_rows(np.array([k] + [0] * (b - 1)), c) for k in ks]
            np.testing.assert_allclose(model.predict_one_row(b, ks, c), one)


def test_online_correction_heals_a_wrong_profile():
    model = CostModel.fit(synthetic_samples(noise=0.0))
    truth = 2.0 * model.predict(4, 3, 300)  # the machine is twice as slow as when it was profiled
    assert model.predict(4, 3, 300) == pytest.approx(truth / 2)
    for _ in range(60):
        model.observe(4, 3, 300, truth, 0.0)
    assert model.predict(4, 3, 300) == pytest.approx(truth, rel=0.02)


def pair_like() -> CostModel:
    """A profile shaped as the Qwen2.5-Coder 1.5B's at batch 1: 30 ms a step and 6 ms a token, 0.5 ms more a
    token per 1,000 cached tokens (a verify's extra tokens are ~15% of a step each, not TRUE's ~4%)."""
    return CostModel.linear(30e-3, 0.0, 6e-3, 0.5e-3)


def truth_at(extra_true) -> CostModel:
    """`pair_like` on a machine where a plain step costs 1.2x its price and the tokens past one a row extra_true
    x theirs (one factor, or one for each extra width 0..EXTRA_WIDTHS)."""
    truth = pair_like()
    truth.correction = 1.2
    truth.extra_scales = np.broadcast_to(np.asarray(extra_true, dtype=float), truth.extra_scales.shape).copy()
    return truth


def observed_at(extra_true, steps: int, stall_at: int = -1) -> CostModel:
    """`pair_like` observed at batch 1 and 2,048 cached tokens on `truth_at(extra_true)` (a factor of 0.25: the
    1.5B's second token, +1.5 ms where the load-time fit priced +5.7), steps of K = 0-4 in turn, 2% noise; step
    `stall_at` takes 10x its time."""
    model, truth = pair_like(), truth_at(extra_true)
    rng = np.random.default_rng(0)
    for i in range(steps):
        k = i % 5
        seconds = truth.predict_verify(1, k, 2048) * (1 + 0.02 * rng.standard_normal()) * (10 if i == stall_at else 1)
        model.observe(1, k, 2048, seconds, 0.0)
    return model


def extra_error(model: CostModel, extra_true) -> float:
    """Relative error of the model's price of the tokens past one a row, K = 1-4 at 2,048 cached tokens."""
    truth = truth_at(extra_true)
    plain, true_plain = model.predict_verify(1, 0, 2048), truth.predict_verify(1, 0, 2048)
    return max(
        abs((model.predict_verify(1, k, 2048) - plain) / (truth.predict_verify(1, k, 2048) - true_plain) - 1)
        for k in range(1, 5)
    )


def test_the_price_of_tokens_past_one_a_row_is_learned_apart_from_the_level(monkeypatch):
    """The tokens a verify adds cost a quarter of their calibrated price, a plain step 1.2x its: after 60 steps
    the extra tokens are priced within 35% of what they cost, a plain step within 3%. Control: the level alone
    (no width's factor ever learned) prices the extra tokens at ~4x what they cost."""
    model = observed_at(0.25, 60)
    assert model.predict_verify(1, 0, 2048) == pytest.approx(truth_at(0.25).predict_verify(1, 0, 2048), rel=0.03)
    assert extra_error(model, 0.25) < 0.35
    monkeypatch.setattr(CostModel, "_observe_extra", lambda self, base, extra, seconds, width: None)
    assert extra_error(observed_at(0.25, 60), 0.25) > 2.0


def test_each_extra_width_is_priced_on_its_own(monkeypatch):
    """A second token a row at 0.3 of its calibrated price and every further one at 0.9 (the pair's curve bends
    there): after 60 steps of K = 0-4 each width is priced within 35% of what it costs. Control: one factor for
    every width (each width's own median given no weight) prices the second token at ~3x what it costs."""
    shape = [1.0, 0.3] + [0.9] * (len(pair_like().extra_scales) - 2)
    assert extra_error(observed_at(shape, 60), shape) < 0.35
    monkeypatch.setattr(cost_module, "WIDTH_PRIOR", 1e9)
    assert extra_error(observed_at(shape, 60), shape) > 1.5


def test_one_stalled_step_barely_moves_the_extra_tokens_price(monkeypatch):
    """A verify of two drafts that stalls at 10x its time moves `extra_scales` by less than 0.1 (one place in a
    median of 16). Control: a (weighted) mean in place of the median, the same stall moves one by more than 1."""
    steady = observed_at(0.25, 40).extra_scales
    assert np.abs(observed_at(0.25, 40, stall_at=37).extra_scales - steady).max() < 0.1
    monkeypatch.setattr(cost_module, "weighted_median", lambda v, w: float(np.average(v, weights=w)))
    stalled = observed_at(0.25, 40, stall_at=37).extra_scales
    assert np.abs(stalled - observed_at(0.25, 40).extra_scales).max() > 1.0


def refit_whole(model: CostModel) -> np.ndarray:
    """The factors `model`'s windows give when refit from nothing (no ratios or level kept from earlier refits)."""
    fresh = copy.deepcopy(model)
    fresh._extra_level, fresh._extra_fits = 0.0, {}
    fresh._refit_extra(set(fresh._extra_steps))
    return fresh._extra_scales


def refit_drift(steps: int = 300) -> float:
    """The most `extra_scales` differs from `refit_whole` over a stream of plain verifies in runs and verifies of
    1, 2 and 4 drafts (2% noise), read after every step as `goodput` reads them."""
    model, truth = pair_like(), truth_at(0.4)
    rng = np.random.default_rng(1)
    worst = 0.0
    for _ in range(steps):
        k = int(rng.choice([0, 0, 0, 1, 2, 4]))
        model.observe(1, k, 2048, truth.predict_verify(1, k, 2048) * (1 + 0.02 * rng.standard_normal()), 0.0)
        if model._plain_levels and model._extra_steps:  # both kinds seen: factors are fitted from here on
            worst = max(worst, float(np.abs(model.extra_scales - refit_whole(model)).max()))
    return worst


def test_a_refit_is_skipped_only_where_nothing_it_rests_on_moved(monkeypatch):
    """After plain verifies alone that left the level where it was, `_refit_extra` keeps the factors it has; after
    every step they equal a refit from nothing, to the bit. Control: a refit that takes the level as unmoved after
    plain verifies (the skip's condition faulted) leaves stale factors, off by more than 0.01."""
    assert refit_drift() == 0.0
    refit = CostModel._refit_extra

    def level_taken_as_unmoved(self: CostModel, widths: set[int]) -> None:
        if widths <= {0} and self._extra_fits:
            self._extra_level = statistics.median(self._plain_levels)
        refit(self, widths)

    monkeypatch.setattr(CostModel, "_refit_extra", level_taken_as_unmoved)
    assert refit_drift() > 0.01


def test_draft_cost_is_learned_online():
    model = default_cost_model()
    assert model.predict_draft(4, 3) == 0.0  # the prior assumes free drafting (n-gram)
    for b, k in [(1, 2), (4, 3), (2, 5), (8, 1)] * 10:
        model.observe(b, k, 100, model.predict_verify(b, k, 100), 1e-3 * k + 0.5e-3 * b * k)
    assert model.predict_draft(4, 4) == pytest.approx(1e-3 * 4 + 0.5e-3 * 16, rel=0.02)


def draft_priced_at(contexts: tuple[float, ...]) -> CostModel:
    """A model seeded from steady draft steps timed at `contexts` (as the pair probe does), where a drafted
    token costs 10 ms plus 2 ms per 1,000 cached tokens (its attention reads the row's cache)."""
    model = default_cost_model()
    for c in contexts:
        model.seed_draft(10e-3 + 2e-3 * c / 1000, weight=4.0 / len(contexts), context=c)
    return model


def test_a_draft_models_attention_is_priced_from_two_contexts(monkeypatch):
    """Seeded at 100 and 2,048 cached tokens, the price of a draft at 8,192 is 26 ms, the truth; seeded at the
    short context only (the probe as it was), it is the short price, 10.2 ms: K drafts at 8k would look 2.5x
    cheaper than they are. A control without the context term, seeded at both, splits the difference."""
    truth = 10e-3 + 2e-3 * 8.192
    both = draft_priced_at((100, 2048))
    assert both.predict_draft(1, 1, 8192) == pytest.approx(truth, rel=0.02)
    assert both.predict_draft(1, 4, 100) == pytest.approx(4 * 10.2e-3, rel=0.02)
    assert draft_priced_at((100,)).predict_draft(1, 1, 8192) < 0.5 * truth
    real = cost_module.draft_features
    monkeypatch.setattr(cost_module, "draft_features", lambda b, k, c=0.0: real(b, k, c) * np.array([1, 1, 1, 0]))
    assert draft_priced_at((100, 2048)).predict_draft(1, 1, 8192) < 0.6 * truth


def test_a_windowed_draft_costs_no_more_past_its_window():
    """A draft that attends to its sink and last 8,192 tokens (drafters/draft_window.py) costs at 16k what it
    costs at 8,196. Control: without the cap, 16k is priced 1.3x dearer."""
    windowed = draft_priced_at((100, 2048))
    windowed.draft_context_cap = 8196
    assert windowed.predict_draft(1, 2, 16384) == pytest.approx(windowed.predict_draft(1, 2, 8196))
    whole = draft_priced_at((100, 2048))
    assert whole.predict_draft(1, 2, 16384) > 1.3 * windowed.predict_draft(1, 2, 16384)


def test_online_draft_steps_at_a_long_context_are_learned_there():
    """Steps observed at 4,096 cached tokens teach the price there, whatever the seed said."""
    model = draft_priced_at((100,))
    for k in [1, 2, 3] * 10:
        model.observe(1, k, 4096, model.predict_verify(1, k, 4096), (10e-3 + 2e-3 * 4.096) * k)
    assert model.predict_draft(1, 2, 4096) == pytest.approx(2 * (10e-3 + 2e-3 * 4.096), rel=0.05)


def busy_seed_after(steps: list[float]) -> CostModel:
    """A draft priced at 2.5x its cost (seeded at 100 and 2,048 tokens while the machine was busy: 25 ms a draft,
    plus 5 per 1,000 cached), then one-draft steps at 100 tokens measured at each of `steps` seconds."""
    model = default_cost_model()
    for c in (100, 2048):
        model.seed_draft(2.5 * (10e-3 + 2e-3 * c / 1000), weight=2.0, context=c)
    for seconds in steps:
        model.observe(1, 1, 100, model.predict_verify(1, 1, 100), seconds)
    return model


def test_a_seeded_draft_price_takes_the_level_its_first_drafting_steps_measure(monkeypatch):
    """One steady step at the true 10.2 ms brings a 2.5x seed to it, and the seed's attention slope scales with it
    (20 ms at 5,000 tokens, never measured); a stalled first step (5x) is outvoted by the next two. Control, the
    level check removed: after the same step the price is still the seed's, 2.5x the truth."""
    truth = 10e-3 + 2e-3 * 0.1
    assert busy_seed_after([truth]).predict_draft(1, 1, 100) == pytest.approx(truth, rel=0.05)
    assert busy_seed_after([truth]).predict_draft(1, 1, 5000) == pytest.approx(10e-3 + 2e-3 * 5, rel=0.05)
    assert busy_seed_after([5 * truth, truth, truth]).seed_level == pytest.approx(0.4)
    monkeypatch.setattr(cost_module, "SEED_CHECKS", 0)
    assert busy_seed_after([truth]).predict_draft(1, 1, 100) > 2 * truth


def draft_refits(monkeypatch, every: int) -> int:
    """NNLS solves of the draft coefficients over 64 drafting steps, refitting every `every`-th."""
    calls = []
    real = cost_module.nnls_gram
    monkeypatch.setattr(cost_module, "nnls_gram", lambda g, xty: calls.append(1) or real(g, xty))
    model = default_cost_model()
    model.draft_refit_every = every
    for b, k in [(1, 2), (4, 3), (2, 5), (8, 1)] * 16:
        model.observe(b, k, 100, model.predict_verify(b, k, 100), 1e-3 * k + 0.5e-3 * b * k)
    assert model.predict_draft(4, 4) == pytest.approx(1e-3 * 4 + 0.5e-3 * 16, rel=0.02)  # learned all the same
    return len(calls)


def test_draft_cost_refits_every_eighth_step_once_warm(monkeypatch):
    """Four refits while warming up (its 1st, 2nd, 4th and 8th drafting steps), then one per eight steps (a refit
    costs ~1.5% of a small step), and the price is learned all the same. Control: a refit on every step solves 64
    times."""
    assert draft_refits(monkeypatch, 8) == 4 + 7
    assert draft_refits(monkeypatch, 1) == 64


def test_profile_round_trips(tmp_path):
    model = CostModel.fit(synthetic_samples(noise=0.01), FP)
    path = model.save(tmp_path / "p.json")
    loaded = CostModel.load(path, expect=FP)
    np.testing.assert_allclose(loaded.verify_coef, model.verify_coef)
    assert loaded.fingerprint == FP
    assert "date" in json.loads(path.read_text())


@pytest.mark.parametrize(
    "content",
    ["{not json", json.dumps({"version": 1, "verify": {"intercept": 1.0}}), json.dumps({"version": 99})],
    ids=["garbage", "missing-terms", "wrong-version"],
)
def test_corrupt_profile_warns_and_falls_back(tmp_path, content):
    path = tmp_path / "p.json"
    path.write_text(content)
    with pytest.raises(ProfileError):
        CostModel.load(path)
    with pytest.warns(UserWarning, match="calibration profile"):
        model = load_or_default(path, FP)
    np.testing.assert_array_equal(model.verify_coef, default_cost_model().verify_coef)


def test_mismatched_profile_warns_and_falls_back(tmp_path):
    path = CostModel.fit(synthetic_samples(noise=0.0), FP).save(tmp_path / "p.json")
    other = {**FP, "dtype": "bfloat16"}
    with pytest.raises(ProfileError, match="dtype"):
        CostModel.load(path, expect=other)
    with pytest.warns(UserWarning):
        model = load_or_default(path, other)
    np.testing.assert_array_equal(model.verify_coef, default_cost_model().verify_coef)
    np.testing.assert_allclose(load_or_default(path, FP).verify_coef, TRUE, rtol=1e-6)  # the matching one loads


def test_negative_coefficients_are_rejected(tmp_path):
    path = CostModel.linear(1.0, 0.0, -1.0, 0.0).save(tmp_path / "p.json")
    with pytest.raises(ProfileError, match="non-negative"):
        CostModel.load(path)


def test_missing_profile_is_silently_the_prior(tmp_path, recwarn):
    """The prior follows the compiled step's batch-1 curve at context 256 (results/cost_attention.md: 25.3, 26.3
    and 28.1 ms at 1, 3 and 9 tokens)."""
    model = load_or_default(tmp_path / "absent.json", FP)
    assert model.predict(1, 0, 256) == pytest.approx(25.3e-3, rel=0.05)
    assert model.predict(1, 2, 256) == pytest.approx(26.3e-3, rel=0.05)
    assert model.predict(1, 8, 256) == pytest.approx(28.1e-3, rel=0.05)
    assert not recwarn.list


def numpy_draft_fit(model: CostModel, steps: list[tuple[int, int, float, float]]) -> np.ndarray:
    """[D] the draft coefficients of the online regression as numpy computes it (the arrays' own products and sums),
    after `steps` of (rows, K, context, seconds) from `model`'s seed: the reference for the Python-float update."""
    xtx, xty = np.array(model._draft_xtx), np.array(model._draft_xty)  # [D, D], [D]
    seed_xtx, seed_xty = np.array(model._seed_xtx), np.array(model._seed_xty)
    d = model.draft_decay
    for rows, k, context, seconds in steps:
        x = cost_module.draft_features(rows, k, model.draft_context(context))  # [D]
        xtx, xty = d * xtx + np.outer(x, x), d * xty + x * seconds
        seed_xtx, seed_xty = d * seed_xtx, d * seed_xty
    return cost_module.nnls_gram(xtx + seed_xtx, xty + model.seed_level * seed_xty)


def draft_fit_mismatches(cases: int = 100) -> int:
    """Random seeds and drafting steps (1-8 rows, K 1-8, up to 16k cached tokens): how often the draft coefficients
    the model learns differ, in any bit, from numpy's regression on the same steps."""
    rng = np.random.default_rng(3)
    wrong = 0
    for _ in range(cases):
        model = default_cost_model()
        model.seed_draft(float(rng.uniform(1e-3, 20e-3)), context=float(rng.uniform(0, 4000)))
        model.draft_refit_every = 1  # a refit after every step: compare every fit
        start = CostModel(model.verify_coef, model.draft_coef.copy())
        start._seed_xtx, start._seed_xty = model._seed_xtx, model._seed_xty
        steps = [
            (int(rng.integers(1, 9)), int(rng.integers(1, 9)), rng.uniform(0, 16384), rng.uniform(1e-3, 0.1))
            for _ in range(int(rng.integers(1, 20)))
        ]
        for rows, k, context, seconds in steps:
            model.observe(rows, k, context, 0.0, seconds)
        start.seed_level = model.seed_level  # the level the first steps set (`_check_seed`)
        wrong += not np.array_equal(model.draft_coef, numpy_draft_fit(start, steps))
    return wrong


def test_the_draft_regression_in_python_floats_is_numpys(monkeypatch):
    """The online draft regression, updated in Python floats, learns numpy's coefficients bit for bit in all 100
    random cases. Control: the same update with the decay applied after adding the step (d * (xtx + x x^T)) differs
    in nearly every case."""
    assert draft_fit_mismatches() == 0
    monkeypatch.setattr(
        cost_module,
        "decayed_sums",
        lambda d, xtx, xty, x, y: (
            [[d * (a + xi * xj) for a, xj in zip(row, x, strict=True)] for row, xi in zip(xtx, x, strict=True)],
            [d * (a + xi * y) for a, xi in zip(xty, x, strict=True)],
        ),
    )
    assert draft_fit_mismatches() >= 90
