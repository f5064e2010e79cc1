"""Compiled target steps: the model's body and LM head under torch.compile, compiled once per process.

The body (embedding to final norm) and the head are compiled as two graphs with dynamic batch and token
dimensions. Attention is one opaque custom op (models/attention.py), so nothing in a graph depends on how long
the contexts are and steady decoding never recompiles. With duck sizing off and size-1 dimensions left
unspecialised, one body graph and one head graph serve every batch size and token count; `warm_up` compiles
both at load, behind a progress bar, so no request pays for a compile.

On CPU the weights are frozen into the graphs and the linears go through inductor's C++ GEMM template
(`max_autotune` with the CPP backend): it packs each weight once and, at the 1-17 rows of a decode or verify
step, streams it far faster than MKL's or oneDNN's GEMM did on the 2-core hosts measured here. On CUDA the
default inductor backend runs (no CUDA graphs: the attended length changes every step).

Kernels and autotuning results land in inductor's on-disk caches under the specdecode cache directory, but
the whole graph is not reused across processes: inductor's graph cache refuses graphs that hold oneDNN-packed
constants, and without that packing pass the C++ GEMM template does not apply. So every process compiles
once (~80-90 s for SmolLM2-135M on two cores); `enforce_eager` (vLLM's name) skips all of this.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import torch
import torch._inductor.config
import torch.fx.experimental._config
from torch import nn
from tqdm import tqdm

from specdecode.models.llama import AttentionMetadata, LlamaModel, StepFunctions, load_llama
from specdecode.models.loader import cache_root

ENFORCE_EAGER_ENV = "SPECDECODE_ENFORCE_EAGER"  # "1": LLM and the commands default to the eager step
# Dynamo's cache is per code object, so every compiled model in a process adds one entry to _Body.forward's
# and one to _Head.forward's (a test session or a multi-arm bench holds dozens of models); one model itself
# needs exactly one of each.
RECOMPILE_LIMIT = 256
COMPILED_MAX_ROWS = 24  # tokens per forward up to which the compiled step beats the eager one (load_target)


class _Body(nn.Module):
    """The model's body as a module of its own: torch.compile freezes a module's parameters into the graph
    (they become packed constants); a bound method's would stay graph inputs."""

    def __init__(self, model: LlamaModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return self.model.body(*args)


class _Head(nn.Module):
    """The LM head, likewise (a class of its own: dynamo's cache and its limit are per code object)."""

    def __init__(self, model: LlamaModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.head(hidden)


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
    if device.type == "cpu":
        inductor = torch._inductor.config
        inductor.freezing = True
        inductor.max_autotune = True
        inductor.max_autotune_gemm_backends = "CPP"


def compile_step(model: LlamaModel, warm: bool = True, progress: bool = True) -> float:
    """Swap the model's eager step for compiled body and head; with `warm`, compile both graphs now.

    Returns the seconds spent compiling.
    """
    _configure_inductor(model.embed.weight.device)
    model.requires_grad_(False)  # frozen weights are constants of the graph
    model.step = StepFunctions(
        body=torch.compile(_Body(model), dynamic=True, fullgraph=True),
        head=torch.compile(_Head(model), dynamic=True, fullgraph=True),
        compiled=True,
    )
    return warm_up(model, progress) if warm else 0.0


def warm_up(model: LlamaModel, progress: bool = True) -> float:
    """Compile the body and head graphs with one forward on a scratch cache; returns the seconds taken.
    Batch 2 x 3 tokens: sizes above one keep every dimension dynamic."""
    device = model.embed.weight.device
    # Made outside inference mode, like the engine's cache: an inference tensor would be guarded on and a
    # normal cache would then compile the graph a second time.
    cache = model.new_cache(3, 16)
    t0 = time.perf_counter()
    desc = "compiling the target step (once per process; --enforce-eager skips it)"
    with torch.inference_mode(), tqdm(total=1, desc=desc, disable=not progress) as bar:
        tokens = torch.zeros((2, 3), dtype=torch.long, device=device)
        meta = AttentionMetadata.build([0, 1], [4, 5], 3, device)
        model(tokens, meta, cache)  # the body at [2, 3] and the head at 6 rows
        bar.update()
    return time.perf_counter() - t0


def load_target(
    model_dir: str | Path, device: str | torch.device, dtype: torch.dtype, enforce_eager: bool, progress: bool = True
) -> LlamaModel:
    """The model as the engine runs it: compiled and warmed, or eager with packed linears (enforce_eager).

    On CPU, forwards over more than COMPILED_MAX_ROWS tokens run on an eager twin with packed linears (a second
    copy of the weights, sharing the cache it is handed): the compiled GEMM streams weights best at the few
    rows of a decode or verify step, but past ~24 rows it is compute-bound and slower than oneDNN's
    (results/cost.md, 2-core AMD EPYC, 2026-11-24: 4 x 9 tokens 152 ms compiled, 130 ms eager).
    """
    if enforce_eager:
        return load_llama(model_dir, device, dtype)
    model = load_llama(model_dir, device, dtype, inference=False)  # inductor packs the weights itself
    compile_step(model, progress=progress)
    if torch.device(device).type == "cpu":
        twin = load_llama(model_dir, device, dtype)
        large = StepFunctions(twin.body, twin.head)
        model.step = dataclasses.replace(model.step, max_rows=COMPILED_MAX_ROWS, large=large)
    return model
