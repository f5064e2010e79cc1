"""specdecode's cache directory on disk ($SPECDECODE_CACHE, else ~/.cache/specdecode): what is built once per
machine (converted models, compiled step packages, kernels) is built into a hidden directory and renamed into
place when complete, and old versions are removed least recently used first.

What is loaded from here runs as code (a shared library, a compiled package), so the cache is private: its
directories are made 0700, and a directory or file on the way to something loaded that another user owns or
could write is refused (`UnsafeCacheError`) rather than loaded."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path


def cache_root() -> Path:
    """Where built things live (converted models, step packages, kernels): $SPECDECODE_CACHE, else
    ~/.cache/specdecode."""
    env = os.environ.get("SPECDECODE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "specdecode"


class UnsafeCacheError(PermissionError):
    """A cache entry this user does not control: loading it would run what someone else wrote."""


def private_dir(path: Path) -> Path:
    """`path` as a directory only this user can write: missing levels are made 0700 (mkdir -p would give them
    the umask's mode), and `path` itself is checked (what lies above it is the user's choice of cache root)."""
    missing = []
    while not path.exists() and path.parent != path:
        missing.append(path)
        path = path.parent
    for level in reversed(missing):
        level.mkdir(mode=0o700, exist_ok=True)
    final = missing[0] if missing else path
    check_private(final)
    return final


def check_private(path: Path) -> None:
    """Refuse `path` unless this user owns it and neither its group nor others may write it."""
    st = path.stat()
    if st.st_uid != os.getuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeCacheError(
            f"refusing to use the cache entry {path}: it must be owned by this user and writable by no one else "
            f"(owner uid {st.st_uid}, mode {stat.filemode(st.st_mode)}); remove it (or `chmod go-w` it if it is "
            "yours and unchanged), or point $SPECDECODE_CACHE at a private directory"
        )


def check_tree(root: Path) -> None:
    """`check_private` on `root` and everything under it: what a loader will read (and run) from there."""
    check_private(root)
    for entry in root.rglob("*"):
        check_private(entry)


def build_once(final: Path, build: Callable[[Path], object]) -> Path:
    """`final`, made now by `build(tmp)` if absent.

    The work happens in a hidden temporary sibling that is renamed into place only when complete, so an
    interrupted build never leaves a directory under the final name. An existing `final` is used only if it and
    everything in it is this user's alone (`check_tree`).
    """
    private_dir(final.parent)
    if final.is_dir():
        check_tree(final)
        os.utime(final)  # most recently used: what `prune_versions` keeps
        return final
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


def tree_bytes(path: Path) -> int:
    """Bytes of the files under `path` (what removing it frees)."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def remove_beyond_bytes(dirs: list[Path], budget: int) -> None:
    """Delete the least recently used of `dirs` (their mtime) until the rest fit in `budget` bytes: from the most
    recent down, the first that does not fit goes, and everything older with it."""
    newest_first = sorted(dirs, key=lambda p: p.stat().st_mtime, reverse=True)
    total = 0
    for i, path in enumerate(newest_first):
        total += tree_bytes(path)
        if total > budget:
            for old in newest_first[i:]:
                shutil.rmtree(old, ignore_errors=True)
            return


def _publish(tmp: Path, final: Path) -> None:
    """Rename the finished build into place; it stays 0700, as mkdtemp made it."""
    try:
        os.replace(tmp, final)
    except OSError:
        if not final.is_dir():
            raise
        shutil.rmtree(tmp)  # another process finished the same conversion first; keep theirs
        check_tree(final)
