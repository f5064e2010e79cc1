"""specdecode's cache directory on disk ($SPECDECODE_CACHE, else ~/.cache/specdecode): what is built once per
machine (converted models, compiled step packages, kernels) is built into a hidden directory and renamed into
place when complete, and old versions are removed least recently used first."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def cache_root() -> Path:
    """Where built things live (converted models, step packages, kernels): $SPECDECODE_CACHE, else
    ~/.cache/specdecode."""
    env = os.environ.get("SPECDECODE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "specdecode"


def build_once(final: Path, build: Callable[[Path], object]) -> Path:
    """`final`, made now by `build(tmp)` if absent.

    The work happens in a hidden temporary sibling that is renamed into place only when complete, so an
    interrupted build never leaves a directory under the final name.
    """
    if final.is_dir():
        os.utime(final)  # most recently used: what `prune_versions` keeps
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".partial", dir=final.parent))
    try:
        build(tmp)
        _publish(tmp, final)
    except BaseException:  # includes KeyboardInterrupt: never leave the partial directory behind
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def remove_least_recent(dirs: list[Path], room: int) -> None:
    """Delete all but the `room` most recently used of `dirs` (their mtime: users touch what they load). A
    process still reading a deleted one keeps its open files."""
    for old in sorted(dirs, key=lambda p: p.stat().st_mtime)[: max(0, len(dirs) - room)]:
        shutil.rmtree(old, ignore_errors=True)


def _publish(tmp: Path, final: Path) -> None:
    tmp.chmod(0o755)  # mkdtemp makes it private
    try:
        os.replace(tmp, final)
    except OSError:
        if not final.is_dir():
            raise
        shutil.rmtree(tmp)  # another process finished the same conversion first; keep theirs
