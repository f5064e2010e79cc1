"""`goodput`'s curve for a batch of one row, in Python floats: what `curve_parts` computes with numpy for any batch.

At batch 1 (the CPU's usual case) the curve is a handful of numbers, and numpy's ~25 small-array calls that build it
for a batch cost ~150-250 us a step in the engine, where the forward before them has left the caches cold
(experiments/goodput_in_engine.py): 3-4% of SmolLM2's ~6 ms step. The same sums in a loop cost a few dozen
microseconds. `test_one_rows_curve_is_the_batch_curve` keeps the two equal (to rounding: numpy's dot product may
add in another order).
"""

from __future__ import annotations


def curve_one_row(
    reach: list[float], cap: int, prices: list[float], go_on: list[float], after: list[float]
) -> tuple[list[float], list[float]]:
    """([k_max + 1] expected tokens, [k_max + 1] expected seconds) of a one-row step for each K asked.

    reach [k_max]: P(drafts 1..j accepted); cap: the drafts the row may make; prices [k_max + 1]: a step's
    seconds by the drafts made; go_on [k_max]: P(the drafter makes draft j | it made j - 1); after [k_max]: the
    same after an accepted draft (what the drafts return)."""
    k_max = len(reach)
    made, accepted, cum = 1.0, 0.0, [0.0]
    for j in range(k_max):  # expected accepted drafts when the row makes up to j + 1
        made *= after[j]
        accepted += reach[j] * made
        cum.append(accepted)
    tokens = [1.0 + cum[min(k, cap)] for k in range(k_max + 1)]
    at_least = [1.0]  # P(the row makes >= n drafts | it may make them all)
    for j in range(k_max):
        at_least.append(at_least[-1] * go_on[j])
    seconds = [_expected_price(at_least, min(cap, k), k, prices) for k in range(k_max + 1)]
    return tokens, seconds


def _expected_price(at_least: list[float], room: int, k: int, prices: list[float]) -> float:
    """Seconds of a step asked for K = k whose row may make `room` drafts: each width's price by its chance."""
    total, below = 0.0, 0.0  # below: P(the row makes <= n - 1)
    for n, price in enumerate(prices):
        at_most = 1.0 - (at_least[min(n + 1, k)] if n < room else 0.0)  # P(the row makes <= n)
        total += (at_most - below) * price
        below = at_most
    return total
