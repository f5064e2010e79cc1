"""Fixtures the engine tests share."""

from __future__ import annotations

import pytest

from specdecode.drafters.layer_select import LayerSkipChoice
from specdecode.heads import HEAD_KINDS
from tests.engine.test_head_drafters import write_heads


@pytest.fixture(scope="session")
def drafts(tmp_path_factory, tiny_target, tiny_draft) -> dict[str, str]:
    """--draft of every method that needs one, for the tiny target: random heads of each kind, a layer-skip
    choice that drafts through its first layer of two, and the tiny draft model."""
    root = tmp_path_factory.mktemp("drafts")
    paths = {kind: str(write_heads(root / kind, tiny_target, kind, 3)) for kind in HEAD_KINDS}
    LayerSkipChoice([0], 0.5, 1.1).save(root / "skip.json")
    return paths | {"layer_skip": str(root / "skip.json"), "draft": str(tiny_draft)}
