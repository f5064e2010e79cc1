"""The sweep's plain types: an arm, the sweep's settings and what one arm did at one level. Apart from
bench/sweep.py so that its peers and its report read them without importing the sweep back."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from specdecode.config import ConfigError
from specdecode.control import CONTROLLERS


@dataclass(frozen=True)
class ArmSpec:
    """One engine configuration of the sweep: a controller by name and its K (K_max for dynamic ones)."""

    name: str
    controller: str
    k: int

    @property
    def is_fixed(self) -> bool:
        return self.controller == "fixed" or self.k == 0

    @classmethod
    def parse(cls, text: str, k_max: int) -> ArmSpec:
        """'none' (K = 0), 'fixed:3', 'goodput' (K = k_max) or 'goodput:8'."""
        name, _, k_text = text.partition(":")
        if name == "none":
            return cls("none", "fixed", 0)
        if name not in CONTROLLERS:
            raise ConfigError(f"unknown controller {name!r} in arm {text!r}; expected none or {', '.join(CONTROLLERS)}")
        try:
            k = int(k_text) if k_text else k_max
        except ValueError:
            raise ConfigError(f"arm {text!r}: K must be an integer") from None
        if k < 0:
            raise ConfigError(f"arm {text!r}: K must be >= 0")
        return cls(f"{name}:{k}" if k_text or name == "fixed" else name, name, k)


def parse_arms(names: list[str] | None, k_max: int, defaults: tuple[str, ...]) -> list[ArmSpec]:
    """Explicit names must all exist; from the defaults, controllers not (yet) registered are left out."""
    if names is None:
        names = [n for n in defaults if n.partition(":")[0] in ("none", *CONTROLLERS)]
    arms = [ArmSpec.parse(n, k_max) for n in names]
    if not arms:
        raise ConfigError("no arms to run")
    if len({a.name for a in arms}) != len(arms):
        raise ConfigError(f"duplicate arms in {','.join(names)}")
    return arms


@dataclass(frozen=True)
class SweepConfig:
    concurrency: list[int]
    max_tokens: int = 64
    requests_per_level: int | None = None  # None: max(4, 2C)
    warmup: int = 1
    min_requests: int = 1  # per arm and level: rounds of requests_per_level until at least this many
    stagger: bool = True  # the first C requests of a round ask for 1/C, 2/C, ... C/C of max_tokens

    def __post_init__(self) -> None:
        if not self.concurrency or min(self.concurrency) < 1:
            raise ConfigError(f"concurrency levels must be >= 1, got {self.concurrency}")
        if self.max_tokens < 1:
            raise ConfigError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.requests_per_level is not None and self.requests_per_level < 1:
            raise ConfigError(f"requests_per_level must be >= 1, got {self.requests_per_level}")
        if self.min_requests < 1:
            raise ConfigError(f"min_requests must be >= 1, got {self.min_requests}")

    def num_requests(self, c: int) -> int:
        """Requests per round at level c."""
        return self.requests_per_level or max(4, 2 * c)

    def rounds(self, c: int) -> int:
        return -(-self.min_requests // self.num_requests(c))

    def total_requests(self, c: int) -> int:
        """Requests per arm at level c, over all its rounds."""
        return self.num_requests(c) * self.rounds(c)


@dataclass
class LevelRun:
    """What one arm did at one concurrency level."""

    seconds: float
    tokens: int
    requests: int
    tpot_s: list[float]  # per request: (finish - first token) / (tokens - 1), vLLM's TPOT
    step_s: list[float]  # wall time of every engine step, prefill-only steps included
    k_max: list[int] = field(default_factory=list)  # per decode step: the largest K proposed to any row
    k_mean: list[float] = field(default_factory=list)  # per decode step: mean K proposed over rows
    k_chosen: list[float] = field(default_factory=list)  # per decode step: mean K the controller asked for
    rows: list[int] = field(default_factory=list)  # per decode step: sequences decoded (the load really seen)
    drafted: int = 0
    accepted: int = 0
    forwards: int = 0
    trees: bool = False  # drafted tokens are tree nodes: the acceptance is per node
    steady_tokens: int = 0  # tokens emitted by steady steps: after the first finish, with all C in flight
    steady_seconds: float = 0.0  # wall time of those steps
    prompt_tokens: int = 0  # prompt tokens of the requests run (levels differ in prompts: see interleave)
    round_tps: list[float] = field(default_factory=list)  # per round, in order: its tokens/s (as `summary`'s)

    def merge(self, other: LevelRun) -> LevelRun:
        """Two rounds of one arm at one level as one run: counts add, traces join."""
        for name in (
            "seconds",
            "tokens",
            "requests",
            "drafted",
            "accepted",
            "forwards",
            "steady_tokens",
            "steady_seconds",
            "prompt_tokens",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in ("tpot_s", "step_s", "k_max", "k_mean", "k_chosen", "rows", "round_tps"):
            getattr(self, name).extend(getattr(other, name))
        self.trees |= other.trees
        return self

    def tokens_per_s(self) -> float:
        """Steady state: the load the level names. The start-up burst and the drain at the end (fewer than C left)
        are excluded; the drain is in `summary`'s tokens_per_s_all. Continuous traffic has neither, and a drain
        favours plain decoding, whose requests all finish on the same step. Without a steady stretch, all of it."""
        if self.steady_seconds:
            return self.steady_tokens / self.steady_seconds
        return self.tokens / self.seconds if self.seconds else 0.0  # peers run one request at a time: all steady

    def summary(self) -> dict[str, float]:
        tpot = np.array(self.tpot_s) if self.tpot_s else np.array([float("nan")])
        all_tps = self.tokens / self.seconds if self.seconds else 0.0
        return {
            "requests": self.requests,
            "tokens": self.tokens,
            "seconds": self.seconds,
            "tokens_per_s": self.tokens_per_s(),
            "tokens_per_s_all": all_tps,
            "tpot_p50_ms": float(np.percentile(tpot, 50)) * 1e3,
            "tpot_p99_ms": float(np.percentile(tpot, 99)) * 1e3,
            "step_mean_ms": float(np.mean(self.step_s)) * 1e3 if self.step_s else float("nan"),
            "node_acceptance_rate" if self.trees else "acceptance_rate": (
                self.accepted / self.drafted if self.drafted else 0.0
            ),
            # Each target forward yields its accepted drafts plus one recovered or bonus token.
            "mean_accepted_tokens": (self.accepted + self.forwards) / self.forwards if self.forwards else float("nan"),
            "mean_k": float(np.mean(self.k_mean)) if self.k_mean else 0.0,
            "max_k": max(self.k_max, default=0),
            "mean_k_chosen": float(np.mean(self.k_chosen)) if self.k_chosen else 0.0,
            "mean_rows": float(np.mean(self.rows)) if self.rows else 0.0,
            "mean_prompt_tokens": self.prompt_tokens / self.requests if self.requests else 0.0,
        }
