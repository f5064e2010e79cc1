"""How drafters with a cache of their own catch up on tokens they have not seen, one bounded chunk per step.

The engine prefills a prompt `max_num_batched_tokens` tokens per step so that a long prompt never freezes the others'
decoding; a drafter's own prefill (a draft model's cache, EAGLE's head cache) keeps the same promise. Each step
a drafter feeds its rows' backlogs within one budget, shortest first: rows that only lag by the last step's
tokens are always served, and a newcomer's prompt is spread over as many steps as it needs. A row drafts only
once it has caught up.
"""

from __future__ import annotations


def share_budget(backlogs: list[int], budget: int) -> list[int]:
    """Tokens to feed each row this step: whole backlogs, shortest first, then what is left of `budget`."""
    take = [0] * len(backlogs)
    for b in sorted(range(len(backlogs)), key=backlogs.__getitem__):
        take[b] = min(backlogs[b], budget)
        budget -= take[b]
    return take
