"""Compiled target steps: the model's body and LM head compiled with frozen weights, once per machine.

The body (embedding to final norm) and the head are compiled as two graphs with dynamic batch and token
dimensions. Attention is one opaque custom op (models/attention.py), so nothing in a graph depends on how long
the contexts are and steady decoding never recompiles: one body graph and one head graph serve every batch
size and token count.

On CPU the weights are frozen into the graphs. On an AVX-512 CPU the linears are the few-rows GEMM
(models/few_rows.py: each weight panel read once whatever the rows, so a verify of up to ~9 tokens costs
little more than one); elsewhere they go through inductor's C++ GEMM template (`max_autotune` with the CPP
backend), which packs each weight once and at the 1-17 rows of a step streams it faster than MKL's or oneDNN's
GEMM did on the 2-core hosts measured here. The graphs are exported and compiled ahead of time into
AOTInductor packages on disk (models/aot_package.py): the first process on a machine compiles them (~50-75 s
for SmolLM2-135M on two cores, behind a progress bar), later ones load them in seconds. torch.compile's own
graph cache could not do this: it refuses graphs holding packed constants, so every process compiled again.

On CUDA, and on CPU if packaging fails, the step goes under torch.compile in the process (with duck sizing off
and size-1 dimensions left unspecialised, so one graph still serves every shape); `warm_up` compiles it at
load. On CUDA the compiled body is then replayed from CUDA graphs captured per bucket of batch x new tokens
(models/cuda_graphs.py: the attended length is padded to the cache's, so no graph depends on the contexts).
`enforce_eager` (vLLM's name) skips all of this.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
import warnings
from pathlib import Path

import torch
import torch._inductor.config
import torch.fx.experimental._config
from tqdm import tqdm

from specdecode.free_memory import release_free_memory
from specdecode.huge_pages import move_to_huge_pages
from specdecode.models import few_rows
from specdecode.models.aot_package import INDUCTOR_SETTINGS, Body, Head, load_or_compile
from specdecode.models.cuda_graphs import GraphedBody
from specdecode.models.disk_cache import cache_root
from specdecode.models.gguf_quantized import load_gguf_quantized
from specdecode.models.grouped_cache import cached_groups
from specdecode.models.kv_dtype import set_kv_dtype
from specdecode.models.llama import AttentionMetadata, LlamaModel, StepFunctions, load_llama, packs_rows, real_rows
from specdecode.models.quant_int8 import apply_arithmetic

ENFORCE_EAGER_ENV = "SPECDECODE_ENFORCE_EAGER"  # "1": LLM and the commands default to the eager step
# Dynamo's cache is per code object, so every compiled model in a process adds one entry to _Body.forward's
# and one to _Head.forward's (a test session or a multi-arm bench holds dozens of models); one model itself
# needs exactly one of each.
RECOMPILE_LIMIT = 256
COMPILED_MAX_ROWS = 24  # without the few-rows GEMM: tokens per forward up to which compiled beats eager


def _configure_inductor(device: torch.device) -> None:
    """Inductor settings for this process (its config is global: `torch.compile(options=...)` does not reach
    freezing, which must be on for the C++ GEMM template to pack the weights)."""
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_root() / "inductor"))
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    limit = torch._dynamo.config.accumulated_recompile_limit
    torch._dynamo.config.accumulated_recompile_limit = max(limit, 2 * RECOMPILE_LIMIT)
    # One graph for every batch and token count: no duck sizing (two dims equal at trace time would be guarded
    # equal ever after) and no specialisation of size-1 dims (the batch-1 and one-token graphs would each
    # be compiled again, a minute and a half apiece on two cores).
    torch.fx.experimental._config.use_duck_shape = False
    torch.fx.experimental._config.backed_size_oblivious = True
    if device.type == "cpu":  # the settings AOTInductor packages are compiled with, and keyed on
        for name, value in INDUCTOR_SETTINGS.items():
            setattr(torch._inductor.config, name, value)


def compile_step(
    model: LlamaModel,
    warm: bool = True,
    progress: bool = True,
    ahead_of_time: bool | None = None,
    role: str = "target",
) -> float:
    """Swap the model's eager step for compiled body and head; returns the seconds spent compiling or loading.

    ahead_of_time (default: on CPU) loads AOTInductor packages of the step from disk, compiling and saving them
    first if absent (models/aot_package.py). If that fails, or without it, the step goes under torch.compile in
    this process, and `warm` compiles it now.
    """
    device = model.device
    _configure_inductor(device)
    model.requires_grad_(False)  # frozen weights are constants of the graph
    t0 = time.perf_counter()
    if device.type == "cpu" if ahead_of_time is None else ahead_of_time:
        try:
            model.step = _packaged_step(model, progress, role)
            return time.perf_counter() - t0
        except Exception as e:  # export or AOT compile refused this model: the in-process compiler still serves
            warnings.warn(
                f"AOTInductor could not package the step ({type(e).__name__}: {e}); using torch.compile", stacklevel=2
            )
    model.step = StepFunctions(
        body=torch.compile(Body(model), dynamic=True, fullgraph=True),
        head=torch.compile(Head(model), dynamic=True, fullgraph=True),
        compiled=True,
    )
    seconds = warm_up(model, progress, role) if warm else time.perf_counter() - t0
    if device.type == "cuda":  # graphs are captured per bucket at first use, after the compile above
        model.step = dataclasses.replace(model.step, body=GraphedBody(model.step.body))
    return seconds


def _packaged_step(model: LlamaModel, progress: bool, role: str) -> StepFunctions:
    """The step from AOTInductor packages, checked by one forward on a scratch cache."""

    def compiling() -> None:
        bar.set_description(f"compiling the {role} step (first run on this machine; --enforce-eager skips it)")

    with tqdm(total=1, desc=f"loading the compiled {role} step", disable=not progress) as bar:
        body, head = load_or_compile(model, on_compile=compiling)
        bar.update()
    step = StepFunctions(body=body, head=head, compiled=True)
    _scratch_forward(model, step)
    return step


def warm_up(model: LlamaModel, progress: bool = True, role: str = "target") -> float:
    """Compile the body and head graphs with one forward on a scratch cache; returns the seconds taken."""
    t0 = time.perf_counter()
    desc = f"compiling the {role} step (once per process; --enforce-eager skips it)"
    with tqdm(total=1, desc=desc, disable=not progress) as bar:
        _scratch_forward(model, model.step)
        bar.update()
    return time.perf_counter() - t0


def _scratch_forward(model: LlamaModel, step: StepFunctions) -> None:
    """One forward of `step` at batch 2 x 3 tokens (sizes above one keep every dimension dynamic) on a scratch
    cache made outside inference mode, like the engine's: an inference tensor would be guarded on and a normal
    cache would then compile the graph a second time."""
    device = model.device
    cache = model.new_cache(3, 16)
    with torch.inference_mode():
        tokens = torch.zeros((2, 3), dtype=torch.long, device=device)
        meta = AttentionMetadata.build([0, 1], [4, 5], 3, device)
        mask = meta.additive_mask(3, model.dtype)  # [2, 1, 3, kv_len]
        args = (tokens, meta.positions, meta.slots, meta.write_pos, mask, cache.k, cache.v)
        hidden = step.body(*args, *([real_rows(meta.write_pos)] if packs_rows(device) else []))
        step.head(hidden.reshape(6, -1))  # [6, vocab]


def load_target(
    model_dir: str | Path,
    device: str | torch.device,
    dtype: torch.dtype,
    enforce_eager: bool,
    progress: bool = True,
    ahead_of_time: bool | None = None,
    role: str = "target",
    gguf: Path | None = None,
    arithmetic: str = "exact",
    weights: str = "file",
    kv_cache_dtype: str = "auto",
) -> LlamaModel:
    """The model as the engine runs it: compiled and warmed, or eager with packed linears (enforce_eager).
    ahead_of_time: see compile_step. role: what the progress bar calls the model ("target", "draft").

    On a CPU without the few-rows GEMM, forwards over more than COMPILED_MAX_ROWS tokens run on an eager twin
    with packed linears (a second copy of the weights, sharing the cache it is handed): inductor's GEMM streams
    weights best at the few rows of a decode or verify step, but past ~24 rows it is compute-bound and slower
    than oneDNN's (2-core AMD EPYC, 2026-11-24: 4 x 9 tokens 152 ms compiled, 130 ms eager). The few-rows GEMM
    was faster than oneDNN at every row count measured on that machine (results/cost.md), so with it the
    compiled step serves every forward and no twin is loaded.
    gguf: load the model from this GGUF file with its linears kept quantized (models/gguf_quantized.py; CPU and
    fp32 only, see `quantized_source`); model_dir then needs only its config and tokenizer. The compiled step
    runs the quantized linears' op at every row count, so no twin is loaded for it either.
    arithmetic: for a quantized model, "exact" (fp32 activations, models/quant_rows.py) or "fast" (int8
    activations per row and block, models/quant_int8.py); ignored for fp32 weights.
    weights: a quantized model's blocks, the file's ("file") or requantized ("q4_1", "q4_0": a draft's,
    models/requantize.py). kv_cache_dtype: its caches' dtype (models/kv_dtype.py; "auto": bf16 under "fast").
    """
    if gguf is not None:
        return _load_quantized(
            gguf, device, enforce_eager, progress, ahead_of_time, role, arithmetic, weights, kv_cache_dtype
        )
    if enforce_eager:
        model = load_llama(model_dir, device, dtype)
        move_to_huge_pages(model)
        return set_kv_dtype(model, kv_cache_dtype, "exact")
    model = load_llama(model_dir, device, dtype, inference=False)  # inductor packs the weights itself
    set_kv_dtype(model, kv_cache_dtype, "exact")
    kernel = few_rows.available(torch.device(device), dtype)  # or the few-rows GEMM its own (models/few_rows.py)
    if kernel:
        few_rows.install(model)
    compile_step(model, progress=progress, ahead_of_time=ahead_of_time, role=role)
    if torch.device(device).type == "cpu" and not kernel:
        twin = load_llama(model_dir, device, dtype)
        large = StepFunctions(twin.body, twin.head)
        model.step = dataclasses.replace(model.step, max_rows=COMPILED_MAX_ROWS, large=large)
    return model


def _load_quantized(
    gguf: Path,
    device: str | torch.device,
    enforce_eager: bool,
    progress: bool,
    ahead_of_time: bool | None,
    role: str,
    arithmetic: str = "exact",
    weights: str = "file",
    kv_cache_dtype: str = "auto",
) -> LlamaModel:
    """A GGUF model with its blocks kept (or requantized: `weights`), eager or on the compiled step, in the named
    arithmetic; the linears the kernel has no type for (dense fp32) take the few-rows GEMM where it serves."""
    groups = functools.partial(cached_groups, gguf=gguf, weights=weights)  # the fast arithmetic's, from the cache
    model = apply_arithmetic(load_gguf_quantized(gguf, device, weights, progress), arithmetic, groups)
    set_kv_dtype(model, kv_cache_dtype, arithmetic)
    move_to_huge_pages(model)  # before the compiled step takes the tensors' addresses
    release_free_memory()  # the load's numpy temporaries (and the tensors just moved), freed but kept in the heap
    if enforce_eager:
        return model
    if few_rows.available(torch.device(device), torch.float32):
        few_rows.install(model)
    compile_step(model, progress=progress, ahead_of_time=ahead_of_time, role=role)
    return model
