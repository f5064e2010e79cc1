"""The offline Python API, shaped like vLLM's: `LLM(...).generate(prompts, SamplingParams(...))`."""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass
from itertools import count
from pathlib import Path

import torch
from tqdm import tqdm

from specdecode.arms import with_default_arm
from specdecode.config import (
    IDLE_PREFILL_TOKENS,
    ConfigError,
    EngineConfig,
    SamplingParams,
    SpeculativeConfig,
    split_settings,
)
from specdecode.control import Controller, make_controller
from specdecode.control.goodput import GoodputController
from specdecode.control.pair_probe import PairPrice, probe_pair
from specdecode.drafters import DrafterContext, make_drafter
from specdecode.drafters.draft_model import drafting_vocabulary, load_draft
from specdecode.engine.engine import Engine
from specdecode.engine.launch import TensorParallelRuntime, check_tensor_parallel
from specdecode.models.compiled import ENFORCE_EAGER_ENV, load_target
from specdecode.models.gguf_quantized import quantized_source
from specdecode.models.llama import LlamaConfig, LlamaModel
from specdecode.models.loader import resolve_model_dir
from specdecode.models.packed_linear import warm_row_buckets
from specdecode.models.shipped_draft import DEFAULT_DRAFTS
from specdecode.models.tokenizer_files import load_tokenizer, vocabulary
from specdecode.step.sequence import Sequence, TokenLogprob

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEFAULT_MAX_MODEL_LEN = 2048


@dataclass
class CompletionOutput:
    """One sample of a request (vLLM's name); logprobs per token when SamplingParams.logprobs was set."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None
    logprobs: list[TokenLogprob] | None
    metrics: dict[str, float | int]
    error: str | None = None  # why this sample failed alone (finish_reason "error"); the others were served

    @classmethod
    def from_seq(cls, seq: Sequence) -> CompletionOutput:
        return cls(
            seq.index, seq.text, seq.output_ids, seq.finish_reason, seq.logprobs, seq.metrics.as_dict(), seq.error
        )


@dataclass
class RequestOutput:
    """A request's result: its samples in `outputs`; text, token_ids, ... are sample 0's, for the common n = 1."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    finish_reason: str | None
    metrics: dict[str, float | int]
    outputs: list[CompletionOutput]
    logprobs: list[TokenLogprob] | None = None
    error: str | None = None  # the first failed sample's error: this request failed alone

    @classmethod
    def from_samples(cls, seqs: list[Sequence], prompt: str | None) -> RequestOutput:
        outs = [CompletionOutput.from_seq(s) for s in seqs]
        first = outs[0]
        return cls(
            seqs[0].group,
            prompt,
            seqs[0].prompt_ids,
            first.text,
            first.token_ids,
            first.finish_reason,
            first.metrics,
            outs,
            first.logprobs,
            next((o.error for o in outs if o.error is not None), None),
        )


def _check_same_vocab(target_dir: Path, target_tok, draft_dir: Path) -> None:
    """A draft must share the target's vocabulary: checked from the two directories' config and tokenizer files,
    before either model's weights load (a wrong draft for the 1.5B had taken 76 s of loading to be refused)."""
    draft_vocab, target_vocab = LlamaConfig.from_dir(draft_dir).vocab_size, LlamaConfig.from_dir(target_dir).vocab_size
    if draft_vocab != target_vocab:
        raise ConfigError(f"draft vocabulary ({draft_vocab} tokens) differs from the target's ({target_vocab})")
    if (draft_dir / "tokenizer_config.json").exists() or (draft_dir / "tokenizer.json").exists():
        if vocabulary(draft_dir) != target_tok.get_vocab():
            raise ConfigError("draft tokenizer differs from the target's: speculation needs a shared vocabulary")


# What `goodput` prices a draft-model pair on at load (control/pair_probe.py): a built-in request, not one of
# any benchmark's prompts, and the target's first 32 tokens after it.
PAIR_PROBE_MESSAGES = [
    {
        "role": "user",
        "content": "Write a Python function that checks whether a string is a palindrome, ignoring "
        "case and punctuation, and explain it in two sentences.",
    }
]
PAIR_PROBE_TOKENS = 32


class LLM:
    """A target model, an optional drafter, and the engine that runs them."""

    def __init__(self, target: str = "smollm2-135m-instruct", *, share_target: LLM | None = None, **settings) -> None:
        """settings: the fields of SpeculativeConfig and EngineConfig by name (config.py): method,
        num_speculative_tokens, draft, controller, ngram_min/max, the suffix_* options, max_num_seqs,
        max_model_len, device, dtype, max_num_batched_tokens, enforce_eager, tensor_parallel_size, weights, arithmetic,
        kv_cache_dtype.

        enforce_eager: skip the compiled step (models/compiled.py); None (the default) reads
        $SPECDECODE_ENFORCE_EAGER.

        weights: how a GGUF target and draft load on the CPU in float32: "quantized" keeps the file's blocks
        (models/gguf_quantized.py), "fp32" the dequantized conversion (the reference path); None (the default)
        reads $SPECDECODE_WEIGHTS, else "quantized" (EngineConfig resolves it). Other devices and dtypes, and
        tensor parallelism, load fp32. arithmetic: how quantized weights multiply, "exact" or "fast" (int8
        activations); None reads $SPECDECODE_ARITHMETIC, else "exact". It applies to the target and the draft.
        kv_cache_dtype: "auto" (bf16 under the fast arithmetic where its kernel serves, else fp32), "fp32" or "bf16"
        (models/kv_dtype.py); for the target's and the draft's caches.

        tensor_parallel_size: shard the target over this many processes (specdecode/engine/launch.py); call
        `close()` (or use the LLM as a context manager) to stop them before exit.

        share_target: another LLM whose loaded target this one uses (same model, device, dtype and step), with
        its own engine and cache: a benchmark's arms then hold the weights once. Only one of them may run at
        a time.
        """
        spec, engine = split_settings(with_default_arm(target, settings), SpeculativeConfig, EngineConfig)
        if spec.get("method", "ngram") == "draft" and spec.get("draft") is None:  # the built-in target's draft
            spec["draft"] = DEFAULT_DRAFTS.get(target)
        self.spec = SpeculativeConfig(**spec)
        device = engine.get("device", "cpu")
        enforce_eager = engine.pop("enforce_eager", None)
        if engine.get("tensor_parallel_size", 1) > 1:
            enforce_eager = check_tensor_parallel(device, enforce_eager)
        if enforce_eager is None:
            enforce_eager = os.environ.get(ENFORCE_EAGER_ENV, "0") not in ("", "0")
        self.engine_config = EngineConfig(**engine, enforce_eager=enforce_eager)
        dtype, tensor_parallel_size = self.engine_config.dtype, self.engine_config.tensor_parallel_size
        if device == "cpu":
            torch.set_num_threads(os.cpu_count() or 1)
        gguf = self._quantized_source(target)
        target_dir = resolve_model_dir(target, weights=gguf is None)
        self.tokenizer = load_tokenizer(target_dir)
        self._draft_dir = self._checked_draft_dir(target_dir)  # before any weights load
        self._tp: TensorParallelRuntime | None = None
        self.target_name = target
        if share_target is not None:
            self.target = self._shared_target(share_target)
        elif tensor_parallel_size > 1:  # under torchrun, ranks > 0 serve in here and exit
            self._tp = TensorParallelRuntime.start(target_dir, device, DTYPES[dtype], tensor_parallel_size)
            self._close_tp = weakref.finalize(self, self._tp.close)  # also when collected, and at exit
            self.target = self._tp.target
        else:
            c = self.engine_config
            self.target = load_target(
                target_dir,
                device,
                DTYPES[dtype],
                enforce_eager,
                gguf=gguf,
                arithmetic=c.arithmetic,
                kv_cache_dtype=c.kv_cache_dtype,
            )
        try:
            self._build_engine(target, target_dir)
        except BaseException:
            self.close()  # a constructor that fails leaves no workers behind
            raise
        self._ids = count()

    def _checked_draft_dir(self, target_dir: Path) -> Path | None:
        """The draft model's directory (weights only where it loads fp32), its vocabulary checked against the
        target's; None without a draft model."""
        if self.spec.draft is None or self.spec.method != "draft":
            return None
        draft_dir = resolve_model_dir(self.spec.draft, weights=self._quantized_source(self.spec.draft) is None)
        _check_same_vocab(target_dir, self.tokenizer, draft_dir)
        return draft_dir

    def _quantized_source(self, spec: str) -> Path | None:
        """The GGUF file `spec` loads from with its blocks kept, or None (fp32 weights): see `quantized_source`."""
        c = self.engine_config
        if c.tensor_parallel_size > 1:  # the shards are fp32 slices of the converted weights
            return None
        return quantized_source(spec, c.device, c.dtype, c.weights)

    def _shared_target(self, other: LLM) -> LlamaModel:
        mine, theirs = self.engine_config, other.engine_config
        fields = ("device", "dtype", "enforce_eager", "tensor_parallel_size", "weights", "arithmetic", "kv_cache_dtype")
        differ = [f for f in fields if getattr(mine, f) != getattr(theirs, f)]
        if self.target_name != other.target_name:
            differ.insert(0, "target")
        if differ:
            raise ConfigError(f"cannot share the target of an LLM whose {', '.join(differ)} differs")
        if mine.tensor_parallel_size > 1:
            raise ConfigError("cannot share a tensor-parallel target")
        return other.target

    def _build_engine(self, target: str, target_dir: Path) -> None:
        """Everything around the loaded target: draft model, drafter, controller, engine."""
        spec, config = self.spec, self.engine_config
        draft, controller = spec.draft, spec.controller
        device, dtype, max_model_len = config.device, config.dtype, config.max_model_len
        self.draft_model = None
        if self._draft_dir is not None:  # checked against the target's vocabulary before the target loaded
            draft_dir, gguf = self._draft_dir, self._quantized_source(draft)
            vocab = drafting_vocabulary(draft, draft_dir, spec.draft_vocab)
            self.draft_model = load_draft(
                draft_dir,
                device,
                DTYPES[dtype],
                config.enforce_eager,
                gguf,
                spec.draft_arithmetic,
                vocab,
                spec.draft_weights,
                config.kv_cache_dtype,
            )
        limit = self.target.cfg.context_limit
        self.max_model_len = min(max_model_len or DEFAULT_MAX_MODEL_LEN, limit)
        ctx = DrafterContext(self.target, self.draft_model, self.spec, self.engine_config, self.max_model_len, target)
        self.engine = Engine(
            self.target,
            self.tokenizer,
            make_drafter(ctx),
            # K = 0 never speculates: no cost model to find, nor to measure first on a new machine (goodput's probe
            # of step times takes minutes on a 1.5B model)
            self._controller(controller if self.spec.k else "fixed"),
            self.engine_config,
            self.spec.k,
            self.max_model_len,
            self._eos_ids(),
        )

    def _controller(self, name: str) -> Controller:
        """The controller `name`; `goodput` with a draft model starts from the pair's price, probed here
        (control/pair_probe.py: the target writes PAIR_PROBE_TOKENS tokens after a built-in prompt, the draft
        reads them, ~1 s on the 1.5B pair), kept as `pair_price` (None where nothing was probed)."""
        self.pair_price: PairPrice | None = None
        if name == "goodput" and self.draft_model is not None:
            chat = PAIR_PROBE_MESSAGES
            ids = self.encode(self.apply_chat_template(chat) if self.tokenizer.chat_template else chat[0]["content"])
            if max(ids) < self.vocab_size:  # not a model smaller than its tokenizer (the tests' tiny ones)
                self.pair_price = probe_pair(self.target, self.draft_model, ids, PAIR_PROBE_TOKENS)
        return self.new_controller(name)

    def new_controller(self, name: str) -> Controller:
        """A fresh controller `name` as this LLM starts its own (benchmarks give each arm one): `goodput` with a
        draft model seeded with the pair's price probed at load."""
        controller = make_controller(name, self.target)
        price = self.pair_price
        if isinstance(controller, GoodputController) and price is not None:
            chunk = self.engine_config.max_num_batched_tokens  # the draft's catch-up budget a step (drafters/)
            controller.seed_pair(
                price.acceptance,
                price.draft_step_s,
                price.draft_read_s,
                catch_up_chunk=chunk,
                steps=price.steps,
                window=self.spec.draft_window,
                reads=price.reads,
                confidences=price.confidences,
                agreed=price.agreed,
            )
        return controller

    def warm_up(self) -> int:
        """Compile before serving what a step would compile on first meeting a shape: oneDNN's primitive for each
        row count a step can send (the largest prompt chunk, or every running request verifying K + 1 tokens).
        Call it from the thread that will run the steps. Returns how many primitives ran (0 without oneDNN)."""
        c = self.engine_config
        rows = max(c.max_num_batched_tokens, IDLE_PREFILL_TOKENS, c.max_num_seqs * (self.spec.k + 1))
        models = (self.target, self.draft_model)
        return sum(warm_row_buckets(m, rows) for m in models if isinstance(m, torch.nn.Module))

    def close(self) -> None:
        """Stop the tensor-parallel workers, if any (idempotent)."""
        if self._tp is not None:
            self._close_tp()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def vocab_size(self) -> int:
        """Token ids the target scores (the tokenizer may know more)."""
        return self.target.cfg.vocab_size

    def _eos_ids(self) -> set[int]:
        ids = {self.tokenizer.eos_token_id}
        eos = self.target.cfg.eos_token_id
        ids.update(eos if isinstance(eos, list) else [eos])
        return {i for i in ids if i is not None}

    def check_request(self, prompt_ids: list[int], params: SamplingParams) -> None:
        """Raise ConfigError for what the engine would refuse (bias keys, schemas, the prompt)."""
        self.engine.check_request(prompt_ids, params)

    def encode(self, prompt: str) -> list[int]:
        if not prompt:
            raise ConfigError("empty prompt")
        return self.tokenizer(prompt, add_special_tokens=False).input_ids

    def apply_chat_template(self, messages: list[dict]) -> str:
        if not self.tokenizer.chat_template:
            raise ConfigError("the target's tokenizer has no chat template; use generate() with raw prompts")
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def generate(
        self,
        prompts: str | list[str] | list[list[int]],
        params: SamplingParams | list[SamplingParams] | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Raw prompts (strings or token id lists), no template. One output per prompt, in order."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params_list = params if isinstance(params, list) else [params or SamplingParams()] * len(prompts)
        if len(params_list) != len(prompts):
            raise ConfigError(f"{len(prompts)} prompts but {len(params_list)} sampling params")
        encoded = [p if isinstance(p, list) else self.encode(p) for p in prompts]
        groups: list[list[Sequence]] = []
        bar = tqdm(total=sum(sp.n for sp in params_list), desc="generate", disable=not use_tqdm)
        try:
            for ids, sp in zip(encoded, params_list, strict=True):
                groups.append(self.engine.add_samples(f"req-{next(self._ids)}", ids, sp))
            while self.engine.has_work():
                bar.update(sum(u.finished for u in self.engine.step()))
        except BaseException:
            # Nothing of this call stays queued or running (slots, drafter and controller state are released):
            # the next call on this LLM starts from a clean engine.
            for group in groups:
                self.engine.abort(group[0].group)
            raise
        finally:
            bar.close()
        return [
            RequestOutput.from_samples(g, p if isinstance(p, str) else None)
            for g, p in zip(groups, prompts, strict=True)
        ]

    def chat(
        self,
        conversations: list[dict] | list[list[dict]],
        params: SamplingParams | list[SamplingParams] | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Conversations ([{"role": ..., "content": ...}, ...]) through the model's chat template."""
        if conversations and isinstance(conversations[0], dict):
            conversations = [conversations]
        return self.generate([self.apply_chat_template(c) for c in conversations], params, use_tqdm)
