"""The LLM's command-line arguments, shared by every command that builds one (generate, bench, serve, calibrate):
model and speculation flags, sampling flags, and the LLM (or its keyword arguments) they describe."""

from __future__ import annotations

import argparse

from specdecode.config import (
    CONTROLLER_NAMES,
    DEFAULT_BATCHED_TOKENS,
    MAX_SPECULATIVE_TOKENS,
    METHODS,
    SamplingParams,
    SpeculativeConfig,
)


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default="smollm2-135m-instruct", help="HF directory, .gguf file or built-in name")
    p.add_argument("--draft", default=None, help="draft model for --method draft")
    p.add_argument("--method", default="ngram", choices=METHODS)
    p.add_argument("--num-speculative-tokens", type=int, default=5, help=f"K (0..{MAX_SPECULATIVE_TOKENS})")
    p.add_argument(
        "--controller", default="goodput", choices=CONTROLLER_NAMES, help="speculation length per step (K_max = K)"
    )
    p.add_argument("--ngram-min", type=int, default=2, help="shortest suffix n-gram the n-gram drafter matches")
    p.add_argument("--ngram-max", type=int, default=4, help="longest suffix n-gram, tried first")
    suffix = SpeculativeConfig()
    p.add_argument(
        "--suffix-corpus",
        action="append",
        default=None,
        help="suffix drafters: token file (.npz, distillation format) of the target's earlier responses (repeatable)",
    )
    p.add_argument(
        "--suffix-cache-max-tokens",
        type=int,
        default=suffix.suffix_cache_max_tokens,
        help="suffix drafters: finished outputs kept for later requests, oldest evicted (0 = no cross-request cache)",
    )
    p.add_argument(
        "--suffix-max-depth", type=int, default=suffix.suffix_max_depth, help="longest request suffix matched"
    )
    p.add_argument(
        "--suffix-spec-factor",
        type=float,
        default=suffix.suffix_spec_factor,
        help="draft budget per matched token (capped by K)",
    )
    p.add_argument(
        "--suffix-request-spec-factor",
        type=float,
        default=suffix.suffix_request_spec_factor,
        help="draft budget per token of a match in the request's own prompt and output (capped by K)",
    )
    p.add_argument(
        "--suffix-min-prob",
        type=float,
        default=suffix.suffix_min_prob,
        help="drop drafts whose empirical path probability is below this",
    )
    p.add_argument("--max-num-seqs", type=int, default=8)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=None,
        help="target tokens per engine step: decode and verify first, prompt chunks from the rest "
        f"(default by device: {', '.join(f'{d} {n}' for d, n in DEFAULT_BATCHED_TOKENS.items())})",
    )
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument(
        "--enforce-eager",
        action="store_true",
        default=None,
        help="run the target eagerly: no torch.compile warm-up (default: compiled, cached on disk after the first run)",
    )
    p.add_argument(
        "--tensor-parallel-size",
        type=int,
        default=1,
        help="shard the target over N processes (gloo on CPU, NCCL on CUDA; under torchrun N = WORLD_SIZE)",
    )


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


def suffix_args(a: argparse.Namespace) -> dict:
    """The suffix drafters' options, as keyword arguments of LLM and SpeculativeConfig."""
    return dict(
        suffix_corpus=tuple(a.suffix_corpus or ()),
        suffix_cache_max_tokens=a.suffix_cache_max_tokens,
        suffix_max_depth=a.suffix_max_depth,
        suffix_spec_factor=a.suffix_spec_factor,
        suffix_min_prob=a.suffix_min_prob,
        suffix_request_spec_factor=a.suffix_request_spec_factor,
    )


def llm_kwargs(a: argparse.Namespace, **overrides) -> dict:
    """The LLM keyword arguments the model flags describe; `overrides` replace any of them."""
    kwargs = dict(
        target=a.target,
        draft=a.draft,
        method=a.method,
        num_speculative_tokens=a.num_speculative_tokens,
        controller=a.controller,
        ngram_min=a.ngram_min,
        ngram_max=a.ngram_max,
        max_num_seqs=a.max_num_seqs,
        max_model_len=a.max_model_len,
        max_num_batched_tokens=a.max_num_batched_tokens,
        device=a.device,
        enforce_eager=a.enforce_eager,
        dtype=a.dtype,
        tensor_parallel_size=a.tensor_parallel_size,
        **suffix_args(a),
    )
    return {**kwargs, **overrides}


def llm_from_args(a: argparse.Namespace, **overrides):
    """The LLM the model flags describe; `overrides` replace any of its keyword arguments."""
    from specdecode.llm import LLM  # heavy imports only once the arguments are known to be valid

    return LLM(**llm_kwargs(a, **overrides))
