"""Grouping ragged rows so that padding to a group's longest row stays bounded."""

from __future__ import annotations

from collections.abc import Sequence


def pad_groups(lengths: list[int], slack: int) -> list[list[int]]:
    """Indices of ragged rows, longest first, grouped so that no row of a group is padded by more than `slack`.

    Work padded to a batch's longest row costs what real work costs; a group of its own costs one more call.
    The engine groups prefill chunks by length (a 480-token chunk beside a 32-token one ran 448 tokens of
    padding), the attention op groups rows by attended length (one long prompt in a batch made every row
    read as many cached keys as it).
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups: list[list[int]] = []
    for i in order:
        if groups and lengths[groups[-1][0]] - lengths[i] <= slack:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def verify_tokens(drafts: Sequence[int], width: int, packed: bool) -> int:
    """Tokens a verify of drafts[i] drafts on row i computes (each row also scores its pending token): the rows'
    own where the model runs real tokens alone (models/llama.packs_rows), else every row padded to `width` drafts."""
    return sum(drafts) + len(drafts) if packed else len(drafts) * (width + 1)
