"""The cache on disk holds code that gets loaded (the kernels' shared library, AOTInductor packages) and converted
weights: its directories are private (0700), and an entry another user owns or could write is refused before
anything is loaded from it, for the kernels, the step packages and GGUF conversions alike."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from specdecode.models import aot_package, few_rows
from specdecode.models.disk_cache import UnsafeCacheError, build_once


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _build_file(tmp: Path) -> None:
    (tmp / "lib.so").write_bytes(b"\x7fELF")


def test_new_cache_directories_are_private(tmp_path):
    """Every level build_once makes, the entry included, is 0700 (it was 0755: readable by every user)."""
    final = build_once(tmp_path / "cache" / "kernels" / "k-0", _build_file)
    assert [_mode(p) for p in (tmp_path / "cache", final.parent, final)] == [0o700] * 3


@pytest.mark.parametrize(
    "tamper",
    [
        lambda final: (final / "lib.so").chmod(0o666),  # a planted library anyone could have rewritten
        lambda final: final.chmod(0o777),  # an entry directory anyone could write into
        lambda final: final.parent.chmod(0o777),  # a parent where anyone could swap the entry
    ],
    ids=["writable_file", "writable_entry", "writable_parent"],
)
def test_entries_others_could_write_are_refused(tmp_path, tamper):
    final = build_once(tmp_path / "kernels" / "k-0", _build_file)
    tamper(final)
    built = []
    with pytest.raises(UnsafeCacheError, match="writable by no one else"):
        build_once(final, built.append)
    assert built == []


def test_entries_of_another_user_are_refused(tmp_path, monkeypatch):
    """The same entry, now seen by a process of another uid: not its own, so not loaded."""
    final = build_once(tmp_path / "kernels" / "k-0", _build_file)
    monkeypatch.setattr(os, "getuid", lambda: os.stat(final).st_uid + 4242)
    with pytest.raises(UnsafeCacheError, match="owned by this user"):
        build_once(final, _build_file)


def test_an_intact_private_entry_is_reused(tmp_path):
    """Control for the two tests above: untouched, the entry is returned without building again."""
    final = build_once(tmp_path / "kernels" / "k-0", _build_file)
    built = []
    assert build_once(final, built.append) == final and built == []


@pytest.fixture
def kernel_cache(tmp_path, monkeypatch):
    """few_rows.library() over an empty cache, with a stand-in build (no compiler run) and loads recorded."""
    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path))
    monkeypatch.setattr(few_rows, "_compiler", lambda: "c++")
    monkeypatch.setattr(few_rows, "_build", lambda out, compiler: (out / "few_rows.so").write_bytes(b"\x7fELF"))
    loaded: list[Path] = []
    monkeypatch.setattr(few_rows, "load_op", lambda path, op, fake: loaded.append(path))
    few_rows.library.cache_clear()
    yield loaded
    few_rows.library.cache_clear()


def test_the_kernel_library_is_not_loaded_from_a_writable_file(kernel_cache):
    """The library sits at a predictable key: one rewritable by others is refused, and never dlopen'ed."""
    path = few_rows.library()
    assert kernel_cache == [path] and _mode(path.parent) == 0o700
    path.chmod(0o666)
    few_rows.library.cache_clear()
    with pytest.raises(UnsafeCacheError):
        few_rows.library()
    assert kernel_cache == [path]  # loaded once, when it was private


def test_a_planted_step_package_is_refused_before_loading(tmp_path, monkeypatch):
    """A package directory at the model's key that others can write (a planted shared library) is neither
    loaded nor compiled over."""
    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path))
    monkeypatch.setattr(aot_package, "package_key", lambda model: "k" * 32)
    loaded, compiled = [], []
    monkeypatch.setattr(aot_package, "_load", lambda path, model: loaded.append(path))
    monkeypatch.setattr(aot_package, "compile_packages", lambda model, out: compiled.append(out))
    planted = tmp_path / "aoti" / ("k" * 32)
    planted.mkdir(parents=True)
    for name in (aot_package.BODY, aot_package.HEAD):
        (planted / name).write_bytes(b"PK")
    planted.chmod(0o777)
    with pytest.raises(UnsafeCacheError):
        aot_package.load_or_compile(model=None)
    assert loaded == [] and compiled == []
    planted.chmod(0o700)  # control: the same package, private, loads
    aot_package.load_or_compile(model=None)
    assert loaded == [planted / aot_package.BODY, planted / aot_package.HEAD] and compiled == []
