"""Distillation throughput from a teacher cache against the target on the fly, and the cache's one-off cost.

Usage:
    python -m experiments.distill_cache --target smollm2-135m-instruct \
        --data ../shared/data/distill/smollm2_135m_instruct_responses_part2.npz --samples 200 \
        --steps 20 --batch-size 4 --seq-len 256 --layers 2 [--head eagle] --output results/distill_cache.json

    # the shipped draft's configuration (assets/drafts/smollm2-135m-instruct-draft): a draft-vocabulary cache
    python -m experiments.distill_cache ... --layers 2 --init-from-target --freeze-embeddings \
        --draft-vocab 16384 --output results/distill_cache_draft_vocab.json

The first --samples samples of --data are cached (`distill cache`, timed over the pass alone), then the same
draft (or --head) is trained --steps steps on the fly (padded, `distill --no-pack`, as before packing; then
packed, the default) and from the cache. A training rate is the difference of two runs, --warmup steps and
--warmup + --steps steps, each timed over its steps alone (the manifest's train_seconds: no loading, no
checkpoints), so the first steps' one-off costs cancel; tokens/s counts the input tokens of the timed steps, as
`distill` does. The arms run in turn, --rounds times, and each reports its median round: a shared 2-core host
drifts by tens of percent over minutes. The cache is built with this process's settings (--dtype, --top-k): it
is the rate of what a user would run, not of the exact top-k = vocab case. With --draft-vocab N the cache is
built for that draft vocabulary (`distill cache --draft-vocab N`), as training it requires. With --bf16 the
cached run is repeated under bf16 autocast (`distill --bf16`): mixed precision's speedup, apart from the cache's.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
from datetime import date
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from specdecode.bench.lib import write_result
from specdecode.hardware import cpu_model
from specdecode.train.build_cache import CacheConfig, build_cache
from specdecode.train.distill import DistillConfig, distill
from specdecode.train.draft_config import DraftOptions


def first_samples(paths: list[str], num: int, out: Path) -> Path:
    """The first `num` samples of the files (in order), as one token file."""
    seqs, prompt_len, response_len = [], [], []
    for p in paths:
        with np.load(p) as d:
            tokens, offsets = d["tokens"], d["offsets"]
            for i in range(min(num - len(seqs), len(offsets) - 1)):
                seqs.append(tokens[offsets[i] : offsets[i + 1]])
                prompt_len.append(int(d["prompt_len"][i]))
                response_len.append(int(d["response_len"][i]))
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in seqs])]).astype(np.int64)
    np.savez(
        out,
        tokens=np.concatenate(seqs),
        offsets=offsets,
        prompt_len=np.asarray(prompt_len, np.int64),
        response_len=np.asarray(response_len, np.int64),
    )
    return out


def train_rate(
    a: argparse.Namespace, data: Path, cache: Path | None, work: Path, bf16: bool = False, pack: bool = True
) -> dict:
    """Tokens/s of a.steps training steps (the difference of two runs; see the module docstring)."""
    runs = []
    for steps in (a.warmup, a.warmup + a.steps):
        name = f"{'cache' if cache else 'fly'}-{'bf16-' if bf16 else ''}{'' if pack else 'padded-'}{steps}"
        cfg = DistillConfig(
            target=a.target,
            data=[str(data)],
            out=str(work / f"student-{name}"),
            draft=DraftOptions(
                num_layers=a.layers,
                init_from_target=a.init_from_target,
                freeze_embeddings=a.freeze_embeddings,
                vocab_subset=a.draft_vocab,
            ),
            steps=steps,
            batch_size=a.batch_size,
            seq_len=a.seq_len,
            save_every=10**9,
            overwrite=True,  # the next round's run of this arm
            device=a.device,
            progress=False,
            head=a.head,
            teacher_cache=str(cache) if cache else None,
            bf16=bf16,
            pack=pack,
        )
        m = distill(cfg).manifest
        runs.append((m["train_seconds"], m["tokens_seen"], m["final_loss"]))
    (t_short, tok_short, _), (t_long, tok_long, final_loss) = runs
    seconds, tokens = t_long - t_short, tok_long - tok_short
    return {
        "tokens_per_s": tokens / max(seconds, 1e-9),
        "seconds": seconds,
        "tokens": tokens,
        "steps": a.steps,
        "final_loss": final_loss,
    }


def median_run(runs: list[dict]) -> dict:
    """The round with the median tokens/s (the lower middle of an even count), with every round's rate."""
    ordered = sorted(runs, key=lambda r: r["tokens_per_s"])
    return {**ordered[(len(ordered) - 1) // 2], "rounds_tokens_per_s": [r["tokens_per_s"] for r in runs]}


def machine() -> str:
    cpu = cpu_model()
    gpu = f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
    return (
        f"{platform.machine()} {os.cpu_count()}-core {cpu}{gpu}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads"
    )


ROWS = (  # result key, label
    ("on_the_fly_padded", "on the fly, padded"),
    ("on_the_fly", "on the fly"),
    ("from_cache", "from cache"),
    ("from_cache_bf16", "  ... with --bf16"),
)


def print_table(result: dict) -> None:
    """Each training arm against the on-the-fly ones: padded (--no-pack, as before packing; drafts only) and
    packed (for heads: as they train, one window a row)."""
    build = result["build"]
    bases = [b for b in ("on_the_fly_padded", "on_the_fly") if b in result]
    names = {"on_the_fly_padded": "vs fly padded", "on_the_fly": "vs fly"}
    print(f"{'train':<20} {'tok/s':>10} {'seconds':>9}" + "".join(f" {names[b]:>13}" for b in bases))
    for key, label in ROWS:
        if key in result:
            r = result[key]["tokens_per_s"]
            vs = "".join(f" {r / result[b]['tokens_per_s']:>12.2f}x" for b in bases)
            print(f"{label:<20} {r:>10.0f} {result[key]['seconds']:>9.2f}{vs}")
    print(f"{'build cache (once)':<20} {build['tokens_per_s']:>10.0f} {build['seconds']:>9.2f}")
    print(f"cache: {build['positions']:,} positions, {build['bytes'] / 1e6:.1f} MB on disk")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="smollm2-135m-instruct")
    p.add_argument("--data", nargs="+", required=True, help="token files (.npz) in the distillation format")
    p.add_argument("--samples", type=int, default=200, help="cache and train on the first N samples")
    p.add_argument("--head", choices=("eagle", "medusa", "mtp"), default=None, help="train heads, not a draft")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--init-from-target", action="store_true")
    p.add_argument("--freeze-embeddings", action="store_true", help="keep the draft's embedding (and tied head) fixed")
    p.add_argument("--draft-vocab", type=int, default=None, help="draft only the N most frequent response tokens")
    p.add_argument("--steps", type=int, default=20, help="timed training steps")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps (the short run of the difference)")
    p.add_argument("--rounds", type=int, default=3, help="run the training arms in turn this often; medians reported")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--top-k", type=int, default=64)
    p.add_argument("--dtype", default="float16", choices=["float16", "float32"])
    p.add_argument("--cache-batch-size", type=int, default=8, help="windows per target forward while caching")
    p.add_argument("--device", default="cpu")
    p.add_argument("--bf16", action="store_true", help="also train from the cache under bf16 autocast (distill --bf16)")
    p.add_argument("--output", default="results/distill_cache.json")
    a = p.parse_args(argv)
    if a.head is not None and a.draft_vocab is not None:
        p.error("--draft-vocab is for draft models; heads train from a full-vocabulary cache")
    with tempfile.TemporaryDirectory(prefix="distill_cache-") as tmp:
        work = Path(tmp)
        data = first_samples(a.data, a.samples, work / "data.npz")
        cache_cfg = CacheConfig(
            target=a.target,
            data=[str(data)],
            out=str(work / "cache"),
            top_k=a.top_k,
            features=a.head is not None,
            draft_vocab=a.draft_vocab,
            seq_len=a.seq_len,
            batch_size=a.cache_batch_size,
            dtype=a.dtype,
            device=a.device,
            progress=False,
        )
        built = build_cache(cache_cfg)
        build = {
            "tokens_per_s": built.tokens / max(built.seconds, 1e-9),
            "seconds": built.seconds,
            "tokens": built.tokens,
            "positions": built.manifest["num_loss_positions"],
            "bytes": sum(f.stat().st_size for f in built.out.glob("*.npy")),
        }
        arms = {  # result key -> (cache, bf16, pack); heads always train one window a row
            **({} if a.head else {"on_the_fly_padded": (None, False, False)}),
            "on_the_fly": (None, False, True),
            "from_cache": (built.out, False, True),
            **({"from_cache_bf16": (built.out, True, True)} if a.bf16 else {}),
        }
        runs: dict[str, list[dict]] = {key: [] for key in arms}
        for _ in tqdm(range(a.rounds), desc="rounds", disable=a.rounds == 1):
            for key, (cache, bf16, pack) in arms.items():  # the arms in turn, so a slow spell hits them all
                runs[key].append(train_rate(a, data, cache, work, bf16=bf16, pack=pack))
    result = {
        "command": "python -m experiments.distill_cache " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": machine(),
        "date": date.today().isoformat(),
        "settings": {k: v for k, v in vars(a).items() if k != "output"},
        "build": build,
        **{key: median_run(r) for key, r in runs.items()},
    }
    print_table(result)
    write_result(a.output, result)
    print(f"written to {a.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
