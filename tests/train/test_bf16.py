"""`distill --bf16`: the student trains under bf16 autocast, the teacher it learns from stays fp32, and the
losses follow the fp32 run's to bf16's precision (drafts and heads, on the fly and from a teacher cache)."""

from __future__ import annotations

import contextlib
import json

import numpy as np
import pytest
import torch

from specdecode.cli import main
from specdecode.train import distill as distill_module
from specdecode.train import heads as heads_module
from specdecode.train.build_cache import CacheConfig, build_cache
from specdecode.train.distill import DistillConfig, distill
from specdecode.train.draft_config import DraftOptions

SMALL = dict(batch_size=4, seq_len=24, warmup=3, progress=False, draft=DraftOptions(num_layers=1))
# The student's bf16 arithmetic moves the tiny models' losses by up to ~1e-3 relative over a few steps (measured
# 1e-5 to 9e-4): 5e-3 passes with margin and would catch a student that learns something else.
LOSS_RTOL = 5e-3
# The teacher runs fp32 with or without --bf16, so on the same batches its outputs agree bit for bit (0); a
# teacher under the student's autocast is off by bf16's rounding (measured 2.7e-3 to 3.4e-3), past MARGIN x this.
TEACHER_RTOL = 1e-6
MARGIN = 100.0


def _train(target, data, out, **kw):
    return distill(DistillConfig(target=str(target), data=[str(data)], out=str(out), **{**SMALL, **kw}))


def _record_draft_steps(monkeypatch) -> dict[str, list]:
    """The dtypes of the student's logits and of the teacher's, and the teacher's logits, as each draft step
    hands them to its loss."""
    seen: dict[str, list] = {"student": [], "teacher": [], "teacher_logits": []}
    real = distill_module.distill_loss

    def spy(student_logits, teacher_logits, *args, **kw):
        seen["student"].append(student_logits.dtype)
        seen["teacher"].append(teacher_logits.dtype)
        seen["teacher_logits"].append(teacher_logits.detach().float().clone())
        return real(student_logits, teacher_logits, *args, **kw)

    monkeypatch.setattr(distill_module, "distill_loss", spy)
    return seen


def _max_rel_error(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    """Worst max |got - want| / max |want| over the steps' teacher outputs."""
    return max(((g - w).abs().max() / w.abs().max()).item() for g, w in zip(got, want, strict=True))


def _assert_teacher_fp32(error: float, fault: bool) -> None:
    """The teacher's outputs under --bf16 are the fp32 run's; with the fault injected the same check must fail
    by a wide margin."""
    if fault:
        assert error > MARGIN * TEACHER_RTOL, f"a bf16 teacher not caught: error {error:.3g}"
    else:
        assert error <= TEACHER_RTOL, f"the teacher's outputs moved under --bf16: error {error:.3g}"


def _fault_teacher_precision(monkeypatch, module) -> None:
    """The fault the tests must catch: the teacher runs under the student's autocast."""
    monkeypatch.setattr(module, "teacher_precision", lambda device: contextlib.nullcontext())


@pytest.mark.parametrize("fault", [False, True])
def test_draft_bf16_student_learns_from_an_fp32_teacher(fault, tiny_target, train_npz, tmp_path, monkeypatch):
    seen = _record_draft_steps(monkeypatch)
    fp32 = _train(tiny_target, train_npz, tmp_path / "fp32", steps=5)
    fp32_teacher = list(seen["teacher_logits"])
    for steps in seen.values():
        steps.clear()
    if fault:
        _fault_teacher_precision(monkeypatch, distill_module)
    mixed = _train(tiny_target, train_npz, tmp_path / "bf16", steps=5, bf16=True)
    assert set(seen["student"]) == {torch.bfloat16}  # the flag reached the student's matmuls
    _assert_teacher_fp32(_max_rel_error(seen["teacher_logits"], fp32_teacher), fault)
    assert set(seen["teacher"]) == {torch.bfloat16 if fault else torch.float32}
    if not fault:
        np.testing.assert_allclose(mixed.losses, fp32.losses, rtol=LOSS_RTOL)
        assert mixed.losses != fp32.losses  # bf16 did change the arithmetic
    assert mixed.manifest["bf16"] and not fp32.manifest["bf16"]


def _record_head_teachers(monkeypatch) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each head step's teacher features and log-probs, as handed to the loss."""
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    real = heads_module.head_loss

    def spy(kind, heads, teacher, *args):
        seen.append((teacher.features.detach().clone(), teacher.log_p.detach().clone()))
        return real(kind, heads, teacher, *args)

    monkeypatch.setattr(heads_module, "head_loss", spy)
    return seen


@pytest.mark.parametrize("fault", [False, True])
def test_head_bf16_learns_from_fp32_features(fault, tiny_target, train_npz, tmp_path, monkeypatch):
    """The target's outputs come back fp32 either way (its final norm and log_softmax upcast), so the check is on
    their values: the same batch gives the same teacher, bit for bit, with and without --bf16. Under the fault a
    target with packed linears fails outright instead (which linears pack depends on the machine)."""
    seen = _record_head_teachers(monkeypatch)
    fp32 = _train(tiny_target, train_npz, tmp_path / "fp32", head="eagle", steps=4)
    fp32_teachers, seen[:] = list(seen), []
    if fault:
        _fault_teacher_precision(monkeypatch, heads_module)
    try:
        mixed = _train(tiny_target, train_npz, tmp_path / "bf16", head="eagle", steps=4, bf16=True)
    except RuntimeError as e:  # the fault reached an fp32 inference linear, which refuses bf16 input
        assert fault and ("BFloat16" in str(e) or "few_rows_linear is fp32" in str(e)), e  # oneDNN, MKL; few-rows
        return
    _assert_teacher_fp32(_max_rel_error([f for f, _ in seen], [f for f, _ in fp32_teachers]), fault)
    _assert_teacher_fp32(_max_rel_error([lp for _, lp in seen], [lp for _, lp in fp32_teachers]), fault)
    if not fault:
        np.testing.assert_allclose(mixed.losses, fp32.losses, rtol=LOSS_RTOL)


def test_bf16_from_teacher_cache_and_cli(tiny_target, train_npz, tmp_path):
    cfg = CacheConfig(str(tiny_target), [str(train_npz)], str(tmp_path / "cache"), top_k=8, seq_len=24, progress=False)
    cache = build_cache(cfg).out
    fp32 = _train(tiny_target, train_npz, tmp_path / "fp32", steps=5, teacher_cache=str(cache))
    mixed = _train(tiny_target, train_npz, tmp_path / "bf16", steps=5, teacher_cache=str(cache), bf16=True)
    np.testing.assert_allclose(mixed.losses, fp32.losses, rtol=LOSS_RTOL)
    assert mixed.losses != fp32.losses

    common = ["--target", str(tiny_target), "--data", str(train_npz), "--seq-len", "24", "--no-progress"]
    argv = ["distill", *common, "--steps", "2", "--batch-size", "4", "--layers", "1", "--teacher-cache", str(cache)]
    assert main([*argv, "--out", str(tmp_path / "cli"), "--bf16"]) == 0
    assert json.loads((tmp_path / "cli" / "manifest.json").read_text())["bf16"] is True
