"""Lossless verification of drafted tokens: greedy and sampled rows in one vectorised path.

Deterministic drafts (q one-hot: n-gram lookups, greedy draft models, tree candidates) are verified by the
exponential race. The target's own sample at each position t is y_t = argmax(p_t / E_t), E_t ~ Exp(1); draft x
at t is accepted iff x == y_t, and the first mismatch (or the bonus after the last draft) emits y_t. So
P(accept x) = p(x), and a mismatch emits y distributed as p without x, renormalised: the law of rejection
sampling with a one-hot q. But every emitted token is y_t itself, so with E_t keyed by (seed, t) (streams.py)
a seeded request's tokens are those of plain sampling, whatever K, batch or drafter. Greedy rows have one-hot
p: the race is exact argmax matching.

Sampled drafts (q a distribution) use rejection sampling: accept draft x at position j with probability
min(1, p_j(x) / q_j(x)); at the first rejection emit a *recovered* token from normalize(max(0, p_j - q_j)); if
every draft is accepted emit a *bonus* token from p_k. Their draws are keyed per step, so a seeded request
reproduces when its K schedule does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdecode.verify.sampling import PAD_TOKEN_ID, SamplingTensors, check_finite, process_logits
from specdecode.verify.streams import Purpose, exponentials, race, sample, uniforms


@dataclass
class VerifyResult:
    output_token_ids: torch.Tensor  # [num_seqs, k + 1] accepted drafts, one recovered/bonus token, then PAD
    num_accepted: torch.Tensor  # [num_seqs] accepted drafts; emitted tokens = num_accepted + 1
    # [num_seqs, depth] draft index of each accepted node along a tree's path, PAD past num_accepted; None for
    # chains, whose accepted drafts are simply the first num_accepted.
    path: torch.Tensor | None = None


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """normalize(max(0, p - q)) per row; p itself where nothing is left (p == q). All [..., vocab]."""
    res = (p - q).clamp(min=0)
    total = res.sum(-1, keepdim=True)
    return torch.where(total > 0, res / total.clamp(min=1e-30), p)


def target_samples(p: torch.Tensor, st: SamplingTensors) -> torch.Tensor:
    """p [num_seqs, n, vocab] at the n positions after the pending token -> [num_seqs, n] the target's own token
    at each: the race on each position's keyed noise (greedy rows' p is one-hot, so the race is their argmax;
    an all-greedy batch never gets here: verify takes the logits' argmax)."""
    return race(p, exponentials(st, Purpose.TARGET, range(p.shape[1]), p.shape[-1]))


def verify(
    target_logits: torch.Tensor,  # [num_seqs, k + 1, vocab] raw logits at (pending, d_1..d_k)
    draft_token_ids: torch.Tensor,  # [num_seqs, k] int64, PAD past num_draft_tokens
    num_draft_tokens: torch.Tensor,  # [num_seqs] int64
    draft_probs: torch.Tensor | None,  # [num_seqs, k, vocab] processed q; None = one-hot on the drafts
    st: SamplingTensors,
) -> VerifyResult:
    check_finite(target_logits)
    if st.all_greedy and target_logits.device.type == "cpu":  # in lists (an accelerator keeps its tensors)
        return greedy_verify(target_logits.argmax(-1), draft_token_ids, num_draft_tokens)
    k = target_logits.shape[1] - 1
    drafts = draft_token_ids.clamp(min=0)  # [num_seqs, k]
    valid = torch.arange(k, device=drafts.device)[None] < num_draft_tokens[:, None]  # [num_seqs, k]
    if st.all_greedy:  # argmax matching needs no distribution: no one-hot [num_seqs, k + 1, vocab] is built
        y = target_logits.argmax(-1)  # [num_seqs, k + 1]
    elif draft_probs is None or k == 0:
        y = target_samples(process_logits(target_logits, st), st)  # [num_seqs, k + 1]
    else:
        p = process_logits(target_logits, st)  # [num_seqs, k + 1, vocab]
        return _result(drafts, *_rejection(p, drafts, valid, num_draft_tokens, draft_probs, st))
    accept = (drafts == y[:, :k]) & valid
    num_accepted = accept.long().cumprod(-1).sum(-1)  # [num_seqs] length of the accepted prefix
    final = y.gather(1, num_accepted[:, None])[:, 0]  # [num_seqs] the target's token at the first mismatch
    return _result(drafts, accept, num_accepted, final)


def greedy_verify(
    y: torch.Tensor,  # [num_seqs, k + 1] int64 the target's argmax at (pending, d_1..d_k)
    draft_token_ids: torch.Tensor,  # [num_seqs, k] int64, PAD past num_draft_tokens
    num_draft_tokens: torch.Tensor,  # [num_seqs] int64
) -> VerifyResult:
    """Greedy rows: the drafts that equal the argmax, up to the first that does not, then the argmax there. The
    same result as `verify`'s vectorised path (`test_greedy_verify_equals_the_race_path`), in Python lists: a
    step's handful of tokens, where the dozen small tensor operations of that path cost ~0.13 ms a step on the
    CPU (`python -m experiments.engine_overhead`: `verify` took 194 us of SmolLM2's 4.1 ms one-token step, 68 after)."""
    targets, drafts, counts = y.tolist(), draft_token_ids.tolist(), num_draft_tokens.tolist()
    rows, accepted = [], []
    for target, draft, count in zip(targets, drafts, counts, strict=True):
        a = 0
        while a < count and draft[a] == target[a]:
            a += 1
        rows.append(draft[:a] + [target[a]] + [PAD_TOKEN_ID] * (len(draft) - a))
        accepted.append(a)
    device = y.device
    out = torch.tensor(rows, dtype=torch.long, device=device).view(len(rows), y.shape[1])  # [num_seqs, k + 1]
    return VerifyResult(out, torch.tensor(accepted, dtype=torch.long, device=device))


def _result(
    drafts: torch.Tensor, accept: torch.Tensor, num_accepted: torch.Tensor, final: torch.Tensor
) -> VerifyResult:
    """Accepted drafts [num_seqs, k], then the final (recovered or bonus) token, then PAD."""
    num_seqs = drafts.shape[0]
    out = torch.where(accept.long().cumprod(-1).bool(), drafts, PAD_TOKEN_ID)  # [num_seqs, k]
    out = torch.cat([out, torch.full((num_seqs, 1), PAD_TOKEN_ID, device=drafts.device, dtype=torch.long)], 1)
    out.scatter_(1, num_accepted[:, None], final[:, None])
    return VerifyResult(out, num_accepted)


def _rejection(
    p: torch.Tensor,  # [num_seqs, k + 1, vocab] processed target
    drafts: torch.Tensor,  # [num_seqs, k]
    valid: torch.Tensor,  # [num_seqs, k]
    num_draft_tokens: torch.Tensor,  # [num_seqs]
    draft_probs: torch.Tensor,  # [num_seqs, k, vocab]
    st: SamplingTensors,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rejection sampling of sampled drafts -> accept [num_seqs, k], num_accepted [num_seqs], final [num_seqs]."""
    k, vocab = drafts.shape[1], p.shape[-1]
    p_x = p[:, :k].gather(-1, drafts[..., None])[..., 0]  # [num_seqs, k]
    q_x = draft_probs.gather(-1, drafts[..., None])[..., 0]  # [num_seqs, k]
    u = uniforms(st, Purpose.ACCEPT, range(k))[..., 0]  # [num_seqs, k]
    accept = (u * q_x < p_x) & valid  # accept iff u < p/q, without dividing
    num_accepted = accept.long().cumprod(-1).sum(-1)  # [num_seqs]
    # The final token: from the residual at the first rejection, or the bonus from p at num_draft.
    p_last = p.gather(1, num_accepted[:, None, None].expand(-1, 1, vocab))[:, 0]  # [num_seqs, vocab]
    idx = num_accepted.clamp(max=k - 1)[:, None, None].expand(-1, 1, vocab)
    q_last = draft_probs.gather(1, idx)[:, 0]  # [num_seqs, vocab]
    rejected = (num_accepted < num_draft_tokens)[:, None]  # [num_seqs, 1]
    p_last = torch.where(rejected, residual(p_last, q_last), p_last)
    return accept, num_accepted, sample(p_last, st, Purpose.RECOVER)
