"""`curve_one_row` (Python floats, a batch of one) against the numpy curve any batch takes (`batch_curve_parts`)."""

from __future__ import annotations

import numpy as np

from specdecode.control.goodput import batch_curve_parts
from specdecode.control.one_row_curve import curve_one_row


def largest_gap(ignore_cap: bool = False, cases: int = 300) -> float:
    """The largest relative difference between the two curves' tokens and seconds over random one-row cases:
    reach, go_on and after in (0, 1), caps from 0 to k_max, prices rising with the width. ignore_cap: the fault
    of a one-row curve that lets the row make every draft asked, whatever its cap."""
    rng = np.random.default_rng(0)
    worst = 0.0
    for _ in range(cases):
        k_max = int(rng.integers(1, 9))
        reach = np.cumprod(rng.uniform(0.05, 1.0, k_max))[None]  # [1, k_max]
        cap = int(rng.integers(0, k_max + 1))
        prices = np.cumsum(rng.uniform(1e-3, 2e-2, k_max + 1))  # [k_max + 1]
        go_on, after = rng.uniform(0.2, 1.0, k_max), rng.uniform(0.2, 1.0, k_max)  # [k_max] each
        go_on[0] = after[0] = 1.0  # the first draft of a row asked for any is made
        tokens, seconds = batch_curve_parts(reach, np.array([cap]), prices, go_on, after)
        one = curve_one_row(
            reach[0].tolist(), k_max if ignore_cap else cap, prices.tolist(), go_on.tolist(), after.tolist()
        )
        for want, got in zip((tokens, seconds), one, strict=True):
            worst = max(worst, float(np.max(np.abs(np.array(got) - want) / np.abs(want))))
    return worst


def test_one_rows_curve_is_the_batch_curve():
    """Equal to rounding (numpy's dot product may add in another order) on 300 random rows; the control, a row
    whose cap is ignored, is off by far more."""
    assert largest_gap() < 1e-12
    assert largest_gap(ignore_cap=True) > 0.05
