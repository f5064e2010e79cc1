"""Chain verification, unit level: the first two emitted tokens follow the processed target exactly.

The joint of the first two tokens is checked against a virtual target whose second-position logits depend on
the first token; when verification emits one token only, the second is drawn as the next plain step would.
Many rows go through the real `verify` at once: one-hot drafts (fixed in advance, as an n-gram lookup's) and
sampled drafts, under temperature, top-k and top-p, unseeded and seeded. Each negative control injects a fault
into the real code path (a monkeypatched step or a mutated distribution handed to `verify`) and must fail the
same assertion by a wide margin (tests/stats.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
import torch

import specdecode.verify.chain
import specdecode.verify.streams
from specdecode.config import SamplingParams
from specdecode.verify.chain import verify
from specdecode.verify.sampling import PAD_TOKEN_ID, SamplingTensors, non_finite_flags, process_logits
from specdecode.verify.streams import Purpose, sample
from tests.stats import assert_follows

VOCAB = 8
K = 3
N = 30_000
N_SEEDED = 20_000  # seeded rows draw from one keyed generator per row and position: slower per row


def virtual_target(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """logits0 [vocab] for the first token and logits1 [vocab, vocab]: second-token logits given the first."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(VOCAB, generator=g) * 1.2, torch.randn(VOCAB, VOCAB, generator=g) * 1.2


def tensors(params: SamplingParams, n: int, seeded: bool) -> SamplingTensors:
    """n rows of `params`; seeded rows each get their own seed (independent rows, keyed streams)."""
    st = SamplingTensors.from_params([params] * n, "cpu")
    if seeded:
        st.seeds = list(range(n))
    return st


@dataclass
class Chain:
    logits: torch.Tensor  # [n, K + 1, vocab] target logits at (pending, d_1..d_K)
    drafts: torch.Tensor  # [n, K]
    probs: torch.Tensor | None  # [n, K, vocab] processed q; None = one-hot drafts
    st: SamplingTensors
    params: SamplingParams  # every row's (seeds aside)
    logits1: torch.Tensor  # [vocab, vocab] the virtual target's second position
    q_logits: tuple[torch.Tensor, ...] = ()  # sampled drafts: q's logits [vocab], [vocab, vocab] (given d_1), [vocab]


def table(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Processed distributions of a small table of logits [..., vocab] (one row's parameters), same shape."""
    flat = logits.reshape(1, -1, VOCAB)  # [1, rows, vocab]
    return process_logits(flat, SamplingTensors.from_params([params], "cpu"))[0].view(logits.shape)


def draft_q(chain: Chain, drafts: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """[n, K, vocab] q at each draft position, processed with `params`."""
    q0, q1, q2 = (table(t, params) for t in chain.q_logits)
    n = len(drafts)
    return torch.stack([q0.expand(n, -1), q1[drafts[:, 0]], q2.expand(n, -1)], 1)


def make_chain(mode: str, params: SamplingParams, seeded: bool, n: int = 0) -> Chain:
    """n rows (by default N, or N_SEEDED for seeded rows) of one virtual target and its drafts."""
    logits0, logits1 = virtual_target()
    n = n or (N_SEEDED if seeded else N)
    st = tensors(params, n, seeded)
    g = torch.Generator().manual_seed(1)
    if mode == "sampled":  # each draft drawn from q given the drafts before it
        q_logits = tuple(torch.randn(VOCAB, *s, generator=g) * 1.5 for s in ((), (VOCAB,), ()))
        chain = Chain(torch.empty(0), torch.empty(0), None, st, params, logits1, q_logits)
        q0, q1, q2 = (table(t, params) for t in q_logits)
        d1 = sample(q0.expand(n, -1), st, Purpose.DRAFT, 0)
        d2 = sample(q1[d1], st, Purpose.DRAFT, 1)
        drafts = torch.stack([d1, d2, sample(q2.expand(n, -1), st, Purpose.DRAFT, 2)], 1)  # [n, K]
        chain.probs = draft_q(chain, drafts, params)
    else:  # one-hot: each row's drafts fixed in advance, likely and unlikely first tokens alike
        order = logits0.argsort(descending=True)
        d1 = torch.stack([order[0], order[1], order[-1], order[2]])[torch.arange(n) % 4]
        d2 = torch.where(torch.arange(n) % 3 == 0, logits1[d1].argmax(-1), torch.randint(0, VOCAB, (n,), generator=g))
        drafts = torch.stack([d1, d2, torch.randint(0, VOCAB, (n,), generator=g)], 1)  # [n, K]
        chain = Chain(torch.empty(0), drafts, None, st, params, logits1)
    chain.drafts = drafts
    later = torch.randn(VOCAB, generator=g).expand(n, K - 1, -1)  # positions 2.. are never read for two tokens
    chain.logits = torch.cat([logits0.expand(n, 1, -1), logits1[drafts[:, 0]][:, None], later], 1)
    return chain


def run(chain: Chain) -> torch.Tensor:
    return verify(chain.logits, chain.drafts, torch.full((len(chain.drafts),), K), chain.probs, chain.st)


def joint_counts(out: torch.Tensor, chain: Chain) -> torch.Tensor:
    """Counts [vocab, vocab] of (first, second); a missing second token is drawn from the target given the first
    (from the global RNG: independent of every stream verification used)."""
    first, second = out[:, 0], out[:, 1].clone()
    missing = second == PAD_TOKEN_ID
    second[missing] = torch.multinomial(table(chain.logits1, chain.params)[first[missing]], 1)[:, 0]
    return torch.bincount(first * VOCAB + second, minlength=VOCAB * VOCAB).view(VOCAB, VOCAB)


def exact_joint(chain: Chain) -> torch.Tensor:
    p0 = table(chain.logits[0, 0], chain.params)  # [vocab]
    return p0[:, None] * table(chain.logits1, chain.params)  # [vocab, vocab]


T1 = SamplingParams(temperature=1.0)
TOP_P = SamplingParams(temperature=0.8, top_p=0.9)
TOP_K = SamplingParams(temperature=1.0, top_k=3)
TOP_K_P = SamplingParams(temperature=1.2, top_k=4, top_p=0.8)
CASES = {
    "onehot-t1": ("onehot", T1, False),
    "onehot-top_p-seeded": ("onehot", TOP_P, True),
    "onehot-top_k": ("onehot", TOP_K, False),
    "onehot-top_k+top_p": ("onehot", TOP_K_P, False),
    "sampled-t1": ("sampled", T1, False),
    "sampled-top_p-seeded": ("sampled", TOP_P, True),
    "sampled-top_k": ("sampled", TOP_K, False),
    "sampled-top_k+top_p": ("sampled", TOP_K_P, False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_chain_follows_target(case):
    chain = make_chain(*CASES[case])
    out = run(chain)
    assert_follows(joint_counts(out.output_token_ids, chain), exact_joint(chain))
    assert 0.2 < out.num_accepted.float().mean() < K - 0.2  # drafts are accepted and rejected


def unfiltered(chain: Chain, **changes) -> torch.Tensor:
    """q re-processed without some of the filters the drafts were really drawn with."""
    return draft_q(chain, chain.drafts, replace(chain.params, **changes))


# fault -> (case it corrupts, what it does to the real code path or to what is handed to it)
FAULTS = {
    # A keying bug: the target's noise keyed without the position, so every position of a step shares it.
    "noise shared across positions": (
        "onehot-top_p-seeded",
        lambda mp, c: mp.setattr(specdecode.verify.streams, "_key", lambda purpose, origin, j: (origin,)),
    ),
    # The classic: at a rejection, emit a sample of p instead of the residual max(0, p - q).
    "recovered from p, not the residual": (
        "sampled-t1",
        lambda mp, c: mp.setattr(specdecode.verify.chain, "residual", lambda p, q: p),
    ),
    "q reported without top-p": ("sampled-top_k+top_p", lambda mp, c: setattr(c, "probs", unfiltered(c, top_p=1.0))),
    "q reported without top-k": ("sampled-top_k", lambda mp, c: setattr(c, "probs", unfiltered(c, top_k=0))),
    # Reporting q = p makes every draft the target could emit accepted: the drafts' own law comes out.
    "q reported as p": ("sampled-t1", lambda mp, c: setattr(c, "probs", process_logits(c.logits[:, :K], c.st))),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_fault_is_caught(fault, monkeypatch):
    case, inject = FAULTS[fault]
    chain = make_chain(*CASES[case])
    inject(monkeypatch, chain)
    assert_follows(joint_counts(run(chain).output_token_ids, chain), exact_joint(chain), fault)


@pytest.mark.parametrize("mode", ["onehot", "sampled"])
def test_seeded_row_ignores_batch_and_padding(mode):
    """A seeded row's tokens are the same alone, beside other rows, and padded wider (defect 5)."""
    chain = make_chain(mode, SamplingParams(temperature=1.0), seeded=True, n=400)
    rows = torch.arange(0, 400, 7)  # seeded rows, verified one by one and then together
    alone = [run(sub_chain(chain, [int(r)])).output_token_ids[0] for r in rows]
    together = run(sub_chain(chain, rows.tolist())).output_token_ids
    assert torch.equal(torch.stack(alone), together)
    wide = sub_chain(chain, rows.tolist())
    wide.logits = torch.cat([wide.logits, wide.logits[:, -1:].expand(-1, 2, -1)], 1)  # two more padded positions
    wide.drafts = torch.cat([wide.drafts, torch.full((len(rows), 2), PAD_TOKEN_ID)], 1)
    if wide.probs is not None:
        wide.probs = torch.cat([wide.probs, wide.probs[:, -1:].expand(-1, 2, -1)], 1)
    out = verify(wide.logits, wide.drafts, torch.full((len(rows),), K), wide.probs, wide.st).output_token_ids
    assert torch.equal(out[:, : K + 1], together)


def test_one_hot_drafts_do_not_change_a_seeded_token():
    """With one-hot drafts every emitted token is the target's own keyed sample: any drafts, or none, emit the
    same first token at the same position (so K never changes a seeded request's text)."""
    chain = make_chain("onehot", SamplingParams(temperature=1.0), seeded=True, n=2000)
    none = verify(chain.logits[:, :1], chain.drafts[:, :0], torch.zeros(2000, dtype=torch.long), None, chain.st)
    assert torch.equal(run(chain).output_token_ids[:, 0], none.output_token_ids[:, 0])


def sub_chain(chain: Chain, rows: list[int]) -> Chain:
    st = SamplingTensors.from_params([replace(chain.params, seed=chain.st.seeds[r]) for r in rows], "cpu")
    probs = None if chain.probs is None else chain.probs[rows]
    return Chain(chain.logits[rows], chain.drafts[rows], probs, st, chain.params, chain.logits1, chain.q_logits)


def test_greedy_table():
    """Greedy rows: drafts equal to the argmax are accepted, the first mismatch emits the argmax, ragged rows."""
    vocab = 10
    logits = torch.full((3, 4, vocab), -5.0)
    argmax = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8], [9, 0, 1, 2]])
    logits.scatter_(-1, argmax[..., None], 5.0)
    drafts = torch.tensor([[1, 2, 3], [5, 0, 7], [4, PAD_TOKEN_ID, PAD_TOKEN_ID]])
    num = torch.tensor([3, 3, 1])
    st = SamplingTensors.from_params([SamplingParams()] * 3, "cpu")
    out = verify(logits, drafts, num, None, st)
    assert out.num_accepted.tolist() == [3, 1, 0]
    assert out.output_token_ids.tolist() == [[1, 2, 3, 4], [5, 6, -1, -1], [9, -1, -1, -1]]


@pytest.mark.parametrize("sampled_q", [False, True])
def test_greedy_rows_beside_sampled_rows(sampled_q):
    """Greedy rows follow the argmax exactly even when sampled rows share the batch (and its noise)."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(64, 3, VOCAB, generator=g)
    params = [SamplingParams() if i % 2 else SamplingParams(temperature=1.0, seed=i) for i in range(64)]
    st = SamplingTensors.from_params(params, "cpu")
    argmax = logits.argmax(-1)  # [64, 3]
    drafts = torch.where(torch.arange(2)[None] == 0, argmax[:, :2], (argmax[:, :2] + 1) % VOCAB)  # right, wrong
    probs = process_logits(torch.randn(64, 2, VOCAB, generator=g), st) if sampled_q else None
    if sampled_q:  # a greedy row's q is one-hot on its draft, as a draft model would report it
        onehot = torch.zeros(64, 2, VOCAB).scatter_(-1, drafts[..., None], 1.0)
        probs = torch.where(st.temperature[:, None, None] == 0, onehot, probs)
    out = verify(logits, drafts, torch.full((64,), 2), probs, st).output_token_ids
    greedy = torch.arange(64) % 2 == 1
    assert out[greedy].tolist() == [[a[0], a[1], -1] for a in argmax[greedy].tolist()]


def greedy_cases_that_differ(cases: int = 300) -> int:
    """Random greedy batches (1-6 rows, K 0-6, ragged draft counts, drafts right for a random prefix then wrong or
    padded): in how many the all-greedy path (`greedy_verify`, lists) and the race path the same rows take beside a
    sampled row (tensors; greedy rows' p is one-hot) give other tokens or counts."""
    g = torch.Generator().manual_seed(11)
    differ = 0
    for _ in range(cases):
        rows, k = int(torch.randint(1, 7, (1,), generator=g)), int(torch.randint(0, 7, (1,), generator=g))
        logits = torch.randn(rows + 1, k + 1, VOCAB, generator=g)  # [rows + 1, k + 1, vocab]; the last row samples
        argmax = logits.argmax(-1)  # [rows + 1, k + 1]
        num = torch.randint(0, k + 1, (rows + 1,), generator=g)  # [rows + 1]
        right = torch.randint(0, k + 1, (rows + 1, 1), generator=g)  # drafts right before this position
        position = torch.arange(k)[None]  # [1, k]
        drafts = torch.where(position < right, argmax[:, :k], (argmax[:, :k] + 1) % VOCAB)
        drafts = torch.where(position < num[:, None], drafts, PAD_TOKEN_ID)  # [rows + 1, k]
        greedy = [SamplingParams()] * rows
        alone = verify(logits[:rows], drafts[:rows], num[:rows], None, SamplingTensors.from_params(greedy, "cpu"))
        mixed_st = SamplingTensors.from_params([*greedy, SamplingParams(temperature=1.0, seed=1)], "cpu")
        mixed = verify(logits, drafts, num, None, mixed_st)
        differ += alone.output_token_ids.tolist() != mixed.output_token_ids[:rows].tolist()
        differ += alone.num_accepted.tolist() != mixed.num_accepted[:rows].tolist()
    return differ


def test_greedy_verify_equals_the_race_path(monkeypatch):
    """An all-greedy batch is verified in Python lists (`greedy_verify`): its tokens and counts are the vectorised
    race path's for the same rows, bit for bit. Control: the lists' path reading one draft fewer per row differs."""
    assert greedy_cases_that_differ() == 0
    real = specdecode.verify.chain.greedy_verify
    monkeypatch.setattr(specdecode.verify.chain, "greedy_verify", lambda y, d, n: real(y, d, (n - 1).clamp(min=0)))
    assert greedy_cases_that_differ() >= 100  # 396 of 600 comparisons here


def test_non_finite_logits_raise():
    logits = torch.zeros(1, 2, VOCAB)
    logits[0, 1, 3] = float("nan")
    st = SamplingTensors.from_params([SamplingParams()], "cpu")
    with pytest.raises(RuntimeError, match="NaN or inf"):
        verify(logits, torch.tensor([[1]]), torch.tensor([1]), None, st)


@pytest.mark.parametrize("top_p", [1e-300, 1e-46, 0.3])
def test_a_vanishing_top_p_keeps_the_top_token(top_p):
    """top_p rounds to 0 in fp32 below ~1e-45: the filter must still keep the most probable token (a schema
    fuzzer sent 1e-300, the row went all -inf, its NaN probabilities drew token 0 past a grammar's mask)."""
    logits = torch.tensor([[[0.5, 3.0, -1.0, float("-inf"), 2.0]]])  # [1, 1, vocab]; token 3 masked
    st = SamplingTensors.from_params([SamplingParams(temperature=0.7, top_p=top_p)], "cpu")
    probs = process_logits(logits, st)[0, 0]
    assert torch.isfinite(probs).all() and abs(probs.sum().item() - 1.0) < 1e-6
    assert probs.argmax().item() == 1 and probs[3] == 0.0


def _planted_rows() -> tuple[torch.Tensor, list[bool]]:
    """[6, 3, 50] logits: rows with NaN, +inf, a whole row at -inf (a grammar's mask), -inf here and there, both
    NaN and +inf, and nothing; and which rows are broken (NaN or +inf)."""
    logits = torch.randn(6, 3, 50, generator=torch.Generator().manual_seed(0))
    logits[0, 2, 7] = float("nan")
    logits[1, 0, 3] = float("inf")
    logits[2] = float("-inf")
    logits[3, 1, :40] = float("-inf")
    logits[4, 0, 1], logits[4, 2, 2] = float("inf"), float("nan")
    return logits, [True, True, False, False, True, False]


def test_non_finite_rows_are_the_rows_holding_nan_or_plus_inf():
    logits, broken = _planted_rows()
    assert non_finite_flags(logits) == broken


def test_control_a_check_blind_to_the_sign_of_inf_is_caught():
    """Negative control: reading every non-finite value as broken flags the masked rows too."""
    logits, broken = _planted_rows()
    assert (~torch.isfinite(logits.flatten(1).amax(1))).tolist() != broken
