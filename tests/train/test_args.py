"""The train commands' flags (train/args.py) build their configs by field name: a command line gives the config
its flags name, with the same defaults, and `distill generate` hands the LLM the keywords its settings name."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from specdecode.cli import build_parser, route_subcommands
from specdecode.train import args as train_args
from specdecode.train import build_cache, distill, generate
from specdecode.train.build_cache import CacheConfig
from specdecode.train.distill import DistillConfig
from specdecode.train.draft_config import DraftOptions
from specdecode.train.generate import GenerateConfig


class Captured(Exception):
    """Raised by the stand-in for the command's work, once it has the config."""


def parsed_config(monkeypatch, argv: list[str], module, work: str, run):
    """The config `specdecode ARGV` hands to `module.work`, which is replaced by a stand-in that keeps it."""
    seen = []

    def keep(cfg):
        seen.append(cfg)
        raise Captured

    monkeypatch.setattr(module, work, keep)
    monkeypatch.setattr(sys, "argv", ["specdecode", *argv])  # the manifest records the command line
    with pytest.raises(Captured):
        run(build_parser().parse_args(route_subcommands(argv)))
    return seen[0]


DISTILL_ALL = (
    "distill --target t --data a.npz b.npz --out o --init-draft d --layers 3 --hidden-size 64 --intermediate-size 96 "
    "--num-heads 4 --num-kv-heads 2 --init-from-target --freeze-embeddings --draft-vocab 50 --steps 7 --batch-size 3 "
    "--seq-len 33 --lr 0.01 --warmup 2 --weight-decay 0.1 --ce-weight 0.5 --seed 9 --save-every 4 --resume "
    "--device meta --eval-data e.npz --teacher-cache c --bf16 --no-pack --no-progress"
)
HEADS_ALL = "distill --data a.npz --out o --head eagle --num-head-tokens 3 --eagle-steps 2 --init-heads h --overwrite"
DISTILL_CASES = [
    ("distill --data a.npz --out o", DistillConfig("smollm2-135m-instruct", ["a.npz"], "o")),
    (
        DISTILL_ALL,
        DistillConfig(
            "t",
            ["a.npz", "b.npz"],
            "o",
            DraftOptions(3, 64, 96, 4, 2, init_from_target=True, freeze_embeddings=True, vocab_subset=50),
            steps=7,
            batch_size=3,
            seq_len=33,
            lr=0.01,
            warmup=2,
            weight_decay=0.1,
            ce_weight=0.5,
            seed=9,
            save_every=4,
            resume=True,
            device="meta",
            eval_data="e.npz",
            progress=False,
            init_draft="d",
            teacher_cache="c",
            bf16=True,
            pack=False,
        ),
    ),
    (
        HEADS_ALL,
        DistillConfig(
            "smollm2-135m-instruct",
            ["a.npz"],
            "o",
            overwrite=True,
            head="eagle",
            num_head_tokens=3,
            eagle_steps=2,
            init_heads="h",
        ),
    ),
]


@pytest.mark.parametrize(("line", "expected"), DISTILL_CASES, ids=["defaults", "draft", "heads"])
def test_distill_flags_reach_the_config(monkeypatch, line, expected):
    cfg = parsed_config(monkeypatch, line.split(), distill, "distill", train_args.run_distill)
    assert cfg == DistillConfig(**{**vars(expected), "command": "specdecode " + line})


GENERATE_ALL = (
    "distill generate --target t --prompts p.jsonl --out o.npz --max-tokens 5 --sampled-fraction 0.25 --limit 3 "
    "--batch-size 2 --chunk-size 9 --method draft --num-speculative-tokens 6 --draft d --max-prompt-tokens 77 "
    "--device meta --dtype bfloat16 --seed 4 --overwrite --no-progress"
)
GENERATE_CASES = [
    ("distill generate --prompts p.jsonl --out o.npz", GenerateConfig("p.jsonl", "o.npz")),
    (
        GENERATE_ALL,
        GenerateConfig(
            "p.jsonl", "o.npz", "t", 5, 0.25, 3, 2, 9, "draft", 6, "d", 77, "meta", "bfloat16", 4, True, False
        ),
    ),
]


@pytest.mark.parametrize(("line", "expected"), GENERATE_CASES, ids=["defaults", "all"])
def test_generate_flags_reach_the_config(monkeypatch, line, expected):
    assert parsed_config(monkeypatch, line.split(), generate, "generate_data", train_args.run_generate) == expected


CACHE_ALL = (
    "distill cache --target t --data a.npz --out o --top-k 8 --draft-vocab 40 --seq-len 30 --batch-size 2 "
    "--dtype float32 --teacher-dtype bfloat16 --device meta --save-every 0.5 --overwrite --no-pack --no-progress"
)
CACHE_CASES = [
    ("distill cache --data a.npz b.npz --out o", CacheConfig("smollm2-135m-instruct", ["a.npz", "b.npz"], "o")),
    (
        "distill cache --data a.npz --out o --features --resume",
        CacheConfig("smollm2-135m-instruct", ["a.npz"], "o", features=True, resume=True),
    ),
    (
        CACHE_ALL,
        CacheConfig(
            "t", ["a.npz"], "o", 8, False, 40, 30, 2, "float32", "bfloat16", "meta",
            overwrite=True, save_every=0.5, pack=False, progress=False,
        ),
    ),
]  # fmt: skip


@pytest.mark.parametrize(("line", "expected"), CACHE_CASES, ids=["defaults", "features", "all"])
def test_cache_flags_reach_the_config(monkeypatch, line, expected):
    cfg = parsed_config(monkeypatch, line.split(), build_cache, "build_cache", train_args.run_cache)
    assert cfg == CacheConfig(**{**vars(expected), "command": "specdecode " + line})


@pytest.mark.parametrize(
    ("kw", "llm_kwargs"),
    [
        (
            {},
            dict(target="smollm2-135m-instruct", draft=None, method="ngram", num_speculative_tokens=4),
        ),
        (
            dict(target="t", draft="d", method="draft", num_speculative_tokens=6, device="meta", dtype="bfloat16"),
            dict(target="t", draft="d", method="draft", num_speculative_tokens=6, device="meta", dtype="bfloat16"),
        ),
    ],
)
def test_generate_builds_the_llm_its_settings_name(monkeypatch, kw, llm_kwargs):
    """The LLM keywords `distill generate` passes: its speculation settings by name, its batch size as
    max_num_seqs and room for the longest prompt and response."""
    seen = {}

    def fake_llm(target, **kwargs):
        seen.update(target=target, **kwargs)
        return SimpleNamespace(target=SimpleNamespace(cfg=SimpleNamespace(vocab_size=10)), tokenizer=[0] * 10)

    monkeypatch.setattr("specdecode.llm.LLM", fake_llm)
    cfg = GenerateConfig("p.jsonl", "o.npz", batch_size=3, max_prompt_tokens=20, max_tokens=5, **kw)
    generate._make_llm(cfg)
    assert seen == {"device": "cpu", "dtype": "float32", **llm_kwargs, "max_num_seqs": 3, "max_model_len": 25}


@pytest.mark.parametrize(
    ("command", "lines"),
    [
        ("distill", [DISTILL_ALL, HEADS_ALL]),
        ("distill-generate", [GENERATE_ALL]),
        ("distill-cache", [CACHE_ALL, CACHE_CASES[1][0]]),  # --features, --resume: not with --draft-vocab, --overwrite
    ],
)
def test_the_lines_above_set_every_flag(command, lines):
    """So that each flag is seen reaching its field."""
    sub = build_parser()._subparsers._group_actions[0].choices[command]
    flags = {s for a in sub._actions for s in a.option_strings} - {"-h", "--help"}
    assert {w for line in lines for w in line.split() if w.startswith("--")} == flags
