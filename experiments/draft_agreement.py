"""Held-out agreement of draft models with their target, on the same data: drafts trained on different files
(whose own manifests scored them on different held-out sets) compared on one.

Usage:
    python -m experiments.draft_agreement --drafts smollm2-135m-instruct-draft /work/train_runs/draft-p2 \
        --data data/dev_chat_responses.npz --output results/draft_agreement.json

Per draft: the share of response positions where its argmax over its drafting vocabulary is the target's argmax
(teacher-forced, the fp32 target), and the KL from the target, as `distill --eval-data` reports them.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
import transformers

from specdecode.bench.lib import provenance, write_result
from specdecode.drafters.subset_head import VOCAB_FILE, load_subset
from specdecode.models.loader import resolve_model_dir
from specdecode.train import data as D
from specdecode.train.distill import DistillConfig, evaluate


def agreement(draft: str, target, samples: D.Samples, windows: np.ndarray, cfg: DistillConfig) -> dict:
    """{accuracy, kl, tokens} of the draft `draft` (a directory or built-in name) against `target`."""
    path = resolve_model_dir(draft)
    student = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    subset = load_subset(path / VOCAB_FILE, student.config.vocab_size) if (path / VOCAB_FILE).is_file() else None
    return evaluate(student, target, samples, windows, cfg, torch.device("cpu"), subset)


def run(a: argparse.Namespace) -> dict:
    target_dir = resolve_model_dir(a.target)
    target = transformers.AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    samples = D.load_samples([a.data], target.config.vocab_size)
    cfg = DistillConfig(a.target, [a.data], "-", seq_len=a.seq_len, batch_size=a.batch_size, progress=False)
    windows = D.window_starts(samples, cfg.seq_len)  # the same windows for every draft
    rows = {d: agreement(d, target, samples, windows, cfg) for d in a.drafts}
    for d, r in rows.items():
        print(f"{d}: agreement {r['accuracy']:.3f}, KL {r['kl']:.3f} over {r['tokens']} positions")
    return {
        **provenance(__spec__.name),
        "data": a.data,
        "seq_len": a.seq_len,
        "drafts": rows,
    }


def drafts_parser(doc: str) -> argparse.ArgumentParser:
    """The flags every per-draft bench command takes: --target, --drafts, --output."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--target", default="smollm2-135m-instruct")
    p.add_argument("--drafts", nargs="+", required=True, help="draft directories or built-in draft names")
    p.add_argument("--output", default=None, help="write the rows as JSON here")
    return p


def run_and_write(p: argparse.ArgumentParser, run, argv: list[str] | None) -> None:
    """Parse argv, run, and write the result as JSON to --output if given."""
    a = p.parse_args(argv)
    result = run(a)
    if a.output:
        write_result(a.output, result)


def main(argv: list[str] | None = None) -> None:
    p = drafts_parser(__doc__)
    p.add_argument("--data", required=True, help="held-out npz of prompt + target response tokens")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=8)
    run_and_write(p, run, argv)


if __name__ == "__main__":
    main()
