"""The `specdecode distill` flags: one per settings field of the train configs (train/config.py), which the
commands build by field name. Kept free of torch imports: the CLI builds every parser at start-up."""

from __future__ import annotations

import argparse
import shlex
import sys

from specdecode.config import add_flags, from_flags
from specdecode.train.config import CacheConfig, DistillConfig, DraftOptions, GenerateConfig


def command_line() -> str:
    """This process's command line, as the manifest records it."""
    return shlex.join(["specdecode", *sys.argv[1:]])


def add_distill_args(p: argparse.ArgumentParser) -> None:
    add_flags(p, DistillConfig, DraftOptions)


def run_distill(a: argparse.Namespace) -> None:
    from specdecode.train.distill import distill  # torch only once the arguments parse

    cfg = from_flags(DistillConfig, a, draft=from_flags(DraftOptions, a), command=command_line())
    result = distill(cfg)
    m = result.manifest
    if cfg.head is not None:
        acc = "/".join(f"{x:.3f}" for x in m["final_accuracy"] or [])
        print(f"{cfg.head} heads written to {result.out}: {m['parameters']:,} parameters, top-1 agreement {acc}")
        return
    line = f"draft written to {result.out}: {m['parameters']:,} parameters"
    if m["final_loss"] is not None:
        line += f", final loss {m['final_loss']:.4f}, token accuracy {m['final_accuracy']:.3f}"
    if m["eval"]:
        line += f", held-out token accuracy {m['eval']['accuracy']:.3f}"
    print(line)


def add_generate_args(p: argparse.ArgumentParser) -> None:
    """`specdecode distill generate` (also spelled `distill-generate`): more data from the target itself."""
    add_flags(p, GenerateConfig)


def run_generate(a: argparse.Namespace) -> None:
    from specdecode.train.generate import generate_data

    r = generate_data(from_flags(GenerateConfig, a))
    print(f"{r.num_samples} samples ({r.num_response_tokens:,} response tokens) written to {r.out}", end="")
    print(f"; {r.num_skipped} prompts skipped as too long" if r.num_skipped else "")


def add_cache_args(p: argparse.ArgumentParser) -> None:
    """`specdecode distill cache` (also spelled `distill-cache`): the teacher's outputs, computed once."""
    add_flags(p, CacheConfig)


def run_cache(a: argparse.Namespace) -> None:
    from specdecode.train.build_cache import build_cache

    cfg = from_flags(CacheConfig, a, command=command_line())
    r = build_cache(cfg)
    m = r.manifest
    size = sum(f.stat().st_size for f in r.out.glob("*.npy")) / 1e6
    rate = r.tokens / max(r.seconds, 1e-9)
    print(
        f"teacher cache written to {r.out}: {m['num_loss_positions']:,} positions, top-{m['top_k']}"
        f"{f' of a {cfg.draft_vocab}-token draft vocabulary' if cfg.draft_vocab else ''}"
        f"{', features' if m['features'] else ''}, {size:,.1f} MB; {r.tokens:,} tokens at {rate:.0f} tok/s"
    )
