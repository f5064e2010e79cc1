"""Command-line arguments of `specdecode bench [MODE]` and the dispatch to the mode's module.

A mode is one entry in `BENCH_MODES` plus, if it needs flags of its own, one argument group. Flags shared by
all modes whose sensible default differs by mode (`--max-tokens`, `--output`) default to None here and take
the mode's value in `run_bench`.
"""

from __future__ import annotations

import argparse
import importlib
from dataclasses import dataclass, field


@dataclass(frozen=True)
class BenchMode:
    module: str  # imported only when the mode runs: it pulls in torch and the models
    help: str
    defaults: dict[str, object] = field(default_factory=dict)
    needs_prompts: bool = True


BENCH_MODES = {
    "specbench": BenchMode(
        "specdecode.bench.specbench",
        "Spec-Bench at batch 1: per-category tok/s against K = 0 and peers",
        {"max_tokens": 128, "output": "results/bench.json"},
    ),
    "sweep": BenchMode(
        "specdecode.bench.sweep",
        "closed-loop concurrency sweep of fixed and dynamic speculation lengths",
        {"max_tokens": 64, "output": "results/sweep.json"},
    ),
    "cost": BenchMode(
        "specdecode.bench.cost",
        "the target's step-cost curve: ms per forward by batch x new tokens, against a --baseline checkout",
        {"output": "results/cost.json", "contexts": [256, 1024], "batches": [1, 4, 8, 16, 32], "repeats": 5},
        needs_prompts=False,
    ),
    "startup": BenchMode(
        "specdecode.bench.startup",
        "seconds from process start to the first answer: eager, the compiled step's first run, later runs",
        {"max_tokens": 32, "output": "results/startup.json", "repeats": 5},
        needs_prompts=False,
    ),
    "long-prompt": BenchMode(
        "specdecode.bench.long_prompt",
        "a long prompt arriving while short streams decode: their p99 TPOT and its TTFT per token budget",
        {"max_tokens": 256, "output": "results/long_prompt.json"},
        needs_prompts=False,
    ),
    "long-context": BenchMode(
        "specdecode.bench.long_context",
        "decode tok/s and the K chosen by goodput against fixed K (K = 0 included) as the context grows",
        {
            "max_tokens": 64,
            "output": "results/long_context.json",
            "contexts": [256, 2048, 8192, 16384],
            "batches": [1, 8],
            "repeats": 2,
        },
        needs_prompts=False,
    ),
    "serve": BenchMode(
        "specdecode.bench.serve",
        "open-loop Poisson arrivals against live servers: TTFT, TPOT, throughput per request rate",
        {"max_tokens": 64, "output": "results/serve.json"},
    ),
}

DEFAULT_CONCURRENCY = (1, 2, 4, 8, 16, 32)
WEIGHTED_METHODS = ("draft", "eagle", "medusa", "mtp")  # drafters with weights of their own: METHOD@DIR arms
DEFAULT_ARMS = ("none", "fixed:1", "fixed:2", "fixed:3", "fixed:5", "fixed:8", "heuristic", "confidence", "goodput")
LONG_CONTEXT_ARMS = ("none", "fixed:1", "fixed:2", "fixed:3", "fixed:5", "goodput")


def positive_int_list(text: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4]; argparse turns the ValueError into a usage error."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return sorted(set(values))


def name_list(text: str) -> list[str]:
    return [v.strip() for v in text.split(",") if v.strip()]


def add_bench_args(p: argparse.ArgumentParser) -> None:
    modes = ", ".join(f"{name}: {m.help}" for name, m in BENCH_MODES.items())
    p.add_argument("mode", nargs="?", default="specbench", choices=BENCH_MODES, help=modes)
    p.add_argument(
        "--prompts",
        default=None,
        help="Spec-Bench question.jsonl (or any jsonl with 'prompt'); specbench: 'code' for the packaged code set",
    )
    p.add_argument("--max-tokens", type=int, default=None, help="per request (specbench 128, sweep 64)")
    p.add_argument(
        "--peers",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time transformers generate() and its speculative modes (at batch 1)",
    )
    p.add_argument("--warmup", type=int, default=1, help="untimed requests per arm first")
    p.add_argument("--chat", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--output", default=None, help="results JSON; the Markdown and plots go next to it")
    add_specbench_args(p.add_argument_group("specbench"))
    add_sweep_args(p.add_argument_group("sweep"))
    add_serve_bench_args(p.add_argument_group("serve"))
    add_cost_args(p.add_argument_group("cost"))
    add_long_prompt_args(p.add_argument_group("long-prompt"))


@dataclass(frozen=True)
class MethodArm:
    """One engine arm of `--methods`: a drafter, its K and controller, and for `draft` the draft model."""

    method: str
    k: int
    controller: str
    draft: str | None = None  # `draft@SPEC`: this arm's draft (a directory or built-in name); else --draft
    stop_below: float = 0.0  # draft model arms: --draft-stop-below for this arm (0: the command's)
    lookup: int = 0  # draft model arms: --draft-lookup for this arm


def _stop_below(text: str) -> float | None:
    """A draft arm's fourth field, a probability in [0, 1); None when it is not one."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if 0.0 <= value < 1.0 else None


def method_arms(text: str) -> list[MethodArm]:
    """'ngram:8:goodput,eagle:12,draft@drafts/1l:2,eagle@heads/e:8,draft:6:fixed:0.8' -> MethodArms; K defaults to
    5, the controller to fixed. METHOD@DIR gives a draft model or head drafter (draft, eagle, medusa, mtp) its own
    weights; a draft arm's fourth field is its --draft-stop-below, its fifth its --draft-lookup."""
    from specdecode.config import CONTROLLER_NAMES, METHODS

    arms = []
    for item in name_list(text):
        head, at, rest = item.partition("@")
        if at:  # method@SPEC[:K[:controller]]
            method, (draft, *tail) = head, rest.split(":")
        else:
            (method, *tail), draft = item.split(":"), None
        k, controller = tail[0] if tail else "5", tail[1] if len(tail) > 1 else "fixed"
        draft_fields = len(tail) in (3, 4) and method == "draft"
        stop = _stop_below(tail[2]) if draft_fields else (0.0 if len(tail) <= 2 else None)
        lookup = tail[3] if len(tail) == 4 else "0"
        bad_draft = at and (method not in WEIGHTED_METHODS or not draft)
        bad = not k.isdigit() or not lookup.isdigit() or stop is None or bad_draft
        if method not in METHODS or controller not in CONTROLLER_NAMES or bad:
            raise argparse.ArgumentTypeError(
                f"bad method arm {item!r}: expected method[:K[:controller]] with method in {', '.join(METHODS)}, "
                f"or METHOD@DIR[:K[:controller]] with METHOD in {', '.join(WEIGHTED_METHODS)}; a draft arm may add "
                "a fourth field, its --draft-stop-below in [0, 1), and a fifth, its --draft-lookup"
            )
        arms.append(MethodArm(method, int(k), controller, draft, stop, int(lookup)))
    return arms


def add_specbench_args(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--per-category", type=int, default=3, help="prompts per category (0 = all)")
    g.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="turns of the arms per prompt, their order reversed every other turn (every run counts)",
    )
    g.add_argument(
        "--categories",
        type=lambda s: [c for c in s.split(",") if c],
        default=None,
        help="only these categories, comma-separated (default: every one the prompts file has)",
    )
    g.add_argument(
        "--methods",
        type=method_arms,
        default=None,
        help="compare several drafters in one run: method[:K[:controller]],... (overrides --method); "
        "draft@DIR[:K[:controller]] gives a draft arm its own draft model, eagle@DIR (medusa, mtp) its own heads",
    )
    g.add_argument("--json", action="store_true", help="write results JSON (and a Markdown table)")
    g.add_argument(
        "--llama-cpp",
        action="store_true",
        help="add llama.cpp arms on the target's GGUF (plain, and prompt lookup at each n-gram arm's K); "
        "needs the peers extra (make peers)",
    )
    g.add_argument(
        "--llama-cpp-native",
        action="store_true",
        help="add native llama.cpp arms on the target's GGUF, its own tools (llama-completion, llama-lookup, "
        "llama-speculative-simple with the draft's GGUF; cost: llama-bench at batch 1); needs them built (make peers)",
    )
    g.add_argument(
        "--split",
        choices=("dev", "eval", "all"),
        default="eval",
        help="with --prompts code: the dev part (tuning, choosing defaults) or the eval part (reported figures)",
    )
    g.add_argument(
        "--eager-baseline",
        action="store_true",
        help="add an arm of our K = 0 with --enforce-eager (the step before compilation), timed in the same run",
    )


def add_sweep_args(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--concurrency",
        type=positive_int_list,
        default=list(DEFAULT_CONCURRENCY),
        help="requests in flight per level (default 1,2,4,8,16,32)",
    )
    g.add_argument(
        "--arms",
        type=name_list,
        default=None,
        help="controller[:K] list; K defaults to --num-speculative-tokens, 'none' is K = 0 "
        f"(sweep default {','.join(DEFAULT_ARMS)}, less controllers not registered; "
        f"long-context default {','.join(LONG_CONTEXT_ARMS)})",
    )
    g.add_argument(
        "--requests-per-level", type=int, default=None, help="requests per round of a level (default max(4, 2C))"
    )
    g.add_argument(
        "--min-requests",
        type=int,
        default=16,
        help="requests per arm and level at least: levels with fewer per round run more rounds, arms taking turns",
    )
    g.add_argument(
        "--no-stagger",
        dest="stagger",
        action="store_false",
        help="start a round's first C requests alike (default: they ask for 1/C, 2/C, ... of --max-tokens, so "
        "finishes and prefills come a few at a time, as under continuous traffic)",
    )


def positive_float_list(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"expected positive numbers, got {text!r}")
    return sorted(set(values))


def add_serve_bench_args(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--rates", type=positive_float_list, default=[0.25, 0.5, 1.0, 2.0], help="requests per second (Poisson)"
    )
    g.add_argument("--requests-per-rate", type=int, default=16, help="requests sent at each rate")
    g.add_argument(
        "--replicas",
        type=positive_int_list,
        default=None,
        help="serve each arm with N replicas on Ray Serve, for each N (e.g. 1,2; default arm goodput; "
        "writes results/serve_replicas.json unless --output)",
    )


def add_cost_args(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--batches", type=positive_int_list, default=None, help="rows per forward (cost 1,4,8,16,32; long-context 1,8)"
    )
    g.add_argument("--new-tokens", type=positive_int_list, default=[1, 2, 3, 5, 9, 17], help="new tokens per row")
    g.add_argument(
        "--contexts",
        type=positive_int_list,
        default=None,
        help="cached tokens per row (cost 256,1024); long-context: prompt tokens (256,2048,8192,16384)",
    )
    g.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="cost: timed forwards per cell (median, default 5); startup: runs on a warm package cache (5); "
        "long-context: decodes per arm and cell, arms in turn (2)",
    )
    g.add_argument(
        "--texts",
        type=int,
        default=1,
        help="long-context: texts a cell decodes, each its own prefilled batch, cut further along the prompts' "
        "text; an arm's tok/s is over all of them (1)",
    )
    g.add_argument("--baseline", default=None, help="another checkout (e.g. a worktree of the previous commit)")
    g.add_argument(
        "--baseline-step",
        choices=("eager", "compiled"),
        default="eager",
        help="which step of the --baseline checkout to time (compiled: its AOTInductor packages)",
    )
    g.add_argument("--jit", action="store_true", help="add the compiled step under torch.compile as an arm")
    g.add_argument(
        "--warm-only",
        action="store_true",
        help="startup: a user's second start of --target (and --draft) in their own cache, with its memory",
    )


def run_bench(a: argparse.Namespace) -> None:
    from specdecode.config import ConfigError

    mode = BENCH_MODES[a.mode]
    if mode.needs_prompts and not a.prompts:
        raise ConfigError(f"bench {a.mode} needs --prompts (e.g. ../shared/data/specbench_question.jsonl)")
    if a.mode == "serve" and a.replicas and a.output is None:
        a.output = "results/serve_replicas.json"  # never over the committed single-server results
    for key, value in mode.defaults.items():
        if getattr(a, key) is None:
            setattr(a, key, value)
    importlib.import_module(mode.module).run_from_args(a)


def add_long_prompt_args(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--budgets", type=positive_int_list, default=[64, 128, 512], help="max_num_batched_tokens")
    g.add_argument("--long-tokens", type=int, default=6000, help="the long prompt's tokens (16000 on Qwen2.5-Coder)")
    g.add_argument("--streams", type=int, default=8, help="short streaming requests decoding beside it")
    g.add_argument("--warm-steps", type=int, default=30, help="steps timed before the long prompt arrives")
