"""Typed, frozen configuration. Every check runs on creation so bad input fails before any work starts."""

from __future__ import annotations

import argparse
import os
from dataclasses import MISSING, Field, dataclass, field, fields
from pathlib import Path

MAX_SPECULATIVE_TOKENS = 64
# Recent tokens a draft model attends to past its 4-token sink (drafters/draft_window.py). A window costs drafts
# that need the far context: on the dev code prompts at 8k tokens (experiments/draft_window_dev.py) acceptance at
# K = 1 was 0.88 unwindowed, 0.78 with 4,096, 0.64 with 1,024. So it engages only where the draft's cache outgrows
# its weights: the 0.5B Qwen2.5-Coder draft's fp32 K/V are ~25 KB a token, its weights 279 MB a step, level at
# ~11k tokens; 8,192 caps its cache at ~0.7x its weights (400 MB a step at 16k tokens unwindowed).
DEFAULT_DRAFT_WINDOW = 8192
MAX_N = 16  # samples per request (SamplingParams.n); each takes a cache slot
MAX_LOGPROBS = 20  # top alternatives per token, OpenAI's limit
METHODS = (
    "draft",
    "ngram",
    "ngram_tree",
    "suffix",
    "suffix_tree",
    "eagle",
    "medusa",
    "mtp",
    "layer_skip",
    "self",
    "none",
)
CONTROLLER_NAMES = ("goodput", "fixed", "heuristic", "confidence")  # built by specdecode.control.CONTROLLERS
HEAD_KINDS = ("eagle", "medusa", "mtp")  # draft heads (specdecode/heads/)
DTYPES = ("float32", "bfloat16", "float16")
WEIGHTS = ("quantized", "fp32")  # EngineConfig.weights; the first is the default
ARITHMETICS = ("exact", "fast")  # EngineConfig.arithmetic; the first is the default
KV_CACHE_DTYPES = ("auto", "fp32", "bf16")  # EngineConfig.kv_cache_dtype (models/kv_dtype.py); the first is the default
# SpeculativeConfig.draft_weights (models/requantize.py); the first is the default
DRAFT_WEIGHTS = ("q4_0", "q4_1", "file")
WEIGHTS_ENV = "SPECDECODE_WEIGHTS"  # weights=None reads it
ARITHMETIC_ENV = "SPECDECODE_ARITHMETIC"  # arithmetic=None reads it


class ConfigError(ValueError):
    """A user-facing configuration error; its message is shown as one line."""


def setting(value=MISSING, cli: bool = True, option: str | None = None, **flag):
    """A settings field: its default value (none: a required flag, unless the flag has a default of its own), and
    how its command-line flag reads (argparse keywords: help, choices, type, action, nargs; a `default` here is the
    flag's own, e.g. None for a repeatable flag); option: the flag's name where it is not the field's
    (`--layers` for num_layers; `--no-pack` with action="store_false" for pack); cli=False: no flag."""
    return field(default=value, metadata={"cli": cli, "option": option, "flag": flag})


def setting_of(config: type, name: str, value=MISSING, **flag):
    """Another config's field for the setting `config.name` (an LLM keyword a command passes on by name): the same
    flag, with its own default `value` (else the same) and any argparse keywords in `flag` replaced."""
    f = next(f for f in fields(config) if f.name == name)
    value = f.default if value is MISSING else value
    return setting(value, f.metadata["cli"], f.metadata["option"], **{**f.metadata["flag"], **flag})


def cli_fields(*configs: type) -> list:
    """The fields of the given config classes that are command-line flags, in order."""
    return [f for c in configs for f in fields(c) if f.metadata.get("cli", False)]


def flag_name(f: Field) -> str:
    """A settings field's command-line flag: `--num-speculative-tokens` for num_speculative_tokens, or its option."""
    return f.metadata["option"] or "--" + f.name.replace("_", "-")


def add_flags(p: argparse.ArgumentParser, *configs: type) -> None:
    """One flag per settings field of `configs`, from the field's metadata; each stores into the field's name."""
    for f in cli_fields(*configs):
        flag = dict(f.metadata["flag"])
        if f.default is not MISSING:
            flag.setdefault("default", f.default)
        elif "default" not in flag:
            flag["required"] = True
        if "action" not in flag and "type" not in flag and flag.get("default") is not None:
            flag["type"] = type(flag["default"])
        p.add_argument(flag_name(f), dest=f.name, **flag)


def check_choices(config, flags: bool = False) -> None:
    """A ConfigError for a settings field whose value is not one of its flag's choices (None passes where it is the
    field's default). The message names the field, or with flags=True its command-line flag."""
    for f in cli_fields(type(config)):
        choices, value = f.metadata["flag"].get("choices"), getattr(config, f.name)
        if choices is None or value in choices or (value is None and f.default is None):
            continue
        name = flag_name(f) if flags else f.name
        raise ConfigError(f"unknown {name} {value!r}; expected one of {', '.join(choices)}")


def from_flags(config: type, a: argparse.Namespace, **others):
    """`config` built from its flags' values by field name; `others` are its fields that are not flags."""
    return config(**{f.name: getattr(a, f.name) for f in cli_fields(config)}, **others)


def split_settings(settings: dict, *configs: type) -> list[dict]:
    """`settings` (keyword arguments named after config fields) split per config class; an unknown name is a
    TypeError, as a misspelt keyword argument is."""
    parts = [{f.name: settings[f.name] for f in fields(c) if f.name in settings} for c in configs]
    unknown = set(settings) - {name for part in parts for name in part}
    if unknown:
        raise TypeError(f"unexpected keyword argument(s): {', '.join(sorted(unknown))}")
    return parts


FLOAT32_MAX = 3.4028234663852886e38  # the largest finite float32: the sampling arithmetic is fp32


@dataclass(frozen=True)
class StructuredOutputs:
    """Constrained output, as vLLM's StructuredOutputsParams: `json` (a JSON schema) or `json_object` (any object)."""

    json: dict | None = None
    json_object: bool = False

    def __post_init__(self) -> None:
        if (self.json is None) == (not self.json_object):
            raise ConfigError("structured outputs need exactly one of a JSON schema (json) or json_object=True")
        if self.json is not None and not isinstance(self.json, dict):
            raise ConfigError(f"a JSON schema must be an object, got {type(self.json).__name__}")


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling, as in vLLM. temperature 0 is greedy; top_k 0 and top_p 1 disable those filters.

    Penalties follow vLLM (and OpenAI): presence and frequency count the output tokens, repetition (vLLM's
    extension) the prompt's and the output's; logit_bias adds to the raw logits. All of them, and a structured
    output's grammar, shape the distribution every token is drawn from, drafted or not. logprobs = N returns the
    emitted token's log-probability and the N most likely alternatives (0 = the emitted token's only).
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 128
    seed: int | None = None
    stop: list[str] | None = None
    ignore_eos: bool = False
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    logprobs: int | None = None
    structured_outputs: StructuredOutputs | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.temperature <= FLOAT32_MAX:  # sampling divides fp32 logits by it: inf would make NaN
            raise ConfigError(f"temperature must be in [0, {FLOAT32_MAX:.4g}], got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ConfigError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if self.max_tokens < 1:
            raise ConfigError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", [self.stop])
        if self.stop is not None and any(not s for s in self.stop):
            raise ConfigError("stop strings must be non-empty")
        if not 1 <= self.n <= MAX_N:
            raise ConfigError(f"n must be in 1..{MAX_N}, got {self.n}")
        self._check_penalties()
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise ConfigError(f"logprobs must be in 0..{MAX_LOGPROBS}, got {self.logprobs}")

    def _check_penalties(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not -2.0 <= value <= 2.0:
                raise ConfigError(f"{name} must be in [-2, 2], got {value}")
        # Bounded below so that dividing a logit by it stays finite (the schema fuzzer found 5e-324).
        if not 0.01 <= self.repetition_penalty <= 10.0:
            raise ConfigError(f"repetition_penalty must be in [0.01, 10], got {self.repetition_penalty}")
        for token, bias in (self.logit_bias or {}).items():
            if not isinstance(token, int) or token < 0:
                raise ConfigError(f"logit_bias keys must be token ids >= 0, got {token!r}")
            if not -100.0 <= bias <= 100.0:
                raise ConfigError(f"logit_bias values must be in [-100, 100], got {bias} for token {token}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def adjusts_logits(self) -> bool:
        """Whether anything changes the logits before temperature: penalties, bias or a grammar."""
        return bool(
            self.presence_penalty
            or self.frequency_penalty
            or self.repetition_penalty != 1.0
            or self.logit_bias
            or self.structured_outputs
        )


@dataclass(frozen=True)
class SpeculativeConfig:
    """Which drafter proposes and how many tokens at most (K_max for dynamic controllers).

    Each field is an `LLM(...)` keyword of the same name and, unless its metadata says cli=False, a command-line
    flag (`--num-speculative-tokens`) whose help and choices are its metadata (llm_args.py): a new setting is one
    field here and its use.
    """

    # Both flags default to None, so that a command without them gets the target's default arm (arms.py).
    method: str = setting("ngram", choices=METHODS, default=None, help="drafter (default: the target's, else ngram)")
    num_speculative_tokens: int = setting(
        5, default=None, type=int, help=f"K (0..{MAX_SPECULATIVE_TOKENS}; default: the target's, else 5)"
    )
    draft: str | None = setting(None, help="draft model for --method draft", type=str)
    draft_vocab: str | None = setting(
        None,
        type=str,
        help="the draft's drafting vocabulary: a .npy of token ids, or 'full' (default: the vocab.npy beside the "
        "draft, else the one shipped for a built-in draft, else full)",
    )
    draft_stop_below: float = setting(
        0.0,
        default=None,
        type=float,
        help="draft model: a row stops drafting after a draft whose top probability is below this (0 = draft all K; "
        "default: the target's arm, else 0)",
    )
    draft_lookup: int = setting(
        0,
        default=None,
        type=int,
        help="draft model: a row whose last N (or more) tokens occurred earlier in its prompt or output takes the "
        "tokens that followed them there instead of the draft's (prompt lookup: no draft forward; 0 = never; "
        "default: the target's arm, else 0)",
    )
    draft_window: int = setting(
        DEFAULT_DRAFT_WINDOW,
        help="draft model: past this many tokens of context it attends to the first 4 and the last N only "
        "(StreamingLLM's cache: its step and prefill stop growing with the context; 0 = the whole context)",
    )
    # Drafts need not be exact (the target verifies every one), so the draft model multiplies in the fast arithmetic
    # whatever the target's: under the exact 1.5B on the 16 dev code prompts the 0.5B's step fell from 20.4 to 11.9 ms
    # at the same τ (3.08), and its K = 4 arm went from 1.20x to 1.42x exact K = 0 (2026-11-27, 2-core AMD EPYC;
    # results/code_dev_pair_exact.json, then results/code_dev_pair_exact_fastdraft.json).
    draft_arithmetic: str = setting(
        "fast",
        choices=ARITHMETICS,
        help="draft model with quantized weights: int8 activations (fast, the default: drafts need not be exact, "
        "the target verifies each one) or fp32 activations (exact)",
    )
    # A draft step reads its linears' bytes: requantized to Q4_1 the 0.5B's step fell from 11.6 to 10.7 ms and its
    # K = 4 arm rose from 1.16x to 1.21x fast K = 0 on the dev code prompts; to Q4_0, 0.88-0.91x Q4_1's step and
    # 1.02-1.04x its arm, for 2% fewer drafts accepted (models/requantize.py).
    draft_weights: str = setting(
        "q4_0",
        choices=DRAFT_WEIGHTS,
        help="draft model from a GGUF file: its linears requantized to Q4_0 (q4_0, the default: drafts need not be "
        "exact) or Q4_1 where that reads fewer bytes, or the file's own blocks (file)",
    )
    ngram_min: int = setting(2, help="shortest suffix n-gram the n-gram drafter matches")
    ngram_max: int = setting(4, help="longest suffix n-gram, tried first")
    controller: str = setting("goodput", help="speculation length per step (K_max = K)", choices=CONTROLLER_NAMES)
    # suffix / suffix_tree (specdecode/drafters/suffix.py)
    suffix_corpus: tuple[str, ...] = setting(
        (),
        help="suffix drafters: token file (.npz, distillation format) of the target's earlier responses (repeatable)",
        action="append",
        default=None,
    )
    suffix_cache_max_tokens: int = setting(
        65_536,
        help="suffix drafters: finished outputs kept for later requests, oldest evicted (0 = no cross-request cache)",
    )
    suffix_max_depth: int = setting(24, help="longest request suffix matched")
    suffix_spec_factor: float = setting(1.0, help="draft budget per matched token (capped by K)")
    suffix_min_prob: float = setting(0.1, help="drop drafts whose empirical path probability is below this")
    suffix_request_spec_factor: float = setting(
        4.0, help="draft budget per token of a match in the request's own prompt and output (capped by K)"
    )

    def __post_init__(self) -> None:
        check_choices(self)
        k = self.num_speculative_tokens
        if not 0 <= k <= MAX_SPECULATIVE_TOKENS:
            raise ConfigError(f"num_speculative_tokens must be in 0..{MAX_SPECULATIVE_TOKENS}, got {k}")
        if not 0.0 <= self.draft_stop_below < 1.0:
            raise ConfigError(f"draft_stop_below must be in [0, 1), got {self.draft_stop_below}")
        if self.draft_lookup < 0:
            raise ConfigError(f"draft_lookup must be >= 0 (0 = off), got {self.draft_lookup}")
        if self.draft_window < 0:
            raise ConfigError(f"draft_window must be >= 0 (0 = the whole context), got {self.draft_window}")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ConfigError(f"need 1 <= ngram_min <= ngram_max, got {self.ngram_min}..{self.ngram_max}")
        self._check_suffix()

    def _check_suffix(self) -> None:
        object.__setattr__(self, "suffix_corpus", tuple(str(p) for p in self.suffix_corpus))
        for path in self.suffix_corpus:
            if not Path(path).is_file():
                raise ConfigError(f"suffix corpus {path}: no such file")
        if self.suffix_cache_max_tokens < 0:
            raise ConfigError(f"suffix_cache_max_tokens must be >= 0 (0 = off), got {self.suffix_cache_max_tokens}")
        if self.suffix_max_depth < 1:
            raise ConfigError(f"suffix_max_depth must be >= 1, got {self.suffix_max_depth}")
        for name in ("suffix_spec_factor", "suffix_request_spec_factor"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)}")
        if not 0.0 <= self.suffix_min_prob < 1.0:
            raise ConfigError(f"suffix_min_prob must be in [0, 1), got {self.suffix_min_prob}")

    @property
    def k(self) -> int:
        """Speculative tokens per step; method 'none' is plain decoding (K = 0)."""
        return 0 if self.method == "none" else self.num_speculative_tokens


# A step's target-token budget by device. On CPU a forward's time grows with its tokens from the first one, so a
# prompt chunk delays every running request's next tokens by what it costs, while a prompt's own prefill is
# compute-bound and barely slower in small chunks. On two cores (SmolLM2, 8 streams, a 6k prompt arriving;
# `specdecode bench long-prompt`, results/long_prompt_smollm2.json) 32 keeps the streams' p99 gap at 2.2x its
# value without the prompt, whose first token comes 1.18x later than alone; 128 was 12.2x and 1.09x.
# With nobody decoding, nobody waits on a chunk: prompts then prefill IDLE_PREFILL_TOKENS at a time. A GPU runs
# a few thousand tokens in about the time of one (vLLM's 2048).
DEFAULT_BATCHED_TOKENS = {"cpu": 32, "cuda": 2048, "mps": 512}
IDLE_PREFILL_TOKENS = 512
MIN_PREFILL_TOKENS = 16  # a prompt advances at least this much a step, whatever the decode tokens took


@dataclass(frozen=True)
class EngineConfig:
    """Capacity of the engine: concurrent sequences, the longest context a sequence may reach, and the target
    tokens one step may run (vLLM's max_num_batched_tokens: the running requests' decode and verify tokens
    first, prompt chunks from what is left; None = the device's default, DEFAULT_BATCHED_TOKENS). Fields are
    `LLM(...)` keywords and command-line flags, as SpeculativeConfig's."""

    max_num_seqs: int = setting(8)
    max_model_len: int | None = setting(None, type=int)
    device: str = setting("cpu")
    dtype: str = setting("float32", choices=DTYPES)
    max_num_batched_tokens: int | None = setting(
        None,
        type=int,
        help="target tokens per engine step: decode and verify first, prompt chunks from the rest "
        f"(default by device: {', '.join(f'{d} {n}' for d, n in DEFAULT_BATCHED_TOKENS.items())})",
    )
    # vLLM's name: run the target eagerly instead of its compiled step. LLM(enforce_eager=None) reads
    # $SPECDECODE_ENFORCE_EAGER.
    enforce_eager: bool = setting(
        False,
        help="run the target eagerly: no torch.compile warm-up (default: compiled, cached on disk after the first run)",
        action="store_true",
        default=None,
    )
    # A step's prompt chunks ride in its decode and verify forward (engine.py `_verify`), cut into rows of the step's
    # width on the prompt's own cache slot, instead of a forward of their own that reads every weight again.
    fused_prefill: bool = setting(
        True,
        help="run prompt chunks in the same target forward as the running requests' decode and verify tokens "
        "(default; --no-fused-prefill: a forward of their own, as before)",
        action=argparse.BooleanOptionalAction,
        default=None,
    )
    tensor_parallel_size: int = setting(  # ranks the target is sharded over (specdecode/engine/launch.py)
        1, help="shard the target over N processes (gloo on CPU, NCCL on CUDA; under torchrun N = WORLD_SIZE)"
    )
    # A GGUF model on the CPU in float32: "quantized" keeps its blocks (models/gguf_quantized.py), "fp32" loads the
    # dequantized fp32 conversion (the reference path). Elsewhere the weights are fp32 whatever this says.
    # None (the default) reads $SPECDECODE_WEIGHTS, else "quantized": here, once; the loaders get the value.
    weights: str = setting(
        None,
        choices=WEIGHTS,
        help="a GGUF model on the CPU in float32: keep its quantized blocks (default, or $SPECDECODE_WEIGHTS) "
        "or load the dequantized fp32 weights (the reference path)",
    )

    # How a quantized model (weights="quantized") multiplies: "exact" with fp32 activations (the reference), "fast"
    # with int8 activations per row and block (models/quant_int8.py; lossless with respect to that arithmetic).
    # None (the default) reads $SPECDECODE_ARITHMETIC, else "exact", as weights does.
    arithmetic: str = setting(
        None,
        choices=ARITHMETICS,
        help="quantized weights: multiply with fp32 activations (exact, default, or $SPECDECODE_ARITHMETIC) or "
        "int8 activations per row and block (fast; speculation stays exact with respect to it)",
    )

    # The KV cache's dtype (models/kv_dtype.py): "auto" is bf16 under the fast arithmetic where its kernel serves
    # (half the bytes a long context's step reads), else fp32.
    kv_cache_dtype: str = setting(
        "auto",
        choices=KV_CACHE_DTYPES,
        help="KV cache dtype: auto (bf16 under the fast arithmetic on an AVX-512 CPU, else fp32), fp32, or bf16 "
        "(applies to the draft model's cache too)",
    )

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ConfigError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        self._from_environment()
        check_choices(self)
        if self.max_num_batched_tokens is None:
            device = self.device.split(":")[0]
            object.__setattr__(self, "max_num_batched_tokens", DEFAULT_BATCHED_TOKENS.get(device, 2048))
        if self.max_num_batched_tokens < MIN_PREFILL_TOKENS:
            raise ConfigError(
                f"max_num_batched_tokens must be >= {MIN_PREFILL_TOKENS}, got {self.max_num_batched_tokens}"
            )
        if self.tensor_parallel_size < 1:
            raise ConfigError(f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")

    def _from_environment(self) -> None:
        """weights and arithmetic: the value given, else their variable's, else their first choice; a bad one is
        refused naming where it came from."""
        for name, env, choices in (("weights", WEIGHTS_ENV, WEIGHTS), ("arithmetic", ARITHMETIC_ENV, ARITHMETICS)):
            given = getattr(self, name)
            value = from_environment(given, env, choices)
            if value not in choices:
                source = name if given is not None else env
                raise ConfigError(f"{source}={value!r}: expected {' or '.join(map(repr, choices))}")
            object.__setattr__(self, name, value)


def from_environment(given: str | None, env: str, choices: tuple[str, ...]) -> str:
    """A setting's value: the one given, else its environment variable's, else its first choice (unchecked)."""
    return given if given is not None else os.environ.get(env, choices[0])


def llm_settings(config) -> dict:
    """The fields of `config` that are LLM keywords (SpeculativeConfig's and EngineConfig's names), by name."""
    names = {f.name for c in (SpeculativeConfig, EngineConfig) for f in fields(c)}
    return {f.name: getattr(config, f.name) for f in fields(config) if f.name in names}
