"""The fused top-k KL (train/topk_kl.py) has the value and gradient of its autograd definition,
TopKTeacher.kl(log_softmax(z)), in every case the cache produces; a gradient without its tail term is caught."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specdecode.train import topk_kl as fused
from specdecode.train.topk import TopKTeacher, teacher_topk, topk_of


def _case(name: str) -> tuple[torch.Tensor, TopKTeacher]:
    """Student logits [N, S] and a teacher [N] over S = 200 tokens (the last case over a subset of 120)."""
    g = torch.Generator().manual_seed(0)
    n, v = 12, 200
    log_p = (torch.randn(n, v, generator=g) * 3).log_softmax(-1)  # [N, V]
    z = torch.randn(n, v, generator=g) * 2  # [N, V]
    if name == "top-k":
        return z, topk_of(log_p, 16)
    if name == "k = vocab":
        return z, topk_of(log_p, v)
    if name == "empty rest":  # rows whose teacher has no mass outside its top-k (log_rest = -inf)
        t = topk_of(log_p, 16)
        return z, TopKTeacher(t.log_p, t.ids, t.log_rest.index_fill(0, torch.tensor([1, 5]), -torch.inf), v)
    if name == "student sure":  # the student's top-k holds all but ~1e-12 of its mass
        t = topk_of(log_p, 16)
        return z.scatter(1, t.ids, 40.0), t
    if name == "bf16":
        return z.bfloat16(), topk_of(log_p, 16)
    subset = torch.randperm(v, generator=g)[:120].sort().values  # [S]
    return z[:, :120], teacher_topk(log_p, 16, subset)


def _value_and_grad(z: torch.Tensor, teacher: TopKTeacher, fn) -> tuple[torch.Tensor, torch.Tensor]:
    z = z.detach().clone().requires_grad_()
    loss = fn(z, teacher)
    (loss * 3.0).backward()  # a non-unit upstream gradient
    return loss.detach(), z.grad.float()


def _reference(z: torch.Tensor, teacher: TopKTeacher) -> torch.Tensor:
    return teacher.kl(F.log_softmax(z.float(), dim=-1))


def _fused(z: torch.Tensor, teacher: TopKTeacher) -> torch.Tensor:
    return fused.topk_kl(z, teacher)[0]


@pytest.mark.parametrize("name", ["top-k", "k = vocab", "empty rest", "student sure", "bf16", "subset"])
def test_value_gradient_and_argmax_equal_the_autograd_definition(name):
    z, teacher = _case(name)
    want, want_grad = _value_and_grad(z, teacher, _reference)
    got, got_grad = _value_and_grad(z, teacher, _fused)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    atol = 1e-4 * want_grad.abs().max().item() if z.dtype == torch.bfloat16 else 1e-7  # bf16: the grad's rounding
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-4, atol=atol)
    assert torch.equal(fused.topk_kl(z, teacher)[1], z.float().argmax(-1))


def test_gradient_without_the_tail_term_is_caught(monkeypatch):
    """Control: the real function with the rest bucket's gradient term zeroed fails the same comparison, by a
    margin far beyond its tolerance."""
    z, teacher = _case("top-k")
    want, want_grad = _value_and_grad(z, teacher, _reference)
    monkeypatch.setattr(fused, "_tail_weight", lambda p_rest, tail, counts: torch.zeros_like(tail))
    got, got_grad = _value_and_grad(z, teacher, _fused)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)  # the value does not see it
    tolerance = 1e-7 + 1e-4 * want_grad.abs().max()  # assert_close's atol + rtol at the largest entry
    assert (got_grad - want_grad).abs().max() > 100 * tolerance


def test_mismatched_teacher_is_refused():
    z, teacher = _case("top-k")
    with pytest.raises(ValueError, match="12 positions over 200 tokens for a batch of 11 over 200"):
        fused.topk_kl(z[:11], teacher)
