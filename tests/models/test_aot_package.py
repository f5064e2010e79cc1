"""AOTInductor packages of the compiled step (models/aot_package.py): compiled once, loaded from disk after,
never loaded for other weights, compiled again when unreadable.

The packages are the user's cache's, as for the suite's other compiled steps (test_compiled loads the tiny
target's from there): tiny_target's weights are seeded, so a package's key is the same from run to run and a later
run loads it (a compile takes ~22 s on two cores)."""

from __future__ import annotations

import inspect
import os
import shutil

import pytest
import torch

from specdecode.models import aot_package, few_rows, llama, quant_int8, quant_rows
from specdecode.models.compiled import compile_step
from specdecode.models.disk_cache import cache_root
from specdecode.models.llama import AttentionMetadata, LlamaModel, load_llama


@pytest.fixture
def compiles(monkeypatch):
    """The keys of the compiles the real compiler runs during a test."""
    calls: list[str] = []
    real = aot_package.compile_packages

    def counted(model, out):
        calls.append(aot_package.package_key(model))
        real(model, out)

    monkeypatch.setattr(aot_package, "compile_packages", counted)
    return calls


def logits_gap(model: LlamaModel, reference: LlamaModel) -> float:
    """Largest logit difference between `model` and `reference` on one ragged batch, each on its own cache."""
    tokens = torch.randint(0, model.cfg.vocab_size, (3, 4), generator=torch.Generator().manual_seed(0))
    meta = AttentionMetadata.build([2, 0, 1], [5, 9, 1], 4, "cpu", max_len=32)
    with torch.inference_mode():
        got = model(tokens, meta, model.new_cache(3, 32))
        want = reference(tokens, meta, reference.new_cache(3, 32))
    return (got - want).abs().max().item()


def compiled_copy(model_dir, perturb: float = 0.0) -> tuple[LlamaModel, LlamaModel]:
    """(compiled, eager) copies of the model at `model_dir`, one weight shifted by `perturb` in both."""
    models = [load_llama(model_dir, inference=False) for _ in range(2)]
    for m in models:
        with torch.no_grad():
            m.layers[0].mlp.w2.weight.add_(perturb)
    compile_step(models[0], progress=False)
    return models[0], models[1]


def test_a_second_load_comes_from_disk_and_other_weights_compile_their_own(tiny_target, compiles):
    """The packages persist across runs (the weights are seeded): each compile here happens in a run whose cache
    lacks it (a new key: the traced code, torch or the settings changed), and then at most once per model."""
    first, eager = compiled_copy(tiny_target)
    second, _ = compiled_copy(tiny_target)
    assert compiles == compiles[:1]  # the second model loaded the first one's package
    assert logits_gap(second, eager) < 1e-4
    changed, changed_eager = compiled_copy(tiny_target, perturb=0.05)
    assert aot_package.package_key(changed) != aot_package.package_key(first)
    assert set(compiles) <= {aot_package.package_key(first), aot_package.package_key(changed)}
    assert len(set(compiles)) == len(compiles)
    assert logits_gap(changed, changed_eager) < 1e-4  # its own package: the unchanged one's fails this (control)
    assert logits_gap(changed, eager) > 1e-2  # the change is visible in the logits, so the check above can fail


def test_control_a_key_blind_to_the_weights_serves_stale_logits(tiny_target, compiles, monkeypatch):
    """Negative control: with the weights left out of the key, changed weights load the unchanged model's
    package and the check above fails by far."""
    _, eager = compiled_copy(tiny_target)
    base = aot_package.package_key(eager)
    monkeypatch.setattr(aot_package, "package_key", lambda model: base)
    changed, changed_eager = compiled_copy(tiny_target, perturb=0.05)
    assert logits_gap(changed, changed_eager) > 1e-2


def test_an_unreadable_package_is_compiled_again(tiny_target, monkeypatch, tmp_path):
    """The compile that replaces the truncated package writes the pristine package's bytes: what is checked here
    is that an unreadable package is thrown away, compiled again and the new one served; the compiler itself
    runs for real in the test above (a second real compile of the same model took 22 s of the suite)."""
    _, eager = compiled_copy(tiny_target)
    package = cache_root() / "aoti" / aot_package.package_key(eager)
    pristine = shutil.copytree(package, tmp_path / "pristine")
    monkeypatch.setattr(
        aot_package, "compile_packages", lambda model, out: shutil.copytree(pristine, out, dirs_exist_ok=True)
    )
    body = package / aot_package.BODY
    body.write_bytes(body.read_bytes()[:1000])  # truncated, as by a full disk or a killed copy
    compiled = []
    monkeypatch.setattr(aot_package, "prune", lambda root, keep: compiled.append(keep))  # called once a build ends
    again, _ = compiled_copy(tiny_target)
    assert compiled == [package] and logits_gap(again, eager) < 1e-4


def test_prune_keeps_the_most_recently_used(tmp_path):
    for i in range(6):
        (tmp_path / f"p{i}").mkdir()
        os.utime(tmp_path / f"p{i}", (i, i))
    aot_package.prune(tmp_path, keep=tmp_path / "p0", max_packages=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p0", "p4", "p5"]


def test_the_key_reads_code_not_prose():
    """Docstrings, comments and layout do not change a package's key (a docstring edit in quant_rows.py had made
    every package compile again); code does. The control changes one constant."""
    src = 'def f(x):\n    """Doc."""\n    return x + 1  # one\n'
    prose = '"""A module docstring."""\n\n\ndef f(x):\n    # a comment\n    return (x + 1)\n'
    changed = 'def f(x):\n    """Doc."""\n    return x + 2  # one\n'
    assert aot_package.code(src) == aot_package.code(prose) != aot_package.code(changed)
    real = inspect.getsource(llama)
    assert aot_package.code(real) == aot_package.code(real.replace('"""', '"""Reworded. ', 1))


def test_a_kernel_comment_keeps_the_key():
    """The same for the C++ kernels a package calls: comments and layout aside, a comment marker inside a string
    literal kept (it is code); the control changes one constant."""
    src = 'int f(int x) {\n    return x + 1;  // one\n}\nconst char* s = "a // b";\n'
    prose = '/* The kernel.\n   Two lines. */\nint f(int x) {\n  return x + 1;\n}\n\nconst char* s = "a // b";  // c\n'
    changed = 'int f(int x) {\n    return x + 2;  // one\n}\nconst char* s = "a // b";\n'
    literal = 'int f(int x) {\n    return x + 1;  // one\n}\nconst char* s = "a // c";\n'
    assert aot_package.c_code(src) == aot_package.c_code(prose)
    assert len({aot_package.c_code(s) for s in (src, changed, literal)}) == 3
    for path in (*few_rows.SOURCES, quant_rows.SOURCE, quant_int8.SOURCE):
        real = path.read_text()
        assert "//" in real and aot_package.c_code(real) == aot_package.c_code(real.replace("//", "// Reworded.", 1))
        assert aot_package.c_code(real) != aot_package.c_code(real.replace("return", "return -", 1))
