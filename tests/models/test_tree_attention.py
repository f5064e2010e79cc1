"""Tree attention: one forward over a token tree gives each node the logits of its own root-to-node path."""

from __future__ import annotations

import pytest
import torch

from specdecode.models.llama import AttentionMetadata, load_llama
from specdecode.step.runner import prefill
from specdecode.verify.tree_layout import tree_layout
from tests.tiny import write_tiny_model

CONTEXT = [7, 8, 9, 10, 11, 12, 13]
# root (pending token 14) -> nodes 1, 2; node 1 -> 3, 4; node 4 -> 5; node 2 -> 6
TOKENS = [14, 30, 31, 40, 41, 50, 60]
PARENTS = [0, 0, 1, 1, 4, 2]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return load_llama(write_tiny_model(tmp_path_factory.mktemp("tree"), "llama"))


def path_to(node: int) -> list[int]:
    """Tree positions from the root to `node`, inclusive."""
    path = [node]
    while path[-1] != 0:
        path.append(PARENTS[path[-1] - 1])
    return path[::-1]


def tree_logits(model, tree_mask: bool = True) -> torch.Tensor:
    cache = model.new_cache(1, 64)
    with torch.inference_mode():
        prefill(model, cache, 0, CONTEXT, chunk=64)
        depth, mask = tree_layout(torch.tensor([PARENTS]), torch.tensor([len(PARENTS)]))
        meta = AttentionMetadata.build([0], [len(CONTEXT)], len(TOKENS), "cpu", depth, mask if tree_mask else None)
        return model(torch.tensor([TOKENS]), meta, cache)[0]  # [nodes + 1, vocab]


def path_logits(model, node: int) -> torch.Tensor:
    cache = model.new_cache(1, 64)
    tokens = CONTEXT + [TOKENS[i] for i in path_to(node)]
    with torch.inference_mode():
        return prefill(model, cache, 0, tokens, chunk=64)[0, 0]  # [vocab] at the node


def test_tree_nodes_match_their_paths(model):
    got = tree_logits(model)
    for node in range(len(TOKENS)):
        assert torch.allclose(got[node], path_logits(model, node), atol=1e-4), f"node {node}"


def test_causal_mask_over_a_tree_is_detected(model):
    """Negative control: scoring the same nodes causally (siblings see each other) gives other logits."""
    got = tree_logits(model, tree_mask=False)
    assert not all(torch.allclose(got[n], path_logits(model, n), atol=1e-4) for n in range(len(TOKENS)))
