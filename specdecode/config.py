"""Typed, frozen configuration. Every check runs on creation so bad input fails before any work starts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

MAX_SPECULATIVE_TOKENS = 64
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


class ConfigError(ValueError):
    """A user-facing configuration error; its message is shown as one line."""


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling, as in vLLM. temperature 0 is greedy; top_k 0 and top_p 1 disable those filters."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 128
    seed: int | None = None
    stop: list[str] | None = None
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if not self.temperature >= 0.0:
            raise ConfigError(f"temperature must be >= 0, got {self.temperature}")
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

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class SpeculativeConfig:
    """Which drafter proposes and how many tokens at most (K_max for dynamic controllers)."""

    method: str = "ngram"
    num_speculative_tokens: int = 5
    draft: str | None = None
    ngram_min: int = 2
    ngram_max: int = 4
    controller: str = "goodput"
    # suffix / suffix_tree (specdecode/drafters/suffix.py)
    suffix_corpus: tuple[str, ...] = ()  # token files of the target's earlier responses (distillation format)
    suffix_cache_max_tokens: int = 65_536  # finished outputs kept for later requests; 0 = no cross-request cache
    suffix_max_depth: int = 24  # longest suffix of the request matched
    suffix_spec_factor: float = 1.0  # draft budget per matched token (then capped by K)
    suffix_min_prob: float = 0.1  # drafts whose empirical path probability falls below this are not proposed

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ConfigError(f"unknown method {self.method!r}; expected one of {', '.join(METHODS)}")
        k = self.num_speculative_tokens
        if not 0 <= k <= MAX_SPECULATIVE_TOKENS:
            raise ConfigError(f"num_speculative_tokens must be in 0..{MAX_SPECULATIVE_TOKENS}, got {k}")
        if self.controller not in CONTROLLER_NAMES:
            raise ConfigError(f"unknown controller {self.controller!r}; expected one of {', '.join(CONTROLLER_NAMES)}")
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
        if not self.suffix_spec_factor > 0:
            raise ConfigError(f"suffix_spec_factor must be > 0, got {self.suffix_spec_factor}")
        if not 0.0 <= self.suffix_min_prob < 1.0:
            raise ConfigError(f"suffix_min_prob must be in [0, 1), got {self.suffix_min_prob}")

    @property
    def k(self) -> int:
        """Speculative tokens per step; method 'none' is plain decoding (K = 0)."""
        return 0 if self.method == "none" else self.num_speculative_tokens


@dataclass(frozen=True)
class EngineConfig:
    """Capacity of the engine: concurrent sequences and the longest context a sequence may reach."""

    max_num_seqs: int = 8
    max_model_len: int | None = None
    device: str = "cpu"
    dtype: str = "float32"
    prefill_chunk: int = 512
    enforce_eager: bool = False  # vLLM's name: run the target eagerly instead of its compiled step
    tensor_parallel_size: int = 1  # ranks the target is sharded over (specdecode/engine/launch.py)

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ConfigError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ConfigError(f"dtype must be float32, bfloat16 or float16, got {self.dtype!r}")
        if self.prefill_chunk < 16:
            raise ConfigError(f"prefill_chunk must be >= 16, got {self.prefill_chunk}")
        if self.tensor_parallel_size < 1:
            raise ConfigError(f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
