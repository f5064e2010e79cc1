"""What every benchmark shares: an arm and the sample it returns per prompt, the provenance a results file carries
(command, machine, date), and writing that file."""

from __future__ import annotations

import json
import os
import platform
import shlex
import sys
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Protocol

import torch

from specdecode.hardware import cpu_model


@dataclass
class Sample:
    tokens: int
    seconds: float
    drafted: int = 0
    accepted: int = 0
    forwards: int = 0
    trees: bool = False  # drafted tokens are tree nodes: accepted / drafted is a per-node rate
    # Where the arm reports them (native llama.cpp): the decoding part of `seconds` and the tokens it made.
    decode_seconds: float | None = None
    decode_tokens: int = 0


def draft_name(spec: str) -> str:
    """A draft's short name in arm names: a built-in name, or the directory's last component."""
    return spec.rstrip("/").split("/")[-1]


class Arm(Protocol):
    name: str

    def run(self, text: str, max_tokens: int) -> Sample: ...


def machine() -> str:
    from specdecode.models import packed_linear

    if torch.cuda.is_available():
        return f"{platform.machine()} {torch.cuda.get_device_name()}, torch {torch.__version__}"
    cpu = cpu_model()
    packed = {"plain": "plain F.linear", "mkl": "MKL-packed", "onednn": "oneDNN-packed"}[packed_linear.choice()]
    return (
        f"{platform.machine()} {os.cpu_count()}-core CPU ({cpu}), torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, {packed} fp32 linears"
    )


def provenance(module: str | None = None) -> dict[str, str]:
    """The command, machine and date every results file carries; `module`: the command ran as `python -m module`
    rather than as `specdecode`."""
    args = sys.argv[1:]
    return {
        "command": shlex.join(["python", "-m", module, *args]) if module else " ".join(["specdecode", *args]),
        "machine": machine(),
        "date": date.today().isoformat(),
    }


def write_result(path: str | Path, payload: dict, indent: int = 2) -> Path:
    """Write a results file (its folder made if missing) and return its path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=indent) + "\n")
    return out
