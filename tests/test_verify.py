"""Unit-level: the first token emitted by verification is distributed exactly as the processed target p.

Each check has a negative control: a deliberately wrong rule must fail the same statistical test.
"""

from __future__ import annotations

import pytest
import torch

from specdecode.config import SamplingParams
from specdecode.sampling import PAD_TOKEN_ID, SamplingTensors, process_logits, sample_from_probs
from specdecode.verify import verify
from tests.stats import fits

VOCAB = 10
N = 60_000


def setup(k: int, temperature: float, top_p: float, seed: int = 0):
    """N rows with the same target logits and the same draft distribution, drafts drawn from q."""
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(k + 1, VOCAB, generator=g) * 1.5).expand(N, -1, -1)  # [N, k + 1, vocab]
    draft_logits = (torch.randn(k, VOCAB, generator=g) * 1.5).expand(N, -1, -1)  # [N, k, vocab]
    st = SamplingTensors.from_params([SamplingParams(temperature=temperature, top_p=top_p)] * N, "cpu")
    q = process_logits(draft_logits, st)  # [N, k, vocab]
    drafts = torch.stack([sample_from_probs(q[:, j], st.generators) for j in range(k)], 1)  # [N, k]
    p0 = process_logits(logits[:1, :1], st)[0, 0]  # [vocab]
    return logits, draft_logits, q, drafts, st, p0


def first_token_counts(tokens: torch.Tensor) -> torch.Tensor:
    return torch.bincount(tokens, minlength=VOCAB)


CASES = [(1, 1.0, 1.0), (3, 1.0, 1.0), (3, 0.7, 1.0), (3, 1.0, 0.8), (2, 1.3, 0.6)]


@pytest.mark.parametrize(("k", "temperature", "top_p"), CASES)
def test_first_token_follows_target(k, temperature, top_p):
    logits, _, q, drafts, st, p0 = setup(k, temperature, top_p)
    out = verify(logits, drafts, torch.full((N,), k), q, st)
    ok, stat, crit = fits(first_token_counts(out.output_token_ids[:, 0]), p0)
    assert ok, f"chi2 {stat:.1f} >= {crit:.1f}"


def test_no_residual_resampling_is_detected():
    """Negative control (a): at a rejection, sampling from p instead of max(0, p - q) is biased."""
    logits, _, q, drafts, st, p0 = setup(1, 1.0, 1.0)
    u = torch.rand(N)
    accept = u * q[:, 0].gather(1, drafts[:, :1])[:, 0] < p0[drafts[:, 0]]
    wrong = torch.where(accept, drafts[:, 0], sample_from_probs(p0.expand(N, -1), [None] * N))
    assert not fits(first_token_counts(wrong), p0)[0]


def test_q_without_top_p_is_detected():
    """Negative control (b): drafts drawn from top-p-processed q, but q reported before top-p."""
    logits, draft_logits, q, drafts, st, p0 = setup(3, 1.0, 0.6)
    q_raw = draft_logits.softmax(-1)  # the draft distribution before top-p
    out = verify(logits, drafts, torch.full((N,), 3), q_raw, st)
    assert not fits(first_token_counts(out.output_token_ids[:, 0]), p0)[0]


def test_accept_always_is_detected():
    """Negative control (c): accepting every draft emits q, not p."""
    _, _, _, drafts, _, p0 = setup(1, 1.0, 1.0)
    assert not fits(first_token_counts(drafts[:, 0]), p0)[0]


def test_greedy_table():
    """Greedy rows: drafts equal to the argmax are accepted, the first mismatch emits the argmax, ragged rows."""
    logits = torch.full((3, 4, VOCAB), -5.0)
    argmax = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8], [9, 0, 1, 2]])
    logits.scatter_(-1, argmax[..., None], 5.0)
    drafts = torch.tensor([[1, 2, 3], [5, 0, 7], [4, PAD_TOKEN_ID, PAD_TOKEN_ID]])
    num = torch.tensor([3, 3, 1])
    st = SamplingTensors.from_params([SamplingParams()] * 3, "cpu")
    out = verify(logits, drafts, num, None, st)
    assert out.num_accepted.tolist() == [3, 1, 0]
    assert out.output_token_ids.tolist() == [[1, 2, 3, 4], [5, 6, -1, -1], [9, -1, -1, -1]]


def test_mixed_greedy_and_sampled_rows_and_seeds():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 3, VOCAB, generator=g)
    drafts = torch.randint(0, VOCAB, (4, 2), generator=g)
    params = [SamplingParams(), SamplingParams(temperature=1.0, seed=1), SamplingParams(), SamplingParams(0.8)]

    def run():
        gens = [None, torch.Generator().manual_seed(7), None, torch.Generator().manual_seed(9)]
        return verify(
            logits, drafts, torch.tensor([2, 2, 2, 2]), None, SamplingTensors.from_params(params, "cpu", gens)
        )

    a, b = run(), run()
    assert torch.equal(a.output_token_ids, b.output_token_ids)  # seeded rows reproduce
    greedy_first = logits[[0, 2], 0].argmax(-1)
    for row, want in zip([0, 2], greedy_first.tolist(), strict=True):
        emitted = a.output_token_ids[row]
        assert emitted[0] == want  # greedy rows follow the argmax even beside sampled rows
    valid = a.output_token_ids[a.output_token_ids != PAD_TOKEN_ID]
    assert ((valid >= 0) & (valid < VOCAB)).all()


def test_non_finite_logits_raise():
    logits = torch.zeros(1, 2, VOCAB)
    logits[0, 1, 3] = float("nan")
    st = SamplingTensors.from_params([SamplingParams()], "cpu")
    with pytest.raises(RuntimeError, match="NaN or inf"):
        verify(logits, torch.tensor([[1]]), torch.tensor([1]), None, st)
