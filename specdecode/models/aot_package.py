"""The compiled step as AOTInductor packages on disk: compiled by the first process, loaded in seconds after.

torch.compile's graph cache refuses graphs holding packed constants (models/compiled.py), so a compiled step
would be rebuilt by every process. Instead the body and the head are exported (torch.export, with dynamic
batch, tokens, attended length and cache size) and compiled ahead of time (AOTInductor, the same freezing
and C++ GEMM settings) into two packages whose constants are the frozen, packed weights. The attention op
runs inside the package through AOTInductor's proxy executor and writes the cache in place.

A package's key covers everything its code and constants depend on: the weights' bytes, the config, dtype
and device, the code of the modules traced into it (docstrings, comments and layout aside), the schemas of the C++
ops it calls, torch's version, inductor's settings, the CPU and the thread count. Not the ops' bodies: a package
calls every specdecode op by name through AOTInductor's proxy executor, so the kernel that runs is the library this
process loaded (a kernel edit had made every package compile again, minutes for the 1.5B). Any change gives a new
key, so a stale package is never loaded; packages live under `<cache_root>/aoti/<key>/`, published by an atomic
rename. CPU only: on CUDA the step stays under torch.compile (no GPU has been lent to measure AOTInductor there).

A model whose linears keep GGUF blocks (models/gguf_quantized.py) is packaged differently: nothing is frozen
(there is no fp32 weight for inductor to pack, and the blocks only feed the opaque quant_rows op) and the
package holds no constants. At load its constants are the model's own tensors, handed over by pointer
(`load_constants(user_managed=True)`): the weights are in memory once, and a package is a few MB of code whose
key covers the constants' names, shapes and types but not their bytes. Its key also says "quantized", so a
quantized and an fp32 model never share a package.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import json
import os
import platform
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
import torch._inductor
import torch._inductor.config
import torch.fx.experimental._config
from torch import nn
from torch.export import Dim

from specdecode.hardware import cpu_model
from specdecode.models import attention, few_rows, gguf_quantized, llama, quant_int8, quant_rows
from specdecode.models.disk_cache import build_once, cache_root, check_tree, private_dir, remove_beyond_bytes
from specdecode.models.llama import AttentionMetadata, LlamaModel, packs_rows, real_rows

FORMAT = 1  # bump when what a package holds, or how it is called, changes
BODY, HEAD = "body.pt2", "head.pt2"
INDUCTOR_SETTINGS = {"freezing": True, "max_autotune": True, "max_autotune_gemm_backends": "CPP"}
# A quantized model's package: no freezing, and no constants inside it (the model's tensors are handed over).
QUANTIZED_SETTINGS = {**INDUCTOR_SETTINGS, "freezing": False, "aot_inductor.package_constants_in_so": False}
# Export bounds: far past any step the engine runs (a shape outside them would be refused by the package).
MAX_ROWS, MAX_LEN = 1 << 16, 1 << 24
# Packages kept on disk, most recently used first, up to this many bytes besides the one in use. A quantized
# model's package is a few MB of code (its weights stay in the GGUF), an fp32 model's holds its packed weights
# (SmolLM2-135M's: 0.25-0.6 GB): counting packages instead had a user who moved between five quantized models
# (the pair's target and draft, SmolLM2, each arithmetic) compile one again (minutes for the 1.5B) for a few MB.
MAX_PACKAGE_BYTES = 2 << 30


def is_quantized(model: nn.Module) -> bool:
    """Whether any of the model's linears keeps GGUF blocks (a QuantLinear, or its int8 twin)."""
    return any(isinstance(m, (quant_rows.QuantLinear, quant_int8.Int8QuantLinear)) for m in model.modules())


def code(source: str) -> str:
    """A Python module's code without its docstrings, comments and layout (its syntax tree, dumped): what a package
    depends on. A change to the prose alone keeps the key, where it had made every package compile again."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and _docstring(node):
            node.body = node.body[1:] or [ast.Pass()]
    return ast.dump(tree)


# A C++ comment, or a string or character literal (matched whole, so a "//" or "/*" inside one is no comment).
C_TOKENS = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.DOTALL)


def c_code(source: str) -> str:
    """A C++ kernel's code without its comments, indentation and blank lines, as `code` is for Python: a comment
    edit in a kernel keeps every package's key (it had made every package compile again)."""
    text = C_TOKENS.sub(lambda m: " " if m.group(0)[0] == "/" else m.group(0), source)
    return "\n".join(line.strip() for line in text.splitlines() if line.strip())


# A kernel's op definitions: `m.def(` and its schema, one string literal or several side by side.
OP_DEF = re.compile(r'm\.def\(\s*((?:"(?:\\.|[^"\\])*"\s*)+)')


def op_schemas(source: str) -> list[str]:
    """The schemas of the torch ops a C++ kernel defines (`m.def`), outside comments: all of the kernel that a
    package holds. It calls the op by name at run time, and its fake (output shapes) is registered in Python."""
    return [re.sub(r'"\s*"', "", m.group(1)).strip('"') for m in OP_DEF.finditer(c_code(source))]


def _docstring(node: ast.AST) -> bool:
    first = node.body[0] if node.body else None
    return isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)


def package_key(model: LlamaModel) -> str:
    """A hex key over everything a package of `model`'s step depends on."""
    h = hashlib.blake2b(digest_size=16)
    quantized = is_quantized(model)
    described = {
        "format": FORMAT,
        "weights": "quantized" if quantized else "fp32",
        "torch": torch.__version__,
        "config": repr(model.cfg),
        "dtype": str(model.dtype),
        "kv_dtype": str(model.kv_dtype or model.dtype),
        "device": model.device.type,
        "inductor": QUANTIZED_SETTINGS if quantized else INDUCTOR_SETTINGS,
        "shapes": [torch.fx.experimental._config.use_duck_shape, torch.fx.experimental._config.backed_size_oblivious],
        "cpu": (platform.machine(), cpu_model(), torch.backends.cpu.get_cpu_capability()),
        "threads": torch.get_num_threads(),
        "source": [code(inspect.getsource(m)) for m in (llama, attention, few_rows)],
        "packaging": [code(inspect.getsource(f)) for f in PACKAGING] + [MAX_ROWS, MAX_LEN],
        "ops": [op_schemas(p.read_text()) for p in few_rows.SOURCES],
    }
    if quantized:  # the op's source and how modules are built; the constants by name, shape and type only
        described["quantized"] = {
            "source": [code(inspect.getsource(m)) for m in (quant_rows, quant_int8, gguf_quantized)]
            + [op_schemas(quant_rows.SOURCE.read_text()), op_schemas(quant_int8.SOURCE.read_text())],
            "modules": repr(model),
            "constants": [(n, list(t.shape), str(t.dtype)) for n, t in _constants(model, "").items()],
        }
    h.update(json.dumps(described, sort_keys=True).encode())
    if quantized:
        return h.hexdigest()
    seen: set[int] = set()
    for name, t in model.state_dict(keep_vars=False).items():  # tied weights are hashed once
        h.update(name.encode())
        if t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        h.update(t.detach().contiguous().cpu().view(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def load_or_compile(model: LlamaModel, on_compile: Callable[[], None] | None = None) -> tuple[Callable, Callable]:
    """The body and head runners of `model`'s step: loaded from disk, else compiled and saved first
    (`on_compile` is called before a compile starts, e.g. to show a progress bar). A package that does not
    load (truncated, say) is compiled again; one another user could have written is refused (UnsafeCacheError)."""
    root = private_dir(cache_root() / "aoti")
    final = root / package_key(model)
    try:
        if final.exists():
            check_tree(final)  # the package holds a shared library: load only what this user alone wrote
        runners = _load(final / BODY, model), _load(final / HEAD, model)
    except (FileNotFoundError, RuntimeError):  # absent, or unreadable
        shutil.rmtree(final, ignore_errors=True)
        if on_compile is not None:
            on_compile()
        build_once(final, lambda tmp: compile_packages(model, tmp))
        prune(root, keep=final)
        runners = _load(final / BODY, model), _load(final / HEAD, model)
    os.utime(final)  # most recently used: kept by prune
    return runners


def prune(root: Path, keep: Path, max_bytes: int = MAX_PACKAGE_BYTES) -> None:
    """Delete the least recently used packages under `root` until the others fit in `max_bytes` (`keep` always
    stays): an fp32 package is a copy of a model's weights, and every change to the traced code gives a new key."""
    remove_beyond_bytes([p for p in root.iterdir() if p.is_dir() and p != keep], max_bytes)


def compile_packages(model: LlamaModel, out: Path) -> None:
    """Export and AOT-compile `model`'s body and head into `out` (BODY, HEAD)."""
    body_args, body_shapes = _body_example(model)
    head_args = (torch.zeros(6, model.cfg.hidden_size, dtype=model.dtype, device=model.device),)  # [rows, hidden]
    head_shapes = ({0: Dim("rows", min=1, max=MAX_ROWS)},)
    parts = ((Body(model), body_args, body_shapes, BODY), (Head(model), head_args, head_shapes, HEAD))
    with torch.no_grad():
        for module, args, shapes, name in parts:
            program = torch.export.export(module, args, dynamic_shapes=shapes)
            settings = dict(QUANTIZED_SETTINGS if is_quantized(model) else INDUCTOR_SETTINGS)
            torch._inductor.aoti_compile_and_package(program, package_path=str(out / name), inductor_configs=settings)


class Body(nn.Module):
    """The model's body (embedding to final norm) as a module of its own, over flat tensors: compilers freeze a
    module's parameters into the graph (packed constants), where a bound method's would stay graph inputs."""

    def __init__(self, model: LlamaModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return self.model.body(*args)


class Head(nn.Module):
    """The LM head, likewise (a class of its own: dynamo's cache and its limit are per code object)."""

    def __init__(self, model: LlamaModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.head(hidden)


def _body_example(model: LlamaModel) -> tuple[tuple[torch.Tensor, ...], tuple]:
    """Example inputs of the body (batch 2 x 3 tokens on a 3-slot cache, 5 of them real on CPU: every dynamic
    size above one and all of them distinct) and their dynamic dimensions."""
    device = model.device
    cache = model.new_cache(3, 16)
    meta = AttentionMetadata.build([0, 1], [4, 5], 3, device, num_new=[3, 2])
    tokens = torch.zeros((2, 3), dtype=torch.long, device=device)
    args = (tokens, meta.positions, meta.slots, meta.write_pos, meta.additive_mask(3, model.dtype), cache.k, cache.v)
    b, t = Dim("batch", min=1, max=MAX_ROWS), Dim("tokens", min=1, max=MAX_ROWS)
    kv, slots, length = Dim("kv", min=1, max=MAX_LEN), Dim("slots", min=1, max=MAX_ROWS), Dim("len", min=2, max=MAX_LEN)
    cache_dims = {1: slots, 3: length}  # [layers, slots, kv_heads, len + 1, head_dim]
    shapes = ({0: b, 1: t}, {0: b, 1: t}, {0: b}, {0: b, 1: t}, {0: b, 2: t, 3: kv}, cache_dims, cache_dims)
    if packs_rows(device):  # the real tokens' indices (LlamaModel.forward passes them there)
        args, shapes = (*args, real_rows(meta.write_pos)), (*shapes, {0: Dim("real", min=1, max=MAX_ROWS)})
    return args, (shapes,)  # one entry: the body takes *args


def _constants(model: nn.Module, prefix: str = "model.") -> dict[str, torch.Tensor]:
    """The model's parameters and buffers (non-persistent ones too) by the names a package of Body or Head
    calls its constants ("model." + the model's own name)."""
    tensors = [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]
    return {prefix + n: t for n, t in tensors}  # a tied tensor under each of its names


# What of this module shapes a package (the rest finds, loads and prunes them, and may change without a new key).
PACKAGING = (compile_packages, Body, Head, _body_example, _constants)


def _load(path: Path, model: LlamaModel) -> Callable:
    if not path.is_file():
        raise FileNotFoundError(path)
    quantized = is_quantized(model)
    if quantized:
        quant_rows.library()  # the ops the package calls must be registered before it loads
        if any(isinstance(m, quant_int8.Int8QuantLinear) for m in model.modules()):
            quant_int8.library()
    runner = torch._inductor.aoti_load_package(str(path))
    if quantized:  # a package without constants: the model's own tensors, by pointer, no copy
        tensors = _constants(model)
        wanted = {n: tensors[n] for n in runner.get_constant_fqns()}
        runner.load_constants(wanted, check_full_update=True, user_managed=True)
    return runner
