"""The `specdecode distill` flags. Kept free of torch imports: the CLI builds every parser at start-up."""

from __future__ import annotations

import argparse
import shlex
import sys


def add_distill_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default="smollm2-135m-instruct", help="HF directory, .gguf file or built-in name")
    p.add_argument("--data", nargs="+", required=True, help="npz files of prompt + target response tokens")
    p.add_argument("--out", required=True, help="output directory for the draft (HF format + manifest.json)")
    p.add_argument(
        "--head", choices=("eagle", "medusa", "mtp"), default=None, help="train draft heads instead of a draft model"
    )
    p.add_argument("--num-head-tokens", type=int, default=4, help="Medusa heads / MTP depths (with --head)")
    p.add_argument(
        "--eagle-steps",
        type=int,
        default=1,
        help="EAGLE: also train on the head's own guesses this many levels deep, as it drafts (EAGLE-3's "
        "training-time test; 1: teacher-forced only)",
    )
    p.add_argument("--init-heads", default=None, help="start --head training from these heads' weights")
    p.add_argument(
        "--init-draft", default=None, help="start the draft from this draft's weights (directory or built-in name)"
    )
    p.add_argument("--layers", type=int, default=2, help="draft decoder layers")
    p.add_argument("--hidden-size", type=int, default=None, help="draft width (default: the target's)")
    p.add_argument("--intermediate-size", type=int, default=None, help="MLP width (default: target's ratio)")
    p.add_argument("--num-heads", type=int, default=None, help="attention heads (default: keep the head size)")
    p.add_argument("--num-kv-heads", type=int, default=None, help="key/value heads (default: the target's ratio)")
    p.add_argument("--init-from-target", action="store_true", help="copy every target tensor whose shape fits")
    p.add_argument("--freeze-embeddings", action="store_true", help="keep the input embedding fixed")
    p.add_argument(
        "--draft-vocab",
        type=int,
        default=None,
        help="draft only the N most frequent response tokens (a cheaper LM head; written as vocab.npy)",
    )
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
    p.add_argument(
        "--teacher-cache",
        default=None,
        help="read the target's outputs from this `distill cache` directory instead of running it on every batch",
    )
    p.add_argument(
        "--bf16",
        action="store_true",
        help="train the student under bf16 autocast (the teacher stays fp32); faster where the CPU has AVX512_BF16 "
        "or AMX, or on a GPU",
    )
    p.add_argument(
        "--no-pack",
        action="store_true",
        help="one window a row, padded (drafts pack a batch's short windows into shared rows by default; the loss "
        "is the same up to float rounding)",
    )
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
        vocab_subset=a.draft_vocab,
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
        head=a.head,
        num_head_tokens=a.num_head_tokens,
        eagle_steps=a.eagle_steps,
        init_heads=a.init_heads,
        init_draft=a.init_draft,
        teacher_cache=a.teacher_cache,
        bf16=a.bf16,
        pack=not a.no_pack,
    )
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
    from specdecode.config import METHODS

    p.add_argument("--target", default="smollm2-135m-instruct", help="HF directory, .gguf file or built-in name")
    p.add_argument("--prompts", required=True, help="jsonl[.gz] of 'prompt' strings (or 'prompt_ids' token lists)")
    p.add_argument("--out", required=True, help="output .npz (OUT.partial.npz holds progress until it is done)")
    p.add_argument("--max-tokens", type=int, default=400, help="new tokens per response")
    p.add_argument("--sampled-fraction", type=float, default=0.4, help="share of prompts sampled at temperature 1")
    p.add_argument("--limit", type=int, default=None, help="only the first N prompts")
    p.add_argument("--batch-size", type=int, default=16, help="sequences the engine runs at once")
    p.add_argument("--chunk-size", type=int, default=64, help="prompts per flush of the partial output")
    p.add_argument("--method", default="ngram", choices=METHODS, help="speculation (lossless) to speed it up")
    p.add_argument("--num-speculative-tokens", type=int, default=4)
    p.add_argument("--draft", default=None, help="draft model for --method draft")
    p.add_argument("--max-prompt-tokens", type=int, default=1024, help="longer chat-formatted prompts are skipped")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--seed", type=int, default=0, help="picks the sampled prompts and their seeds")
    p.add_argument("--overwrite", action="store_true", help="replace an existing OUT")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def run_generate(a: argparse.Namespace) -> None:
    from specdecode.train.generate import GenerateConfig, generate_data

    cfg = GenerateConfig(
        prompts=a.prompts,
        out=a.out,
        target=a.target,
        max_tokens=a.max_tokens,
        sampled_fraction=a.sampled_fraction,
        limit=a.limit,
        batch_size=a.batch_size,
        chunk_size=a.chunk_size,
        method=a.method,
        num_speculative_tokens=a.num_speculative_tokens,
        draft=a.draft,
        max_prompt_tokens=a.max_prompt_tokens,
        device=a.device,
        dtype=a.dtype,
        seed=a.seed,
        overwrite=a.overwrite,
        progress=not a.no_progress,
    )
    r = generate_data(cfg)
    print(f"{r.num_samples} samples ({r.num_response_tokens:,} response tokens) written to {r.out}", end="")
    print(f"; {r.num_skipped} prompts skipped as too long" if r.num_skipped else "")


def add_cache_args(p: argparse.ArgumentParser) -> None:
    """`specdecode distill cache` (also spelled `distill-cache`): the teacher's outputs, computed once."""
    p.add_argument("--target", default="smollm2-135m-instruct", help="HF directory, .gguf file or built-in name")
    p.add_argument("--data", nargs="+", required=True, help="npz files of prompt + target response tokens")
    p.add_argument("--out", required=True, help="cache directory (.npy memory maps + manifest.json)")
    p.add_argument("--top-k", type=int, default=64, help="teacher tokens kept per position, plus the rest mass")
    p.add_argument("--features", action="store_true", help="also the final hidden states (for distill --head)")
    p.add_argument(
        "--draft-vocab",
        type=int,
        default=None,
        help="for `distill --draft-vocab N`: store the target over that subset (the same N most frequent tokens)",
    )
    p.add_argument("--seq-len", type=int, default=512, help="training window length: must match distill's")
    p.add_argument("--batch-size", type=int, default=8, help="windows per target forward")
    p.add_argument("--dtype", default="float16", choices=["float16", "float32"], help="stored log-probs, features")
    p.add_argument(
        "--teacher-dtype",
        default="float32",
        choices=["float32", "bfloat16"],
        help="the target's compute dtype for the pass: bfloat16 runs ~2x faster where the CPU multiplies bf16 "
        "natively (AVX512_BF16, AMX) or on a GPU, but is not the exact fp32 target (training data only; "
        "verification stays exact)",
    )
    p.add_argument("--device", default="cpu")
    p.add_argument("--save-every", type=float, default=30.0, help="seconds between progress commits")
    p.add_argument("--resume", action="store_true", help="finish an interrupted cache in OUT")
    p.add_argument("--overwrite", action="store_true", help="replace an existing OUT")
    p.add_argument(
        "--no-pack",
        action="store_true",
        help="one window a row, padded (by default a batch's short windows share rows, each attending only to "
        "itself: the same teacher up to float rounding, less padding to compute)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def run_cache(a: argparse.Namespace) -> None:
    from specdecode.train.build_cache import CacheConfig, build_cache

    cfg = CacheConfig(
        target=a.target,
        data=a.data,
        out=a.out,
        top_k=a.top_k,
        features=a.features,
        draft_vocab=a.draft_vocab,
        seq_len=a.seq_len,
        batch_size=a.batch_size,
        dtype=a.dtype,
        teacher_dtype=a.teacher_dtype,
        device=a.device,
        save_every=a.save_every,
        resume=a.resume,
        overwrite=a.overwrite,
        progress=not a.no_progress,
        command=shlex.join(["specdecode", *sys.argv[1:]]),
        pack=not a.no_pack,
    )
    r = build_cache(cfg)
    m = r.manifest
    size = sum(f.stat().st_size for f in r.out.glob("*.npy")) / 1e6
    rate = r.tokens / max(r.seconds, 1e-9)
    print(
        f"teacher cache written to {r.out}: {m['num_loss_positions']:,} positions, top-{m['top_k']}"
        f"{f' of a {cfg.draft_vocab}-token draft vocabulary' if cfg.draft_vocab else ''}"
        f"{', features' if m['features'] else ''}, {size:,.1f} MB; {r.tokens:,} tokens at {rate:.0f} tok/s"
    )
