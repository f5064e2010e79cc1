"""The draft-size trade-off of a specbench run: per draft arm, what a draft step costs and what it buys.

A bigger draft agrees with the target more often (higher tau) but each of its K steps costs more; the speedup is
roughly tau / (1 + K c) against a verification pass, c being the draft step's cost relative to the target's.
The step costs are measured here, on the run's own models: the median time of a one-token decode step at a
fixed context, for the target and each draft.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from rich.console import Console
from rich.table import Table
from torch import nn

from specdecode.models.llama import LlamaModel
from specdecode.models.quant_int8 import Int8QuantLinear
from specdecode.models.quant_rows import QuantLinear
from specdecode.step.runner import forward_ragged, prefill

CONTEXT = 256  # tokens already cached when the step is timed: a typical Spec-Bench prompt plus some output
ITERS = 30


@torch.inference_mode()
def decode_step_ms(model: LlamaModel, context: int = CONTEXT, iters: int = ITERS) -> float:
    """Median milliseconds of one single-token decode step of `model` at batch 1 after `context` tokens."""
    cache = model.new_cache(1, context + iters + 1)
    tokens = [(7 * i) % model.cfg.vocab_size for i in range(context)]  # any ids: the cost does not depend on them
    prefill(model, cache, 0, tokens, chunk=context)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        forward_ragged(model, cache, [0], [[1]], last_only=True)
        times.append(time.perf_counter() - t0)
        cache.set_length(0, cache.lengths[0] + 1)
    return float(np.median(times)) * 1e3


def weights_m(model: nn.Module) -> float:
    """Millions of weights outside the embedding: its parameters and its linears kept as GGUF blocks (buffers, not
    parameters: a quantized draft read 0.0 M here before)."""
    params = sum(p.numel() for n, p in model.named_parameters() if not n.startswith("embed"))
    kept = (m for m in model.modules() if isinstance(m, (QuantLinear, Int8QuantLinear)))
    return (params + sum(m.in_features * m.out_features for m in kept)) / 1e6


def step_costs(arms: list) -> dict[str, dict[str, float]]:
    """{arm name: draft and target step ms, draft layers and parameters} for every arm running a draft model."""
    target_ms: float | None = None
    costs = {}
    for arm in arms:
        draft = getattr(getattr(arm, "llm", None), "draft_model", None)
        if draft is None:
            continue
        if target_ms is None:
            target_ms = decode_step_ms(arm.llm.target)
        costs[arm.name] = {
            "draft_ms": decode_step_ms(draft),
            "target_ms": target_ms,
            "draft_layers": draft.cfg.num_layers,
            "draft_params_m": weights_m(draft),
        }
    return costs


def render_tradeoff(tables: dict[str, dict], costs: dict[str, dict[str, float]], console: Console) -> str:
    """Print and return (Markdown) the trade-off table; `tables` maps arm name -> its per-category table."""
    if not costs:
        return ""
    base = tables["ours K=0"]["overall"]["tokens_per_s"]
    cols = ("arm", "layers", "params (M, w/o embedding)", "draft step ms", "c", "tau", "tok/s", "vs K=0", "vs HF")
    table = Table(title="draft-size trade-off (overall)")
    for col in cols:
        table.add_column(col, justify="right")
    md = ["### draft-size trade-off (overall)", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for name, c in costs.items():
        row = tables[name]["overall"]
        peer = _assisted_peer(name, tables)
        vs_hf = f"{row['tokens_per_s'] / tables[peer]['overall']['tokens_per_s']:.2f}x" if peer else "-"
        cells = (
            name,
            str(c["draft_layers"]),
            f"{c['draft_params_m']:.1f}",
            f"{c['draft_ms']:.1f}",
            f"{c['draft_ms'] / c['target_ms']:.3f}",
            f"{row['mean_accepted_tokens']:.2f}",
            f"{row['tokens_per_s']:.1f}",
            f"{row['tokens_per_s'] / base:.2f}x",
            vs_hf,
        )
        table.add_row(*cells)
        md.append("| " + " | ".join(cells) + " |")
    console.print(table)
    return "\n".join([*md, ""])


def _assisted_peer(name: str, tables: dict[str, dict]) -> str | None:
    """The HF assisted arm run with this arm's draft and K, if any (names as specbench builds them)."""
    # "ours draft[X] K=k ctrl" -> "HF assisted [X] K=k"
    for peer in tables:
        if peer.startswith("HF assisted [") and _key(peer) == _key(name):
            return peer
    return None


def _key(name: str) -> tuple[str, str]:
    label = name.split("[", 1)[1].split("]", 1)[0] if "[" in name else ""
    k = next((w for w in name.split() if w.startswith("K=")), "")
    return label, k


def plot_tradeoff(tables: dict[str, dict], costs: dict[str, dict[str, float]], path) -> None:
    """τ and speedup over K = 0 against the draft step's relative cost c, one point per draft arm (PNG)."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a benchmark machine
    import matplotlib.pyplot as plt

    base = tables["ours K=0"]["overall"]["tokens_per_s"]
    fig, (ax_tau, ax_speed) = plt.subplots(1, 2, figsize=(10, 4))
    for name, c in costs.items():
        row = tables[name]["overall"]
        x = c["draft_ms"] / c["target_ms"]
        label = name.removeprefix("ours ")
        ax_tau.scatter(x, row["mean_accepted_tokens"])
        ax_tau.annotate(label, (x, row["mean_accepted_tokens"]), fontsize=7)
        ax_speed.scatter(x, row["tokens_per_s"] / base)
        ax_speed.annotate(label, (x, row["tokens_per_s"] / base), fontsize=7)
    ax_speed.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax_tau.set(xlabel="draft step / target step (c)", ylabel="τ (tokens per target forward)", title="acceptance")
    ax_speed.set(xlabel="draft step / target step (c)", ylabel="speedup over K = 0", title="speed")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
