"""Tree verification, unit level: the emitted tokens follow the target exactly, for deterministic and sampled
siblings.

A two-level tree (root -> 2 children -> one child each) goes through the real `verify_tree` for many rows at
once. The joint of the first two emitted tokens is checked against a virtual target whose second-position
logits depend on the first token; when verification emits one token only, the second is drawn as the next
(plain) step would. Siblings are the draft's top 2 (deterministic: the exponential race, or the same drafts with
their one-hot q given explicitly: the residual walk) or i.i.d. samples of q. Each negative control injects a
fault into the real code path and must fail the same assertion by a wide margin (tests/stats.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

import specdecode.verify.streams
import specdecode.verify.tree
from specdecode.config import SamplingParams
from specdecode.drafters.base import Proposal
from specdecode.verify.chain import verify
from specdecode.verify.sampling import PAD_TOKEN_ID, SamplingTensors, process_logits
from specdecode.verify.streams import Purpose, sample
from specdecode.verify.tree import verify_tree
from specdecode.verify.tree_layout import chain_parents, check_parents, node_depths, tree_layout
from tests.stats import assert_follows
from tests.test_verify import T1, TOP_K, TOP_K_P, TOP_P, table, tensors

VOCAB = 8
N = 30_000
N_SEEDED = 15_000


def virtual_target() -> tuple[torch.Tensor, torch.Tensor]:
    """logits0 [vocab] for the first token and logits1 [vocab, vocab]: second-token logits given the first."""
    g = torch.Generator().manual_seed(0)
    return torch.randn(VOCAB, generator=g) * 1.2, torch.randn(VOCAB, VOCAB, generator=g) * 1.2


@dataclass
class Tree:
    logits: torch.Tensor  # [n, 5, vocab] target logits at (root, nodes 1..4)
    drafts: torch.Tensor  # [n, 4] nodes 1, 2 under the root; 3 under 1; 4 under 2
    parents: torch.Tensor  # [n, 4]
    probs: torch.Tensor | None  # [n, 4, vocab] q each node was drawn from; None = one-hot
    st: SamplingTensors
    params: SamplingParams
    logits1: torch.Tensor  # [vocab, vocab]


def make_tree(mode: str, params: SamplingParams, seeded: bool, n: int = 0) -> Tree:
    """n rows (by default N, or N_SEEDED for seeded rows) of one virtual target and a tree of drafts."""
    n = n or (N_SEEDED if seeded else N)
    st = tensors(params, n, seeded)
    logits0, logits1 = virtual_target()
    g = torch.Generator().manual_seed(1)
    q_logits, q1_logits = torch.randn(VOCAB, generator=g) * 1.5, torch.randn(VOCAB, VOCAB, generator=g) * 1.5
    q0, q1 = table(q_logits, params), table(q1_logits, params)  # [vocab], [vocab, vocab]
    if mode == "iid":  # i.i.d. samples of q (siblings may repeat), each child's child from q given it
        c = torch.stack([sample(q0.expand(n, -1), st, Purpose.DRAFT, j) for j in range(2)], 1)  # [n, 2]
        d = torch.stack([sample(q1[c[:, i]], st, Purpose.DRAFT, 2 + i) for i in range(2)], 1)  # [n, 2]
        probs = torch.stack([q0.expand(n, -1), q0.expand(n, -1), q1[c[:, 0]], q1[c[:, 1]]], 1)
    else:  # deterministic distinct siblings: the draft's top 2, each with its own top-1 child
        c = q_logits.topk(2).indices.expand(n, 2)  # [n, 2]
        d = q1_logits[c].argmax(-1)  # [n, 2]
        probs = None
    drafts = torch.stack([c[:, 0], c[:, 1], d[:, 0], d[:, 1]], 1)  # [n, 4]
    if mode == "topk_q":  # the same deterministic drafts, their one-hot q given: the residual walk verifies them
        probs = torch.zeros(n, 4, VOCAB).scatter_(-1, drafts[..., None], 1.0)
    levels = [logits0.expand(n, -1), logits1[c[:, 0]], logits1[c[:, 1]], torch.zeros(n, VOCAB), torch.zeros(n, VOCAB)]
    parents = torch.tensor([0, 0, 1, 2]).expand(n, 4)
    return Tree(torch.stack(levels, 1), drafts, parents, probs, st, params, logits1)


def run(tree: Tree):
    n = len(tree.drafts)
    return verify_tree(tree.logits, tree.drafts, tree.parents, torch.full((n,), 4), tree.probs, tree.st)


def joint_counts(out: torch.Tensor, tree: Tree) -> torch.Tensor:
    """Counts [vocab, vocab] of (first, second); a missing second token is drawn from the target given the first
    (from the global RNG: independent of every stream verification used)."""
    first, second = out[:, 0], out[:, 1].clone()
    missing = second == PAD_TOKEN_ID
    second[missing] = torch.multinomial(table(tree.logits1, tree.params)[first[missing]], 1)[:, 0]
    return torch.bincount(first * VOCAB + second, minlength=VOCAB * VOCAB).view(VOCAB, VOCAB)


def exact_joint(tree: Tree) -> torch.Tensor:
    return table(tree.logits[0, 0], tree.params)[:, None] * table(tree.logits1, tree.params)


CASES = {
    "topk-t1": ("topk", T1, False),
    "topk-top_p-seeded": ("topk", TOP_P, True),
    "topk-top_k": ("topk", TOP_K, False),
    "topk-top_k+top_p": ("topk", TOP_K_P, False),
    "topk_q-t1": ("topk_q", T1, False),
    "iid-t1": ("iid", T1, False),
    "iid-top_p-seeded": ("iid", TOP_P, True),
    "iid-top_k": ("iid", TOP_K, False),
    "iid-top_k+top_p": ("iid", TOP_K_P, False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_tree_follows_target(case):
    tree = make_tree(*CASES[case])
    out = run(tree)
    assert_follows(joint_counts(out.output_token_ids, tree), exact_joint(tree))
    assert 0.2 < out.num_accepted.float().mean() < 1.8  # the tree is really exercised: some accepted, some not
    assert (out.path[:, 0] == 1).any()  # and the second sibling is accepted too


def unnormalised_residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    res = (p - q).clamp(min=0)
    return torch.where(res.sum(-1, keepdim=True) > 0, res, p)


def uniform_root_children(tree: Tree) -> None:
    tree.probs = tree.probs.clone()
    tree.probs[:, :2] = 1.0 / VOCAB  # claim the root's children were drawn uniformly


# fault -> (case it corrupts, what it does to the real code path or to what is handed to it)
FAULTS = {
    # SpecInfer's sibling rule without its residual update: every sibling tried against the same p.
    "no residual update between siblings": (
        "topk_q-t1",
        lambda mp, t: mp.setattr(specdecode.verify.tree, "residual", lambda p, q: p),
    ),
    "residual not renormalised": (
        "iid-t1",
        lambda mp, t: mp.setattr(specdecode.verify.tree, "residual", unnormalised_residual),
    ),
    "q of the wrong sibling": ("iid-t1", lambda mp, t: uniform_root_children(t)),
    # A keying bug: the target's noise keyed without the position, so every depth of a step shares it.
    "noise shared across depths": (
        "topk-top_p-seeded",
        lambda mp, t: mp.setattr(specdecode.verify.streams, "_key", lambda purpose, origin, j: (origin,)),
    ),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_fault_is_caught(fault, monkeypatch):
    case, inject = FAULTS[fault]
    tree = make_tree(*CASES[case])
    inject(monkeypatch, tree)
    assert_follows(joint_counts(run(tree).output_token_ids, tree), exact_joint(tree), fault)


def test_greedy_table():
    """Greedy: follow the argmax down whichever branch holds it; ragged rows; the path names accepted nodes."""
    vocab = 10
    # row 0: root argmax 3, node 2 (token 3) matches, its child node 3 (token 4) matches node 2's argmax 4
    # row 1: nothing matches the root's argmax 9 -> emits 9
    drafts = torch.tensor([[5, 3, 4, 7], [1, 2, PAD_TOKEN_ID, PAD_TOKEN_ID]])
    parents = torch.tensor([[0, 0, 2, 1], [0, 0, 0, 0]])
    argmax = torch.tensor([[3, 0, 4, 8, 0], [9, 0, 0, 0, 0]])  # per tree position
    logits = torch.full((2, 5, vocab), -5.0).scatter_(-1, argmax[..., None], 5.0)
    st = SamplingTensors.from_params([SamplingParams()] * 2, "cpu")
    out = verify_tree(logits, drafts, parents, torch.tensor([4, 2]), None, st)
    assert out.num_accepted.tolist() == [2, 0]
    assert out.output_token_ids.tolist() == [[3, 4, 8, -1, -1], [9, -1, -1, -1, -1]]
    assert out.path.tolist() == [[1, 2, -1, -1], [-1, -1, -1, -1]]


@pytest.mark.parametrize(("temperature", "sampled_q"), [(0.0, False), (1.0, False), (1.0, True)])
def test_chain_tree_equals_chain_verify(temperature, sampled_q):
    """A chain given as a tree gives exactly what the chain rule gives, draw for draw (seeded rows)."""
    k, rows = 4, 64
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(rows, k + 1, VOCAB, generator=g) * 2
    params = [SamplingParams(temperature=temperature, seed=i) for i in range(rows)]
    st = SamplingTensors.from_params(params, "cpu", list(range(100, 100 + rows)))
    q = process_logits(logits[:, 1:] + torch.randn(rows, k, VOCAB, generator=g), st)  # [rows, k, vocab]
    drafts = torch.stack([sample(q[:, j], st, Purpose.DRAFT, j) for j in range(k)], 1)
    num = torch.randint(0, k + 1, (rows,), generator=g)
    drafts = drafts.masked_fill(torch.arange(k)[None] >= num[:, None], PAD_TOKEN_ID)
    probs = q if sampled_q else None
    a = verify(logits, drafts, num, probs, st)
    b = verify_tree(logits, drafts, chain_parents(rows, k, "cpu"), num, probs, st)
    assert torch.equal(a.num_accepted, b.num_accepted)
    assert torch.equal(a.output_token_ids, b.output_token_ids)
    assert 0 < int(a.num_accepted.sum()) < int(num.sum())


def test_one_hot_tree_emits_the_target_sample_of_each_position():
    """Seeded, deterministic siblings: whichever tree is proposed, the emitted tokens are the target's own keyed
    samples (here: the first token equals what plain decoding at the same position emits)."""
    tree = make_tree("topk", T1, seeded=True, n=2000)
    plain = verify(
        tree.logits[:, :1], tree.drafts[:, :0], torch.zeros(len(tree.drafts), dtype=torch.long), None, tree.st
    )
    assert torch.equal(run(tree).output_token_ids[:, 0], plain.output_token_ids[:, 0])


def test_tree_layout():
    parents = torch.tensor([[0, 0, 2, 1, 3]])
    depth, mask = tree_layout(parents, torch.tensor([5]))
    assert depth.tolist() == [[0, 1, 1, 2, 2, 3]]
    assert torch.equal(node_depths(parents, torch.tensor([5])), depth)
    assert mask[0, 5].nonzero()[:, 0].tolist() == [0, 2, 3, 5]  # node 5: root, node at pos 2, pos 3, itself
    assert mask[0, 4].nonzero()[:, 0].tolist() == [0, 1, 4]


@pytest.mark.parametrize(
    ("parents", "num", "message"),
    [
        ([[0, 2]], [2], "row 0, node 1 has parent 2"),  # a parent after its child
        ([[0, 1], [0, 0], [-1, 0]], [2, 2, 1], "row 2, node 0 has parent -1"),  # a negative parent
        ([[0, 1]], [3], "node counts"),  # more nodes than the proposal holds
    ],
)
def test_malformed_trees_are_refused_at_the_drafter_boundary(parents, num, message):
    parents, num = torch.tensor(parents), torch.tensor(num)
    with pytest.raises(ValueError, match=message):
        check_parents(parents, num)
    ids = torch.zeros_like(parents)
    with pytest.raises(ValueError, match="malformed draft tree"):  # a Proposal cannot even be built with it
        Proposal(ids, num, None, None, parents)


def test_padded_nodes_are_not_checked():
    """Past num_nodes, parents are padding (truncated() keeps stale ones): only real nodes must be ordered."""
    check_parents(torch.tensor([[0, 1, 7]]), torch.tensor([2]))
    Proposal(torch.zeros(1, 3, dtype=torch.long), torch.tensor([2]), None, None, torch.tensor([[0, 1, 7]]))
