"""What every benchmark shares: an arm and the sample it returns per prompt, the provenance a results file carries
(command, machine, date), and writing that file."""

from __future__ import annotations

import json
import os
import platform
import shlex
import sys
from collections import Counter
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from specdecode.hardware import cpu_model
from specdecode.models.few_rows import FewRowsLinear
from specdecode.models.packed_linear import OneDNNLinear, PackedLinear
from specdecode.models.quant_int8 import Int8QuantLinear
from specdecode.models.quant_rows import QuantLinear


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


# The fp32 linear modules the loaders install (exact types: OneDNNLinear wraps torch's MkldnnLinear).
FP32_LINEARS = {
    nn.Linear: "plain F.linear",
    PackedLinear: "MKL-packed",
    OneDNNLinear: "oneDNN-packed",
    FewRowsLinear: "few-rows GEMM",
}


def linears(model: nn.Module) -> str:
    """What the model's linears run, read from its modules, with their counts: GGUF blocks kept quantized (their
    types, and the arithmetic: fp32 activations, or int8 ones under "fast"), and fp32 linears by kernel."""
    modules = list(model.modules())
    exact = [m for m in modules if isinstance(m, QuantLinear)]
    fast = [m for m in modules if isinstance(m, Int8QuantLinear)]
    parts = []
    for blocks, arithmetic in ((exact, "exact arithmetic (fp32 activations)"), (fast, "fast arithmetic (int8)")):
        if blocks:
            types = ", ".join(sorted({m.qtype.name for m in blocks}))
            parts.append(f"{len(blocks)} in quantized GGUF blocks ({types}), {arithmetic}")
    fp32 = Counter(FP32_LINEARS[type(m)] for m in modules if type(m) in FP32_LINEARS)
    parts += [f"{n} {kind} fp32" for kind, n in fp32.most_common()]
    return "linears: " + ("; ".join(parts) or "none")


def machine(model: nn.Module | None = None) -> str:
    """The device, torch and threads; with the loaded target, what its linears run (`linears`). A target in
    other processes (tensor-parallel ranks, a server, a worker) is not described: its arms say what it ran."""
    if torch.cuda.is_available():
        line = f"{platform.machine()} {torch.cuda.get_device_name()}, torch {torch.__version__}"
    else:
        line = (
            f"{platform.machine()} {os.cpu_count()}-core CPU ({cpu_model()}), torch {torch.__version__}, "
            f"{torch.get_num_threads()} threads"
        )
    if not isinstance(model, nn.Module):
        return line
    kv = getattr(model, "kv_dtype", None)  # a bf16 cache (models/kv_dtype.py) is named; fp32 is the default
    return f"{line}, {linears(model)}" + (f"; KV cache {str(kv).removeprefix('torch.')}" if kv is not None else "")


def provenance(module: str | None = None, model: nn.Module | None = None) -> dict[str, str]:
    """The command, machine and date every results file carries; `module`: the command ran as `python -m module`
    rather than as `specdecode`; `model`: the loaded target, whose linears the machine line names."""
    args = sys.argv[1:]
    return {
        "command": shlex.join(["python", "-m", module, *args]) if module else " ".join(["specdecode", *args]),
        "machine": machine(model),
        "date": date.today().isoformat(),
    }


def turn_order(items: list, turn: int) -> list:
    """`items` in the order a timed turn runs them: as given on even turns, reversed on odd ones, so that a drift of
    the machine's speed over a run favours none of them."""
    return items if turn % 2 == 0 else items[::-1]


def write_result(path: str | Path, payload: dict, indent: int = 2) -> Path:
    """Write a results file (its folder made if missing) and return its path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=indent) + "\n")
    return out
