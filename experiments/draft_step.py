"""What a draft model's one-token step costs as the engine loads it, and as it was loaded before.

Usage:
    python -m experiments.draft_step --drafts smollm2-135m-instruct-draft [--rounds 5] \
        [--output results/draft_step.json]

Per draft, three ways, the arms interleaved round by round (each round times every arm once; the median over
rounds is reported): the eager step with an fp32 drafting head (how drafts ran before they were compiled), the
compiled step with an fp32 head, and the compiled step with the head in the precision drafting_dtype picks here
(bf16 where it is native). Each time is the median one-token decode step after 256 cached tokens
(bench/draft_tradeoff.py), with the target's step beside them for the ratio c.
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

import torch

from experiments.draft_agreement import drafts_parser, run_and_write
from specdecode.bench.draft_tradeoff import decode_step_ms
from specdecode.bench.lib import provenance
from specdecode.drafters.draft_model import load_draft
from specdecode.drafters.subset_head import DRAFTING_DTYPE_ENV, VOCAB_FILE
from specdecode.models.compiled import load_target
from specdecode.models.llama import LlamaModel
from specdecode.models.loader import resolve_model_dir


def _loaded(path: Path, compiled: bool, head_dtype: str | None) -> LlamaModel:
    """The draft at `path` loaded by load_draft with the drafting head's precision forced (None: the default)."""
    saved = os.environ.pop(DRAFTING_DTYPE_ENV, None)
    if head_dtype is not None:
        os.environ[DRAFTING_DTYPE_ENV] = head_dtype
    try:
        vocab = path / VOCAB_FILE if (path / VOCAB_FILE).is_file() else None
        return load_draft(path, "cpu", torch.float32, enforce_eager=not compiled, vocab=vocab)
    finally:
        os.environ.pop(DRAFTING_DTYPE_ENV, None)
        if saved is not None:
            os.environ[DRAFTING_DTYPE_ENV] = saved


def arms_of(draft: str) -> dict[str, LlamaModel]:
    """{label: model}: eager and compiled with an fp32 drafting head, and compiled with the head the engine picks
    on this machine when nothing forces it (a draft without a drafting vocabulary has no separate head)."""
    path = resolve_model_dir(draft)
    default = _loaded(path, True, None)
    head = getattr(default.lm_head, "head", None)
    dtype = "no subset" if head is None else str(head.dtype).removeprefix("torch.")
    return {
        "eager, fp32 head": _loaded(path, False, "float32"),
        "compiled, fp32 head": _loaded(path, True, "float32"),
        f"compiled, {dtype} head (default)": default,
    }


def run(a: argparse.Namespace) -> dict:
    target = load_target(resolve_model_dir(a.target), "cpu", torch.float32, enforce_eager=False)
    arms = {(d, name): m for d in a.drafts for name, m in arms_of(d).items()}
    times: dict[tuple[str, str], list[float]] = {key: [] for key in arms}
    target_times = []
    for _ in range(a.rounds):
        target_times.append(decode_step_ms(target))
        for key, model in arms.items():
            times[key].append(decode_step_ms(model))
    target_ms = statistics.median(target_times)
    rows: dict[str, dict] = {}
    for (draft, name), ts in times.items():
        ms = statistics.median(ts)
        rows.setdefault(draft, {})[name] = {"ms": ms, "c": ms / target_ms, "rounds_ms": ts}
        print(f"{draft} {name}: {ms:.2f} ms (c = {ms / target_ms:.3f})")
    print(f"target: {target_ms:.2f} ms")
    return {**provenance(__spec__.name), "target_ms": target_ms, "drafts": rows}


def main(argv: list[str] | None = None) -> None:
    p = drafts_parser(__doc__)
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds; each times every arm once")
    run_and_write(p, run, argv)


if __name__ == "__main__":
    main()
