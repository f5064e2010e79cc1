"""The LLM's command-line arguments, shared by every command that builds one (generate, bench, serve, calibrate):
model and speculation flags, sampling flags, and the LLM (or its keyword arguments) they describe."""

from __future__ import annotations

import argparse
from dataclasses import fields

from specdecode.arms import with_default_arm
from specdecode.config import EngineConfig, SamplingParams, SpeculativeConfig, add_flags, cli_fields, split_settings


def add_model_args(p: argparse.ArgumentParser) -> None:
    """--target, then one flag per speculation and engine setting, from the config fields' metadata."""
    add_target_arg(p)
    add_flags(p, SpeculativeConfig, EngineConfig)


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """--target and the engine's settings alone: how the target is loaded and stepped (a command that runs no
    speculation: calibrate)."""
    add_target_arg(p)
    add_flags(p, EngineConfig)


def add_target_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default="smollm2-135m-instruct", help="HF directory, .gguf file or built-in name")


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    p.add_argument(
        "--chat",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="apply the chat template (default: on when the model has one)",
    )


def sampling_from_args(a: argparse.Namespace) -> SamplingParams:
    return SamplingParams(a.temperature, a.top_p, a.top_k, a.max_tokens, a.seed, a.stop)


def fill_default_arm(a: argparse.Namespace) -> None:
    """Set --method, --num-speculative-tokens, --draft-stop-below and --draft-lookup, where not given, to the
    target's default arm (arms.py), else to the config's defaults: every command then reads concrete values."""
    given = {"method": a.method, "num_speculative_tokens": a.num_speculative_tokens}
    for name in ("draft_stop_below", "draft_lookup"):
        given[name] = getattr(a, name, None)
    chosen = {k: v for k, v in given.items() if v is not None}
    filled = with_default_arm(a.target, {**chosen, "arithmetic": getattr(a, "arithmetic", None)})
    defaults = {f.name: f.default for f in fields(SpeculativeConfig) if f.name in given}
    for name in given:
        setattr(a, name, filled.get(name, defaults[name]))


def llm_kwargs(a: argparse.Namespace, **overrides) -> dict:
    """The LLM keyword arguments the model flags describe, by field name; `overrides` replace any of them. A flag
    left at None where its field has a value (a repeatable flag not given) keeps the field's default, as does one the
    command has no flag for (`add_engine_args`)."""
    kwargs = {"target": a.target}
    for f in cli_fields(SpeculativeConfig, EngineConfig):
        value = getattr(a, f.name, None)
        if value is not None or f.default is None or f.name == "enforce_eager":  # enforce_eager None: the env var
            kwargs[f.name] = tuple(value) if isinstance(value, list) else value
    return {**kwargs, **overrides}


def configs_from_args(a: argparse.Namespace) -> tuple[SpeculativeConfig, EngineConfig]:
    """The speculation and engine settings the flags describe, checked (and the environment's defaults read)
    before any model loads."""
    kwargs = llm_kwargs(a)
    del kwargs["target"]
    spec, engine = split_settings(kwargs, SpeculativeConfig, EngineConfig)
    return SpeculativeConfig(**spec), EngineConfig(**engine)


def llm_from_args(a: argparse.Namespace, **overrides):
    """The LLM the model flags describe; `overrides` replace any of its keyword arguments."""
    from specdecode.llm import LLM  # heavy imports only once the arguments are known to be valid

    return LLM(**llm_kwargs(a, **overrides))
