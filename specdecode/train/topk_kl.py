"""KL(teacher's top-k + rest || student) straight from the student's logits, forward and backward by hand.

`TopKTeacher.kl(log_softmax(z))` is the definition. Written with autograd it makes a dozen passes over the
student's [N, S] logits (log-softmax, a scatter of -inf, logsumexp, then a backward for each, a zero-filled
gather gradient), and on a CPU those passes cost as much as the student's own matmuls. The same value and
gradient need only: a max with its argmax, one exp, two row sums (all, and the tail once the top-k columns
are zeroed), and one fused gradient. With e = exp(z - max), Z its row sum and T the tail's:

    log q_i = z_i - lse(z),   log q_rest = log(T / Z)
    dKL/dz_j = e_j (P / Z - p_rest / T)   for j outside the top-k ids
             = P q_j - p_j                 for j among them,   P = sum_i p_i + p_rest

T is summed over the tail itself, not taken as Z minus the top-k's sum, so it keeps its precision when the
student's top-k holds nearly all its mass.
"""

from __future__ import annotations

import torch

from specdecode.train.topk import TopKTeacher


class _TopKKL(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z, log_p, ids, log_rest):
        """z [N, S] any float dtype; log_p [N, k] fp32; ids [N, k] int64; log_rest [N] fp32 -> ([] mean KL,
        [N] argmax of z)."""
        n, s = z.shape
        e = z.float() if z.dtype != torch.float32 else z.clone()  # [N, S] fp32, a fresh copy to work in
        top, drafted = e.max(-1, keepdim=True)  # [N, 1] each
        z_top = e.gather(-1, ids) - top  # [N, k] shifted logits of the teacher's ids
        e.sub_(top).exp_()  # [N, S] exp(z - max)
        tail_mass = torch.zeros(n, 1, device=z.device)  # [N, 1] p_rest where it counts
        log_z = e.sum(-1, keepdim=True).log()  # [N, 1]
        log_q = z_top - log_z  # [N, k]
        p = log_p.exp()  # [N, k]
        kl = (p * (log_p - log_q)).sum(-1)  # [N]
        coef = torch.zeros(n, 1, device=z.device)  # [N, 1] the tail's gradient weight beyond P / Z
        if ids.shape[-1] < s:
            e.scatter_(-1, ids, 0.0)  # e now holds the tail only
            tail = e.sum(-1, keepdim=True)  # [N, 1]
            p_rest = log_rest.exp()[:, None]  # [N, 1]
            counts = p_rest > 0
            log_q_rest = tail.log() - log_z  # [N, 1]
            kl = kl + torch.where(counts, p_rest * (log_rest[:, None] - log_q_rest), 0.0)[:, 0]
            tail_mass = torch.where(counts, p_rest, 0.0)
            coef = _tail_weight(p_rest, tail, counts)
        else:
            e.zero_()  # no tail: every column is one of the ids
        mass = p.sum(-1, keepdim=True) + tail_mass  # [N, 1] P
        ctx.save_for_backward(e, log_z, z_top, p, ids, mass, coef)
        ctx.dtype, ctx.n = z.dtype, n
        ctx.mark_non_differentiable(drafted)
        return kl.sum() / max(n, 1), drafted[:, 0]  # the mean as F.kl_div(reduction="batchmean")

    @staticmethod
    def backward(ctx, grad_out, _grad_drafted):
        e, log_z, z_top, p, ids, mass, coef = ctx.saved_tensors
        scale = grad_out / max(ctx.n, 1)
        grad = e * (mass * (-log_z).exp() + coef)  # [N, S] the tail's columns; the ids' are 0 in e
        grad.scatter_(-1, ids, mass * (z_top - log_z).exp() - p)  # [N, k] P q_j - p_j
        return grad.mul_(scale).to(ctx.dtype), None, None, None


def _tail_weight(p_rest: torch.Tensor, tail: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """[N, 1] what -p_rest log q_rest adds to a tail column's gradient beyond P / Z, per unit of e_j."""
    return torch.where(counts, -p_rest / tail, 0.0)


def topk_kl(logits: torch.Tensor, teacher: TopKTeacher) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [N, S] (the student's, unnormalised) against teacher [N] -> ([] mean KL over the k + 1 buckets,
    equal to teacher.kl(log_softmax(logits)) with the same gradient; [N] the student's argmax column)."""
    if len(teacher.ids) != len(logits) or teacher.vocab_size != logits.shape[-1]:
        raise ValueError(
            f"the cache holds {len(teacher.ids)} positions over {teacher.vocab_size} tokens for a batch of "
            f"{len(logits)} over {logits.shape[-1]}"
        )
    return _TopKKL.apply(logits, teacher.log_p, teacher.ids, teacher.log_rest)
