"""The `specdecode distill` flags. Kept free of torch imports: the CLI builds every parser at start-up."""

from __future__ import annotations

import argparse
import shlex
import sys


def add_distill_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default="smollm2-135m-instruct", help="HF directory, .gguf file or built-in name")
    p.add_argument("--data", nargs="+", required=True, help="npz files of prompt + target response tokens")
    p.add_argument("--out", required=True, help="output directory for the draft (HF format + manifest.json)")
    p.add_argument("--layers", type=int, default=2, help="draft decoder layers")
    p.add_argument("--hidden-size", type=int, default=None, help="draft width (default: the target's)")
    p.add_argument("--intermediate-size", type=int, default=None, help="MLP width (default: target's ratio)")
    p.add_argument("--num-heads", type=int, default=None, help="attention heads (default: keep the head size)")
    p.add_argument("--num-kv-heads", type=int, default=None, help="key/value heads (default: the target's ratio)")
    p.add_argument("--init-from-target", action="store_true", help="copy every target tensor whose shape fits")
    p.add_argument("--freeze-embeddings", action="store_true", help="keep the input embedding fixed")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (cosine decay to 10%%)")
    p.add_argument("--warmup", type=int, default=50, help="linear warmup steps")
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--ce-weight", type=float, default=0.0, help="weight of hard-label cross-entropy beside the KL")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save-every", type=int, default=100, help="checkpoint into OUT/checkpoint every N steps")
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint")
    p.add_argument("--overwrite", action="store_true", help="replace an existing OUT")
    p.add_argument("--device", default="cpu")
    p.add_argument("--eval-data", default=None, help="held-out npz file: token accuracy reported at the end")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def run_distill(a: argparse.Namespace) -> None:
    from specdecode.train.distill import DistillConfig, distill  # torch only once the arguments parse
    from specdecode.train.draft_config import DraftOptions

    draft = DraftOptions(
        num_layers=a.layers,
        hidden_size=a.hidden_size,
        intermediate_size=a.intermediate_size,
        num_heads=a.num_heads,
        num_kv_heads=a.num_kv_heads,
        init_from_target=a.init_from_target,
        freeze_embeddings=a.freeze_embeddings,
    )
    cfg = DistillConfig(
        target=a.target,
        data=a.data,
        out=a.out,
        draft=draft,
        steps=a.steps,
        batch_size=a.batch_size,
        seq_len=a.seq_len,
        lr=a.lr,
        warmup=a.warmup,
        weight_decay=a.weight_decay,
        ce_weight=a.ce_weight,
        seed=a.seed,
        save_every=a.save_every,
        resume=a.resume,
        overwrite=a.overwrite,
        device=a.device,
        eval_data=a.eval_data,
        progress=not a.no_progress,
        command=shlex.join(["specdecode", *sys.argv[1:]]),
    )
    result = distill(cfg)
    m = result.manifest
    line = f"draft written to {result.out}: {m['parameters']:,} parameters"
    if m["final_loss"] is not None:
        line += f", final loss {m['final_loss']:.4f}, token accuracy {m['final_accuracy']:.3f}"
    if m["eval"]:
        line += f", held-out token accuracy {m['eval']['accuracy']:.3f}"
    print(line)
