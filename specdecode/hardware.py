"""What machine this is, in words: for results files and for keys of machine-specific build products."""

from __future__ import annotations

import platform
from pathlib import Path


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's model name and, where /proc/cpuinfo gives them, its family and model numbers ("AMD EPYC (family 25
    model 17)"): a hosted CPU's name alone ("AMD EPYC") hides which generation it is, and generations differ in
    what their vector units do per cycle. `cpuinfo`: that file's text (default: read it)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            if fields:
                break  # the first processor's block is enough
            continue
        fields.setdefault(key.strip(), value.strip())
    name = fields.get("model name") or platform.processor() or "unknown model"
    if "cpu family" in fields and "model" in fields:
        return f"{name} (family {fields['cpu family']} model {fields['model']})"
    return name
