"""What the load sweep prints and writes: rich tables, the ratios the targets ask for, JSON, Markdown and plots."""

from __future__ import annotations

import statistics
from pathlib import Path

from rich.console import Console
from rich.table import Table

from specdecode.bench.lib import write_result
from specdecode.bench.sweep_config import ArmSpec, LevelRun, SweepConfig

Figures = dict[str, dict[int, dict[str, float]]]  # arm -> concurrency -> summary


def figures(runs: dict[str, dict[int, LevelRun]]) -> Figures:
    return {name: {c: run.summary() for c, run in levels.items()} for name, levels in runs.items()}


def best_fixed(arms: list[ArmSpec], figs: Figures, c: int, counting_none: bool = False) -> str | None:
    """The fastest fixed K >= 1 at level c (with counting_none, K = 0 too: the issue's bar for `goodput`)."""
    fixed = [a.name for a in arms if a.is_fixed and (a.k > 0 or counting_none)]
    return max(fixed, key=lambda n: figs[n][c]["tokens_per_s"], default=None)


def paired_ratio(runs: dict[str, dict[int, LevelRun]], arm: str, other: str, c: int) -> float | None:
    """The median over a level's rounds of arm's tok/s over other's in the same round. The arms take turns a round
    at a time, and this machine moves between speeds ~1.5x apart for seconds to minutes at a time
    (experiments/machine_modes.py): pooled over the rounds, one arm's luck in a few long stretches moved a ratio by
    up to 18% where two arms did the same work (results/sweep_pair_c4_dev_same_work.json); a median of paired
    rounds keeps a round that fell across a change of speed from setting it. None without rounds to pair."""
    mine, theirs = runs[arm][c].round_tps, runs[other][c].round_tps
    pairs = [a / b for a, b in zip(mine, theirs, strict=False) if b > 0]
    return statistics.median(pairs) if pairs and len(mine) == len(theirs) else None


def ratios(
    arms: list[ArmSpec], figs: Figures, levels: list[int], runs: dict[str, dict[int, LevelRun]] | None = None
) -> dict[str, dict[int, dict[str, float | str]]]:
    """Each dynamic arm's tok/s over the best fixed K, over the best fixed K counting K = 0 (pooled over the rounds,
    and with runs the median of the rounds' paired ratios) and over plain decoding, per level."""
    out: dict[str, dict[int, dict[str, float | str]]] = {}
    for arm in (a for a in arms if not a.is_fixed):
        out[arm.name] = {}
        for c in levels:
            tps = figs[arm.name][c]["tokens_per_s"]
            row: dict[str, float | str] = {}
            if best := best_fixed(arms, figs, c):
                row |= {"best_fixed": best, "vs_best_fixed": tps / figs[best][c]["tokens_per_s"]}
            if best := best_fixed(arms, figs, c, counting_none=True):
                row |= {"best_counting_none": best, "vs_best_counting_none": tps / figs[best][c]["tokens_per_s"]}
                paired = paired_ratio(runs, arm.name, best, c) if runs else None
                if paired is not None:
                    row["paired_vs_best_counting_none"] = paired
            if "none" in figs:
                row["vs_none"] = tps / figs["none"][c]["tokens_per_s"]
            out[arm.name][c] = row
    return out


def level_table(
    title: str, key: str, fmt: str, figs: Figures, peers: Figures, levels: list[int], total: bool
) -> tuple[Table, list[str]]:
    """Rows arms (then peers, C = 1 only), columns concurrency levels; the same as Markdown lines."""
    cols = ["arm", *(f"C={c}" for c in levels), *(["sum"] if total else [])]
    table = Table(title=title)
    for col in cols:
        table.add_column(col, justify="right")
    md = [f"### {title}", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for name, row in [*figs.items(), *peers.items()]:
        cells = [name, *(format(row[c][key], fmt) if c in row else "" for c in levels)]
        if total:
            cells.append(format(sum(r[key] for r in row.values()), fmt) if row.keys() >= set(levels) else "")
        table.add_row(*cells)
        md.append("| " + " | ".join(cells) + " |")
    return table, md


def ratio_table(rat: dict[str, dict[int, dict[str, float | str]]], levels: list[int]) -> tuple[Table, list[str]]:
    cols = ["arm", "vs", *(f"C={c}" for c in levels)]
    table = Table(title="dynamic controllers: tok/s ratio")
    for col in cols:
        table.add_column(col, justify="right")
    md = ["### dynamic controllers: tok/s ratio", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for name, by_level in rat.items():
        for vs, key, best_key in (
            ("best fixed", "vs_best_fixed", "best_fixed"),
            ("best, K = 0 counted", "vs_best_counting_none", "best_counting_none"),
            ("the same, median of paired rounds", "paired_vs_best_counting_none", "best_counting_none"),
            ("none", "vs_none", None),
        ):
            cells = [name, vs]
            for c in levels:
                r = by_level[c]
                best = f" ({r[best_key]})" if best_key and key in r else ""
                cells.append(f"{r[key]:.3f}x{best}" if key in r else "")
            table.add_row(*cells)
            md.append("| " + " | ".join(cells) + " |")
    return table, md


def render(
    figs: Figures,
    peers: Figures,
    levels: list[int],
    console: Console,
    rat: dict[str, dict[int, dict[str, float | str]]],
) -> str:
    """Print the tables (rat: `ratios`); return them as Markdown."""
    parts = [
        level_table("steady-state tokens/s (sum: across levels)", "tokens_per_s", ".1f", figs, peers, levels, True),
        level_table("tokens/s with the drain", "tokens_per_s_all", ".1f", figs, {}, levels, total=True),
        level_table("p50 per-token latency (ms)", "tpot_p50_ms", ".2f", figs, peers, levels, total=False),
        level_table("mean K chosen per step", "mean_k_chosen", ".2f", figs, {}, levels, total=False),
        level_table("mean K proposed per step", "mean_k", ".2f", figs, {}, levels, total=False),
        level_table("tau (tokens per target forward)", "mean_accepted_tokens", ".2f", figs, {}, levels, total=False),
        level_table("mean prompt tokens per request", "mean_prompt_tokens", ".0f", figs, {}, levels, total=False),
    ]
    if rat:
        parts.append(ratio_table(rat, levels))
    md: list[str] = []
    for table, lines in parts:
        console.print(table)
        md += [*lines, ""]
    return "\n".join(md)


def k_traces(runs: dict[str, dict[int, LevelRun]]) -> dict[str, dict[int, dict[str, list]]]:
    return {
        name: {
            c: {
                "max": run.k_max,
                "mean": [round(k, 3) for k in run.k_mean],
                "chosen": [round(k, 3) for k in run.k_chosen],
            }
            for c, run in levels.items()
        }
        for name, levels in runs.items()
    }


def plot_tps(path: Path, arms: list[ArmSpec], figs: Figures, peers: Figures, levels: list[int]) -> None:
    """tok/s against concurrency: fixed arms thin and grey, dynamic ones bold and coloured, peers as marks."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    fixed = [a for a in arms if a.is_fixed]
    colours = iter(plt.get_cmap("tab10").colors)
    for arm in arms:
        ys = [figs[arm.name][c]["tokens_per_s"] for c in levels]
        if arm.is_fixed:
            grey = str(0.25 + 0.5 * fixed.index(arm) / max(len(fixed) - 1, 1))
            ax.plot(levels, ys, color=grey, linewidth=1, marker=".", label=arm.name)
        else:
            ax.plot(levels, ys, color=next(colours), linewidth=2.5, marker="o", label=arm.name)
    for marker, (name, row) in zip("xP*D^v", peers.items(), strict=False):
        ax.scatter([1], [row[1]["tokens_per_s"]], marker=marker, s=60, color="black", label=name, zorder=3)
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [str(c) for c in levels])
    ax.set_xlabel("concurrency (requests in flight)")
    ax.set_ylabel("output tokens/s")
    ax.set_title("closed-loop load sweep")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_k(path: Path, arms: list[ArmSpec], runs: dict[str, dict[int, LevelRun]], levels: list[int]) -> None:
    """K proposed per step for each dynamic arm (every arm if none is dynamic) at the lowest and highest level."""
    import matplotlib.pyplot as plt

    shown = [a for a in arms if not a.is_fixed] or arms
    cols = sorted({levels[0], levels[-1]})
    fig, axes = plt.subplots(len(shown), len(cols), figsize=(6 * len(cols), 2.5 * len(shown)), squeeze=False)
    for row, arm in zip(axes, shown, strict=True):
        for ax, c in zip(row, cols, strict=True):
            run = runs[arm.name][c]
            ax.step(range(len(run.k_max)), run.k_max, where="post", linewidth=1, label="max proposed")
            ax.plot(run.k_mean, linewidth=1, alpha=0.7, label="mean proposed")
            ax.plot(run.k_chosen, linewidth=1, linestyle="--", alpha=0.7, label="mean chosen by controller")
            ax.set_title(f"{arm.name}, C={c}", fontsize=9)
            ax.set_xlabel("decode step")
            ax.set_ylabel("K")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def report(
    output: Path,
    meta: dict,
    arms: list[ArmSpec],
    cfg: SweepConfig,
    runs: dict[str, dict[int, LevelRun]],
    peers: dict[str, LevelRun],
    console: Console,
) -> dict:
    """Print the tables and write `output` (JSON) with .md, _tps.png and _k.png beside it; returns the JSON."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a benchmark machine
    levels = cfg.concurrency
    figs, peer_figs = figures(runs), {name: {1: run.summary()} for name, run in peers.items()}
    rat = ratios(arms, figs, levels, runs)
    md = render(figs, peer_figs, levels, console, rat)
    payload = {
        **meta,
        "concurrency": levels,
        "max_tokens": cfg.max_tokens,
        "requests_per_level": {c: cfg.total_requests(c) for c in levels},
        "rounds": {c: cfg.rounds(c) for c in levels},
        "staggered": cfg.stagger,
        "arms": {a.name: {"controller": a.controller, "k": a.k} for a in arms},
        "results": figs,
        "peers": peer_figs,
        "ratios": rat,
        "round_tokens_per_s": {name: {c: run.round_tps for c, run in by_c.items()} for name, by_c in runs.items()},
        "sum_tokens_per_s": {name: sum(r["tokens_per_s"] for r in row.values()) for name, row in figs.items()},
        "k_traces": k_traces(runs),
    }
    output.parent.mkdir(parents=True, exist_ok=True)
    stem = output.with_suffix("")
    paths = [output, output.with_suffix(".md"), Path(f"{stem}_tps.png"), Path(f"{stem}_k.png")]
    write_result(paths[0], payload, indent=1)
    header = "\n".join(f"- {k}: {meta[k]}" for k in ("command", "machine", "date") if k in meta)
    paths[1].write_text(f"{header}\n\n{md}\n")
    plot_tps(paths[2], arms, figs, peer_figs, levels)
    plot_k(paths[3], arms, runs, levels)
    console.print("wrote " + ", ".join(map(str, paths)))
    return payload
