"""A draft model's linears requantized to Q4_0 (or Q4_1) at load: fewer bytes a step, where no exactness is owed.

A draft's tokens are all verified by the target, so its weights need not be the file's: they only set how often
it agrees with the target and what a step costs. A draft step is bound by the bytes its linears read, and the
Qwen2.5-Coder 0.5B's file keeps most of them in Q5_0 (0.69 bytes a weight), Q6_K (0.82) and a Q8_0 head (1.06),
where the kernels' cheapest type was then Q4_1 (0.63 bytes, and the fastest per weight: results/int8_types.json).
Requantized to Q4_1, on the 16 dev code prompts with the 1.5B in the fast arithmetic (2-core AMD EPYC,
2026-11-28, `python -m experiments.draft_weights`, results/draft_weights_dev.json), the 0.5B's compiled step took
10.7 ms instead of 11.6, its acceptance went from 0.835 to 0.831, and the K = 4 draft arm (stopping below 0.7)
went from 1.16x to 1.21x fast K = 0, whole request. Q4_0 (a scale per 32 weights and no minimum: 0.56 bytes a
weight) is the default since: on an Intel Xeon (2026-12-06, the same command with `--weights q4_1,q4_0` and in the
other order, results/draft_weights_q4_0_dev{,_b}.json) the 0.5B's step took 0.88x and 0.91x Q4_1's, its
acceptance went from 0.847 to 0.828, and the arm from 1.42x to 1.47x and from 1.47x to 1.50x fast K = 0.

Each linear whose type reads more bytes a weight than the target type (or has no kernel, and would load as fp32)
is dequantized with `gguf.quants.dequantize` and quantized with `gguf.quants.quantize`: llama.cpp's own Q4_0 (a
scale per 32 weights) or Q4_1 (a scale and a minimum). Q4_K and Q4_0 tensors (and Q4_1 under q4_1), the token
table and 1-d tensors stay as the file has them. The blocks are built once per file into the cache (~7 s for the
0.5B) and read from there after.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import torch
from tqdm import tqdm

from specdecode.models.disk_cache import build_once, cache_root
from specdecode.models.loader import derived_key, prune_versions
from specdecode.models.quant_rows import TYPES

Q = gguf.GGMLQuantizationType
REQUANTIZED = {"q4_1": Q.Q4_1, "q4_0": Q.Q4_0}  # a `weights` setting -> the type its linears take
FORMAT_VERSION = 1  # bump when what is written changes


def bytes_per_weight(qtype: Q) -> float:
    block, nbytes = gguf.GGML_QUANT_SIZES[qtype]
    return nbytes / block


def worth_requantizing(t: gguf.ReaderTensor, qtype: Q) -> bool:
    """Whether `t` (a linear's weight) reads fewer bytes as `qtype` than as it loads: a kernel type of more bytes a
    weight, or a type the kernels lack (it would load as fp32). Its rows must be whole blocks of `qtype`."""
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    if len(t.shape) != 2 or int(t.shape[0]) % block:
        return False
    return t.tensor_type not in TYPES or bytes_per_weight(t.tensor_type) > bytes_per_weight(qtype)


def linear_names(reader: gguf.GGUFReader, qtype: Q) -> list[str]:
    """The file's tensors that load as linears and would read fewer bytes as `qtype`. The token table is read a
    row per token, not multiplied, so it stays (a tied head reads the table's blocks and stays with it)."""
    return [t.name for t in reader.tensors if t.name != "token_embd.weight" and worth_requantizing(t, qtype)]


def requantize(t: gguf.ReaderTensor, qtype: Q) -> np.ndarray:
    """[out, bytes per row] uint8: `t`'s values as llama.cpp's `qtype` blocks."""
    values = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)  # [out, in]
    return np.ascontiguousarray(gguf.quants.quantize(values, qtype))


def _build(reader: gguf.GGUFReader, names: list[str], qtype: Q, out: Path, progress: bool) -> None:
    tensors = {t.name: t for t in reader.tensors}
    desc = f"requantizing the draft to {qtype.name} (once per file)"
    for name in tqdm(names, desc=desc, disable=not progress, leave=False):
        np.save(out / f"{name}.npy", requantize(tensors[name], qtype))


def requantized_blocks(path: Path, reader: gguf.GGUFReader, qtype: Q, progress: bool = True) -> dict[str, torch.Tensor]:
    """{tensor name: [out, bytes per row] uint8 `qtype` blocks} for the linears of the GGUF file `path` that read
    fewer bytes as `qtype`, from the cache (built now if absent; the last two files' blocks are kept)."""
    names = linear_names(reader, qtype)
    if not names:
        return {}
    kind = qtype.name.lower()
    final = cache_root() / "requantized" / f"{path.stem}-{kind}-{derived_key(path, f'requantize{FORMAT_VERSION}')}"
    built = prune_versions(build_once(final, lambda tmp: _build(reader, names, qtype, tmp, progress)))
    return {name: torch.from_numpy(np.load(built / f"{name}.npy")) for name in names}
