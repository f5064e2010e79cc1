"""The settings of `specdecode distill`, `distill generate` and `distill cache`: typed, frozen, checked on creation.

As in specdecode/config.py, each setting is one field: its command-line flag (name, help, choices) comes from the
field's metadata (train/args.py), and the command builds the config by field name. No torch here: the CLI builds
every parser at start-up.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from specdecode.config import (
    HEAD_KINDS,
    ConfigError,
    EngineConfig,
    SpeculativeConfig,
    check_choices,
    setting,
    setting_of,
)

DEFAULT_TARGET = "smollm2-135m-instruct"
TARGET_HELP = "HF directory, .gguf file or built-in name"
DATA_HELP = "npz files of prompt + target response tokens"
CACHE_DTYPES = ("float16", "float32")  # of a teacher cache's stored log-probs and features
TEACHER_DTYPES = ("float32", "bfloat16")  # the target's compute dtype while it builds a teacher cache
SETTINGS_KEYS = ("target", "prompts", "max_tokens", "sampled_fraction", "seed", "max_prompt_tokens")  # generate's
NO_PROGRESS = dict(option="--no-progress", action="store_false", help="no progress bar")
NO_PACK = dict(option="--no-pack", action="store_false")  # pack: a batch's short windows share rows (data.py)


def check_windows(cfg: DistillConfig | CacheConfig) -> None:
    """What `distill` and `distill cache` both check: data files given, windows of two tokens at least (an input and
    its next token), and not both --resume and --overwrite."""
    if cfg.seq_len < 2:
        raise ConfigError(f"seq-len must be >= 2, got {cfg.seq_len}")
    if not cfg.data:
        raise ConfigError("no --data files given")
    if cfg.resume and cfg.overwrite:
        raise ConfigError("--resume and --overwrite contradict each other: pick one")


@dataclass(frozen=True)
class DraftOptions:
    """The draft model's shape and how it starts."""

    num_layers: int = setting(2, option="--layers", help="draft decoder layers")
    hidden_size: int | None = setting(None, type=int, help="draft width (default: the target's)")
    # None: the target's ratio to hidden size
    intermediate_size: int | None = setting(None, type=int, help="MLP width (default: target's ratio)")
    # None: hidden_size / the target's head_dim
    num_heads: int | None = setting(None, type=int, help="attention heads (default: keep the head size)")
    # None: the target's grouping ratio, as near as divides
    num_kv_heads: int | None = setting(None, type=int, help="key/value heads (default: the target's ratio)")
    init_from_target: bool = setting(False, action="store_true", help="copy every target tensor whose shape fits")
    freeze_embeddings: bool = setting(False, action="store_true", help="keep the input embedding fixed")
    vocab_subset: int | None = setting(
        None,
        option="--draft-vocab",
        type=int,
        help="draft only the N most frequent response tokens (a cheaper LM head; written as vocab.npy)",
    )  # q = 0 outside the subset

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden_size", "intermediate_size", "num_heads", "num_kv_heads", "vocab_subset"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{name} must be >= 1, got {value}")


@dataclass(frozen=True)
class DistillConfig:
    target: str = setting(default=DEFAULT_TARGET, help=TARGET_HELP)
    data: list[str] = setting(nargs="+", help=DATA_HELP)
    out: str = setting(help="output directory for the draft (HF format + manifest.json)")
    draft: DraftOptions = field(default_factory=DraftOptions)
    steps: int = setting(1000)
    batch_size: int = setting(8)
    seq_len: int = setting(512)
    lr: float = setting(1e-3, help="peak learning rate (cosine decay to 10%%)")
    warmup: int = setting(50, help="linear warmup steps")
    weight_decay: float = setting(0.0)
    betas: tuple[float, float] = (0.9, 0.95)
    ce_weight: float = setting(0.0, help="weight of hard-label cross-entropy beside the KL")
    seed: int = setting(0)
    save_every: int = setting(100, help="checkpoint into OUT/checkpoint every N steps")
    resume: bool = setting(False, action="store_true", help="continue from OUT/checkpoint")
    overwrite: bool = setting(False, action="store_true", help="replace an existing OUT")
    device: str = setting("cpu")
    eval_data: str | None = setting(None, help="held-out npz file: token accuracy reported at the end")
    eval_max_windows: int = 512  # caps the held-out pass on large files
    progress: bool = setting(True, **NO_PROGRESS)
    command: str = ""  # the command line, recorded in the manifest
    head: str | None = setting(None, choices=HEAD_KINDS, help="train draft heads instead of a draft model")
    num_head_tokens: int = setting(4, help="Medusa heads / MTP depths (with --head)")
    eagle_steps: int = setting(
        1,
        help="EAGLE: also train on the head's own guesses this many levels deep, as it drafts (EAGLE-3's "
        "training-time test; 1: teacher-forced only)",
    )
    init_heads: str | None = setting(None, help="start --head training from these heads' weights")
    init_draft: str | None = setting(
        None, help="start the draft from this draft's weights (directory or built-in name)"
    )
    teacher_cache: str | None = setting(
        None,
        help="read the target's outputs from this `distill cache` directory instead of running it on every batch",
    )
    bf16: bool = setting(
        False,
        action="store_true",
        help="train the student under bf16 autocast (the teacher stays fp32); faster where the CPU has AVX512_BF16 "
        "or AMX, or on a GPU",
    )
    pack: bool = setting(  # drafts only: heads keep one window a row
        True,
        **NO_PACK,
        help="one window a row, padded (drafts pack a batch's short windows into shared rows by default; the loss "
        "is the same up to float rounding)",
    )

    def __post_init__(self) -> None:
        check_choices(self, flags=True)
        positive = ("steps", "batch_size", "save_every", "eval_max_windows")
        for name in positive:
            if getattr(self, name) < 1:
                raise ConfigError(f"{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        check_windows(self)
        if not self.lr > 0 or self.warmup < 0 or self.weight_decay < 0 or self.ce_weight < 0:
            raise ConfigError("lr must be > 0; warmup, weight-decay and ce-weight must be >= 0")
        if self.num_head_tokens < 1:
            raise ConfigError(f"num-head-tokens must be >= 1, got {self.num_head_tokens}")
        if self.eagle_steps < 1 or (self.eagle_steps > 1 and self.head != "eagle"):
            raise ConfigError(f"eagle-steps must be >= 1 and is for --head eagle only, got {self.eagle_steps}")
        if self.init_heads is not None and self.head is None:
            raise ConfigError("--init-heads starts draft heads: it needs --head")
        if self.init_draft is not None and self.head is not None:
            raise ConfigError("--init-draft starts a draft model: use --init-heads with --head")


@dataclass(frozen=True)
class CacheConfig:
    target: str = setting(default=DEFAULT_TARGET, help=TARGET_HELP)
    data: list[str] = setting(nargs="+", help=DATA_HELP)
    out: str = setting(help="cache directory (.npy memory maps + manifest.json)")
    top_k: int = setting(64, help="teacher tokens kept per position, plus the rest mass")
    features: bool = setting(False, action="store_true", help="also the final hidden states (for distill --head)")
    draft_vocab: int | None = setting(
        None,
        type=int,
        help="for `distill --draft-vocab N`: store the target over that subset (the same N most frequent tokens)",
    )
    seq_len: int = setting(512, help="training window length: must match distill's")
    batch_size: int = setting(8, help="windows per target forward")
    dtype: str = setting("float16", choices=CACHE_DTYPES, help="stored log-probs, features")
    teacher_dtype: str = setting(
        "float32",
        choices=TEACHER_DTYPES,
        help="the target's compute dtype for the pass: bfloat16 runs ~2x faster where the CPU multiplies bf16 "
        "natively (AVX512_BF16, AMX) or on a GPU, but is not the exact fp32 target (training data only; "
        "verification stays exact)",
    )
    device: str = setting("cpu")
    resume: bool = setting(False, action="store_true", help="finish an interrupted cache in OUT")
    overwrite: bool = setting(False, action="store_true", help="replace an existing OUT")
    save_every: float = setting(30.0, help="seconds between progress commits")  # 0: after every batch
    pack: bool = setting(  # each window still attends only to itself
        True,
        **NO_PACK,
        help="one window a row, padded (by default a batch's short windows share rows, each attending only to "
        "itself: the same teacher up to float rounding, less padding to compute)",
    )
    progress: bool = setting(True, **NO_PROGRESS)
    command: str = ""

    def __post_init__(self) -> None:
        check_choices(self, flags=True)
        if self.top_k < 1 or self.batch_size < 1:
            raise ConfigError(f"top-k and batch-size must be >= 1, got {self.top_k} and {self.batch_size}")
        if self.draft_vocab is not None and self.draft_vocab < 1:
            raise ConfigError(f"draft-vocab must be >= 1, got {self.draft_vocab}")
        if self.draft_vocab is not None and self.features:
            raise ConfigError("--features is for heads, which need a full-vocabulary cache: drop --draft-vocab")
        check_windows(self)
        if self.save_every < 0:
            raise ConfigError(f"save-every must be >= 0 seconds, got {self.save_every}")


@dataclass(frozen=True)
class GenerateConfig:
    """`distill generate`; its speculation and engine settings are the LLM's own (`setting_of`), passed by name."""

    prompts: str = setting(help="jsonl[.gz] of 'prompt' strings (or 'prompt_ids' token lists)")
    out: str = setting(help="output .npz (OUT.partial.npz holds progress until it is done)")
    target: str = setting(DEFAULT_TARGET, help=TARGET_HELP)
    max_tokens: int = setting(400, help="new tokens per response")
    sampled_fraction: float = setting(0.4, help="share of prompts sampled at temperature 1")
    limit: int | None = setting(None, type=int, help="only the first N prompts")
    batch_size: int = setting(16, help="sequences the engine runs at once")
    chunk_size: int = setting(64, help="prompts per flush of the partial output")
    # Concrete flag defaults: the LLM's own flags default to None (the target's default arm, arms.py); here the
    # generation's speculation is n-gram K = 4 unless asked otherwise.
    method: str = setting_of(SpeculativeConfig, "method", default="ngram", help="speculation (lossless) to speed it up")
    num_speculative_tokens: int = setting_of(SpeculativeConfig, "num_speculative_tokens", 4, default=4)
    draft: str | None = setting_of(SpeculativeConfig, "draft")
    max_prompt_tokens: int = setting(1024, help="longer chat-formatted prompts are skipped")
    device: str = setting_of(EngineConfig, "device")
    dtype: str = setting_of(EngineConfig, "dtype")
    seed: int = setting(0, help="picks the sampled prompts and their seeds")
    overwrite: bool = setting(False, action="store_true", help="replace an existing OUT")
    progress: bool = setting(True, **NO_PROGRESS)

    def __post_init__(self) -> None:
        if "specbench" in Path(self.prompts).name.lower().replace("-", "").replace("_", ""):
            raise ConfigError(f"{self.prompts}: benchmark prompts are for evaluation only, never training data")
        if not self.out.endswith(".npz"):
            raise ConfigError(f"--out must name a .npz file, got {self.out}")
        if not 0.0 <= self.sampled_fraction <= 1.0:
            raise ConfigError(f"sampled fraction must be in [0, 1], got {self.sampled_fraction}")
        for name in ("max_tokens", "batch_size", "chunk_size", "max_prompt_tokens"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"limit must be >= 1, got {self.limit}")

    @property
    def partial(self) -> Path:
        return Path(self.out[: -len(".npz")] + ".partial.npz")

    def settings(self) -> str:
        return json.dumps({k: v for k, v in asdict(self).items() if k in SETTINGS_KEYS}, sort_keys=True)
