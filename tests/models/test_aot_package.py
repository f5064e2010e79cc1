"""AOTInductor packages of the compiled step (models/aot_package.py): compiled once, loaded from disk after,
never loaded for other weights, compiled again when unreadable.

The packages are the user's cache's, as for the suite's other compiled steps (test_compiled loads the tiny
target's from there): tiny_target's weights are seeded, so a package's key is the same from run to run and a later
run loads it (a compile takes ~22 s on two cores)."""

from __future__ import annotations

import inspect
import linecache
import os
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from specdecode.models import aot_package, few_rows, llama, quant_int8, quant_rows
from specdecode.models.compiled import compile_step
from specdecode.models.disk_cache import cache_root, remove_least_recent
from specdecode.models.gguf_quantized import load_gguf_quantized
from specdecode.models.llama import AttentionMetadata, LlamaModel, load_llama
from tests.models.test_gguf_quantized import write_tiny_gguf


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


def packages(root, sizes_mb: list[float]) -> list:
    """Package directories p0, p1, ... under root, p{i} used at time i and holding a sparse file of sizes_mb[i] MB."""
    paths = []
    for i, mb in enumerate(sizes_mb):
        path = root / f"p{i}"
        path.mkdir()
        with open(path / aot_package.BODY, "wb") as f:
            f.truncate(int(mb * 2**20))
        os.utime(path, (i, i))
        paths.append(path)
    return paths


def test_prune_keeps_the_most_recent_within_its_bytes(tmp_path):
    """From the most recent down, packages are kept while they fit; the first that does not goes with all older
    ones, and the package in use stays whatever its age and size."""
    packages(tmp_path, [300, 1, 1, 1.5, 1, 1])
    aot_package.prune(tmp_path, keep=tmp_path / "p0", max_bytes=int(2.5 * 2**20))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p0", "p4", "p5"]


def test_a_user_of_five_quantized_models_and_an_fp32_one_keeps_them_all(tmp_path):
    """A quantized model's package is a few MB (its weights stay in the GGUF), an fp32 one SmolLM2's ~0.6 GB:
    moving among the pair's target and draft and SmolLM2, in both arithmetics, compiles none of them again."""
    packages(tmp_path, [600, 5, 5, 4, 4, 3, 3])
    aot_package.prune(tmp_path, keep=tmp_path / "p6")
    assert len(list(tmp_path.iterdir())) == 7


def test_control_a_prune_by_count_deletes_them(tmp_path, monkeypatch):
    """The former rule (the four most recently used) through the same check: the fp32 package and two of the
    quantized ones are gone, and the next load of each would compile again (minutes for the 1.5B)."""
    packages(tmp_path, [600, 5, 5, 4, 4, 3, 3])
    by_count = lambda dirs, budget: remove_least_recent(dirs, 3)  # noqa: E731 - the fault
    monkeypatch.setattr(aot_package, "remove_beyond_bytes", by_count)
    aot_package.prune(tmp_path, keep=tmp_path / "p6")
    assert len(list(tmp_path.iterdir())) == 4


def edited(monkeypatch, name: str, old: str, new: str) -> None:
    """aot_package's source as inspect reads it, with `old` replaced by `new` inside the definition `name` (one
    line for one: the definitions below keep their line numbers)."""
    path = inspect.getsourcefile(aot_package)
    lines = list(linecache.getlines(path))
    first = inspect.getsourcelines(getattr(aot_package, name))[1] - 1
    at = next(i for i in range(first, len(lines)) if old in lines[i])
    lines[at] = lines[at].replace(old, new)
    monkeypatch.setitem(linecache.cache, path, (sum(map(len, lines)), None, lines, path))


@pytest.mark.parametrize("name, old, new", [("prune", "max_bytes)", "max_bytes // 2)"), ("_load", "is_file", "exists")])
def test_an_edit_that_shapes_no_package_keeps_the_key(tiny_target, monkeypatch, name, old, new):
    """How packages are found, loaded and pruned is not in them: an edit there keeps every key (hashing the whole
    module had made every package compile again); an edit to how one is exported moves it."""
    model = load_llama(tiny_target, inference=False)
    before = aot_package.package_key(model)
    with monkeypatch.context() as m:
        edited(m, name, old, new)
        assert aot_package.package_key(model) == before
    with monkeypatch.context() as m:
        edited(m, "_body_example", "cache = model.new_cache(3, 16)", "cache = model.new_cache(3, 17)")
        assert aot_package.package_key(model) != before


def test_control_a_key_over_the_whole_module_moves_with_a_prune_edit(tiny_target, monkeypatch):
    """The same edit to `prune` with the module itself among what is hashed (the former key): it moves."""
    model = load_llama(tiny_target, inference=False)
    monkeypatch.setattr(aot_package, "PACKAGING", (*aot_package.PACKAGING, aot_package))
    before = aot_package.package_key(model)
    edited(monkeypatch, "prune", "max_bytes)", "max_bytes // 2)")
    assert aot_package.package_key(model) != before


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
    """`c_code`, which `op_schemas` reads through: comments and layout aside, a comment marker inside a string
    literal kept (it is code); the control changes one constant."""
    src = 'int f(int x) {\n    return x + 1;  // one\n}\nconst char* s = "a // b";\n'
    prose = '/* The kernel.\n   Two lines. */\nint f(int x) {\n  return x + 1;\n}\n\nconst char* s = "a // b";  // c\n'
    changed = 'int f(int x) {\n    return x + 2;  // one\n}\nconst char* s = "a // b";\n'
    literal = 'int f(int x) {\n    return x + 1;  // one\n}\nconst char* s = "a // c";\n'
    assert aot_package.c_code(src) == aot_package.c_code(prose)
    assert len({aot_package.c_code(s) for s in (src, changed, literal)}) == 3


@pytest.fixture(scope="module")
def quantized_tiny(tmp_path_factory) -> LlamaModel:
    """A tiny GGUF's model with its blocks kept (eager: only its key is asked for)."""
    path = write_tiny_gguf(tmp_path_factory.mktemp("quantized") / "tiny.gguf", tie=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tiny file's dense linears
        return load_gguf_quantized(path)


def kernels_edited(monkeypatch, tmp_path, edit: Callable[[str], str]) -> None:
    """Every C++ kernel the key reads, as a copy under tmp_path with `edit` applied (each one that defines an op
    changed)."""

    def copy(path: Path) -> Path:
        out = tmp_path / path.name
        out.write_text(edit(path.read_text()))
        assert out.read_text() != path.read_text() or "m.def" not in path.read_text(), path.name
        return out

    monkeypatch.setattr(few_rows, "SOURCES", tuple(copy(p) for p in few_rows.SOURCES))
    monkeypatch.setattr(quant_rows, "SOURCE", copy(quant_rows.SOURCE))
    monkeypatch.setattr(quant_int8, "SOURCE", copy(quant_int8.SOURCE))


def body_edit(source: str) -> str:
    """One kernel's code changed where no op is defined (its first `return`, before its op definitions)."""
    assert source.index("return") < source.find("m.def") or "m.def" not in source
    return source.replace("return", "return -", 1)


def schema_edit(source: str) -> str:
    """Its first op's schema changed (a tensor argument made optional); a file that defines no op as it is."""
    at = source.find("m.def")
    return source if at < 0 else source[:at] + source[at:].replace("Tensor", "Tensor?", 1)


def keys(tiny_target, quantized: LlamaModel) -> list[str]:
    return [aot_package.package_key(load_llama(tiny_target, inference=False)), aot_package.package_key(quantized)]


@pytest.mark.parametrize("edit, moves", [(body_edit, False), (schema_edit, True)])
def test_the_key_holds_the_kernels_op_schemas_not_their_bodies(
    tiny_target, quantized_tiny, monkeypatch, tmp_path, edit, moves
):
    """A package calls each op by name (AOTInductor's proxy executor), so the kernel that runs is the loaded
    library's, never the package's: an edit to a kernel's body keeps every key, fp32 and quantized (it had made
    every package compile again, minutes for the 1.5B); an edit to an op's schema moves them.
    test_gguf_quantized's compiled step meets a fault set in the loaded kernel."""
    before = keys(tiny_target, quantized_tiny)
    kernels_edited(monkeypatch, tmp_path, edit)
    after = keys(tiny_target, quantized_tiny)
    assert [a != b for a, b in zip(after, before, strict=True)] == [moves, moves]


def test_control_a_key_over_the_kernels_whole_code_moves_with_a_body_edit(
    tiny_target, quantized_tiny, monkeypatch, tmp_path
):
    """The same body edit with the key reading the kernels' whole code (comments aside), as it did: both move."""
    monkeypatch.setattr(aot_package, "op_schemas", lambda source: [aot_package.c_code(source)])
    before = keys(tiny_target, quantized_tiny)
    kernels_edited(monkeypatch, tmp_path, body_edit)
    assert all(a != b for a, b in zip(keys(tiny_target, quantized_tiny), before, strict=True))


def test_op_schemas_reads_each_op_whole():
    """Every op the packages call is found, a schema split over two string literals read whole, a commented-out
    definition skipped."""
    schemas = [
        s
        for p in (*few_rows.SOURCES, quant_rows.SOURCE, quant_int8.SOURCE)
        for s in aot_package.op_schemas(p.read_text())
    ]
    names = {s.split("(")[0] for s in schemas}
    assert {"few_rows_linear", "few_queries_attend", "quant_rows_linear", "quant_rows_embedding"} <= names
    assert (
        "quant_int8_grouped_linear(Tensor x, Tensor groups, int qtype, int in_features, int out_features, "
        "Tensor? bias=None, int path=0) -> Tensor" in schemas
    )
    assert aot_package.op_schemas('// m.def("f(Tensor x) -> Tensor");\nm.def("g() -> int");') == ["g() -> int"]
