"""Tree verification: the emitted tokens follow the target exactly, for deterministic and sampled siblings.

The joint of the first two emitted tokens is checked against a virtual target whose second-position logits
depend on the first token; when verification emits one token only, the second is drawn as the next (plain)
step would. A naive rule (accept any sibling the target likes, no residual update) must fail the same test.
"""

from __future__ import annotations

import pytest
import torch

from specdecode.config import SamplingParams
from specdecode.sampling import PAD_TOKEN_ID, SamplingTensors, process_logits, sample_from_probs
from specdecode.tree import chain_parents, check_parents, tree_layout
from specdecode.verify import verify
from specdecode.verify_tree import verify_tree
from tests.stats import fits

VOCAB = 6
N = 60_000


def virtual_target(seed: int):
    """logits0 [vocab] for the first token and logits1 [vocab, vocab]: second-token logits given the first."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(VOCAB, generator=g) * 1.2, torch.randn(VOCAB, VOCAB, generator=g) * 1.2


def two_level_tree(mode: str, st: SamplingTensors, seed: int):
    """Root -> 2 children -> each with 1 child (N = 4): drafts [N, 4], parents [N, 4], q [N, 4, vocab] | None."""
    g = torch.Generator().manual_seed(seed + 1)
    q_logits = torch.randn(VOCAB, generator=g) * 1.5
    q1_logits = torch.randn(VOCAB, VOCAB, generator=g) * 1.5
    q0 = process_logits(q_logits.expand(N, 1, -1), st)[:, 0]  # [N, vocab]
    if mode == "topk":  # deterministic distinct siblings: the draft's top 2
        c = q_logits.topk(2).indices.expand(N, 2)  # [N, 2]
        probs = None
    else:  # i.i.d. samples of q0 (siblings may repeat)
        c = torch.stack([sample_from_probs(q0, st.generators) for _ in range(2)], 1)  # [N, 2]
    q1 = [process_logits(q1_logits[c[:, i]][:, None], st)[:, 0] for i in range(2)]  # 2 x [N, vocab]
    if mode == "topk":
        d = torch.stack([q1_logits[c[:, i]].argmax(-1) for i in range(2)], 1)  # [N, 2] each child's top-1
    else:
        d = torch.stack([sample_from_probs(q1[i], st.generators) for i in range(2)], 1)  # [N, 2]
        probs = torch.stack([q0, q0, q1[0], q1[1]], 1)  # [N, 4, vocab]
    drafts = torch.stack([c[:, 0], c[:, 1], d[:, 0], d[:, 1]], 1)  # nodes 1, 2 under root; 3 under 1, 4 under 2
    parents = torch.tensor([0, 0, 1, 2]).expand(N, 4)
    return drafts, parents, probs


def tree_logits(drafts: torch.Tensor, logits0: torch.Tensor, logits1: torch.Tensor) -> torch.Tensor:
    """[N, 5, vocab] target logits at (root, nodes 1..4); nodes 3 and 4 get a third level that is never read."""
    rows = [logits0.expand(N, -1), logits1[drafts[:, 0]], logits1[drafts[:, 1]]]
    rows += [torch.zeros(N, VOCAB), torch.zeros(N, VOCAB)]
    return torch.stack(rows, 1)


def joint_counts(out_ids: torch.Tensor, logits1: torch.Tensor, st: SamplingTensors) -> torch.Tensor:
    """Counts [vocab, vocab] of (first, second); a missing second token is drawn from the target given the first."""
    first, second = out_ids[:, 0], out_ids[:, 1]
    missing = second == PAD_TOKEN_ID
    fill = sample_from_probs(process_logits(logits1[first][:, None], st)[:, 0], st.generators)
    second = torch.where(missing, fill, second)
    return torch.bincount(first * VOCAB + second, minlength=VOCAB * VOCAB).view(VOCAB, VOCAB)


def exact_joint(logits0, logits1, st1: SamplingTensors) -> torch.Tensor:
    p0 = process_logits(logits0[None, None], st1)[0, 0]  # [vocab]
    p1 = process_logits(logits1[None], st1)[0]  # [vocab, vocab]
    return p0[:, None] * p1


def naive_verify_tree(logits, drafts, parents, st) -> torch.Tensor:
    """The wrong rule: accept the first sibling with u < p(x) (one-hot q), never updating p on rejection."""
    p = process_logits(logits, st)  # [N, 5, vocab]
    u = torch.rand(N, 4)
    out = torch.full((N, 2), PAD_TOKEN_ID)
    rows = torch.arange(N)
    px = p[:, 0].gather(1, drafts[:, :2])  # [N, 2]
    acc = u[:, :2] < px
    first_child = torch.where(acc[:, 0], 0, torch.where(acc[:, 1], 1, -1))
    recovered = sample_from_probs(p[:, 0], st.generators)  # from p itself: no residual
    out[:, 0] = torch.where(first_child >= 0, drafts[rows, first_child.clamp(min=0)], recovered)
    node = first_child.clamp(min=0) + 1  # tree position of the accepted child
    below = sample_from_probs(p[rows, node], st.generators)
    out[:, 1] = torch.where(first_child >= 0, below, PAD_TOKEN_ID)
    return out


CASES = [("topk", 1.0, 1.0), ("iid", 1.0, 1.0), ("iid", 0.7, 0.9), ("topk", 1.3, 1.0)]


@pytest.mark.parametrize(("mode", "temperature", "top_p"), CASES)
def test_tree_joint_follows_target(mode, temperature, top_p):
    st = SamplingTensors.from_params([SamplingParams(temperature=temperature, top_p=top_p)] * N, "cpu")
    st1 = SamplingTensors.from_params([SamplingParams(temperature=temperature, top_p=top_p)], "cpu")
    logits0, logits1 = virtual_target(0)
    drafts, parents, probs = two_level_tree(mode, st, 0)
    out = verify_tree(tree_logits(drafts, logits0, logits1), drafts, parents, torch.full((N,), 4), probs, st)
    ok, stat, crit = fits(joint_counts(out.output_token_ids, logits1, st), exact_joint(logits0, logits1, st1))
    assert ok, f"chi2 {stat:.1f} >= {crit:.1f}"
    assert 0 < out.num_accepted.float().mean() < 2  # the tree is really exercised: some accepted, some not


def test_naive_sibling_rule_is_detected():
    """Negative control: accepting any sibling the target likes, without the residual update, is biased."""
    st = SamplingTensors.from_params([SamplingParams(temperature=1.0)] * N, "cpu")
    st1 = SamplingTensors.from_params([SamplingParams(temperature=1.0)], "cpu")
    logits0, logits1 = virtual_target(0)
    drafts, parents, _ = two_level_tree("topk", st, 0)
    out = naive_verify_tree(tree_logits(drafts, logits0, logits1), drafts, parents, st)
    assert not fits(joint_counts(out, logits1, st), exact_joint(logits0, logits1, st1))[0]


def test_q_of_the_wrong_sibling_is_detected():
    """Negative control: i.i.d. siblings verified against a q other than the one they were drawn from."""
    st = SamplingTensors.from_params([SamplingParams(temperature=1.0)] * N, "cpu")
    st1 = SamplingTensors.from_params([SamplingParams(temperature=1.0)], "cpu")
    logits0, logits1 = virtual_target(0)
    drafts, parents, probs = two_level_tree("iid", st, 0)
    wrong = probs.clone()
    wrong[:, :2] = process_logits(torch.zeros(N, 2, VOCAB), st)  # claim the root's children were uniform
    out = verify_tree(tree_logits(drafts, logits0, logits1), drafts, parents, torch.full((N,), 4), wrong, st)
    assert not fits(joint_counts(out.output_token_ids, logits1, st), exact_joint(logits0, logits1, st1))[0]


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


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_chain_tree_equals_chain_verify(temperature):
    """A chain given as a tree gives exactly what the chain rule gives, draw for draw (seeded rows)."""
    k, rows = 4, 64
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(rows, k + 1, VOCAB, generator=g) * 2
    params = [SamplingParams(temperature=temperature, seed=i) for i in range(rows)]
    st_a = SamplingTensors.from_params(params, "cpu", [torch.Generator().manual_seed(i) for i in range(rows)])
    st_b = SamplingTensors.from_params(params, "cpu", [torch.Generator().manual_seed(i) for i in range(rows)])
    q = process_logits(logits[:, 1:] + torch.randn(rows, k, VOCAB, generator=g), st_a)  # [rows, k, vocab]
    drafts = torch.stack([sample_from_probs(q[:, j], [None] * rows) for j in range(k)], 1)
    num = torch.randint(0, k + 1, (rows,), generator=g)
    drafts = drafts.masked_fill(torch.arange(k)[None] >= num[:, None], PAD_TOKEN_ID)
    probs = None if temperature == 0.0 else q
    a = verify(logits, drafts, num, probs, st_a)
    b = verify_tree(logits, drafts, chain_parents(rows, k, "cpu"), num, probs, st_b)
    assert torch.equal(a.num_accepted, b.num_accepted)
    assert torch.equal(a.output_token_ids, b.output_token_ids)


def test_tree_layout():
    parents = torch.tensor([[0, 0, 2, 1, 3]])
    depth, mask = tree_layout(parents, torch.tensor([5]))
    assert depth.tolist() == [[0, 1, 1, 2, 2, 3]]
    assert mask[0, 5].nonzero()[:, 0].tolist() == [0, 2, 3, 5]  # node 5: root, node at pos 2, pos 3, itself
    assert mask[0, 4].nonzero()[:, 0].tolist() == [0, 1, 4]
    with pytest.raises(ValueError):
        check_parents(torch.tensor([[0, 2]]))  # a parent after its child
