"""llama.cpp as a Spec-Bench peer: plain greedy decoding and its prompt-lookup decoding on the target's own GGUF.

Optional: `make peers` (or `pip install -e .[peers]`) builds llama-cpp-python from source; `specdecode bench
specbench --llama-cpp` then adds these arms to the run. They decode the same prompt token ids as our arms (our
tokenizer and chat template; the vocabulary is the GGUF's), greedy, stopping at the target's EOS ids, each
request from an empty KV cache. They are not the exact target: llama.cpp multiplies the GGUF's quantized weights
with 8-bit quantized activations and keeps an f16 KV cache, while our arms run the dequantized fp32 model, so
the greedy texts agree at first and drift apart later.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import gguf
import numpy as np
import torch

from specdecode.bench.lib import Arm, Sample
from specdecode.config import ConfigError

INSTALL_HINT = "install the peers extra: pip install -e .[peers] (or make peers)"
FLOAT_TYPES = ("F32", "F16", "BF16")  # weights llama.cpp multiplies without quantizing the activations


def target_gguf(target: str) -> Path:
    """The GGUF file behind `target` (a built-in name or a .gguf path); ConfigError for any other target."""
    from specdecode.models.loader import BUILTIN_MODELS

    if target in BUILTIN_MODELS:
        return BUILTIN_MODELS[target].gguf_path(target)
    path = Path(target).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return path
    raise ConfigError(
        f"--llama-cpp needs a GGUF-backed target (a built-in name or a .gguf file), and {target} has no GGUF"
    )


def import_llama_cpp() -> ModuleType:
    """llama_cpp, or a ConfigError saying how to get it."""
    try:
        import llama_cpp
    except ImportError:
        raise ConfigError(f"--llama-cpp needs llama-cpp-python: {INSTALL_HINT}") from None
    except (RuntimeError, OSError) as e:  # installed, but its shared library is missing or does not load
        raise ConfigError(f"--llama-cpp: llama-cpp-python does not load ({e}); rebuild it: make peers") from None
    return llama_cpp


def require(target: str) -> Path:
    """The target's GGUF, once llama_cpp is known to import: checked before any model loads, to fail fast."""
    path = target_gguf(target)
    import_llama_cpp()
    return path


def arithmetic_note(path: Path) -> str:
    """What llama.cpp computes with, from the GGUF's tensor types: 'Q4_1 weights (token_embd Q8_0), ...'."""
    tensors = gguf.GGUFReader(path).tensors
    matrices = Counter(t.tensor_type.name for t in tensors if t.name.startswith("blk.") and len(t.shape) == 2)
    main = matrices.most_common(1)[0][0]
    others = [
        f"{t.name.removesuffix('.weight')} {t.tensor_type.name}"
        for t in tensors
        if t.name in ("token_embd.weight", "output.weight") and t.tensor_type.name != main
    ]
    weights = f"{main} weights" + (f" ({', '.join(others)})" if others else "")
    activations = "fp32 activations" if main in FLOAT_TYPES else "8-bit activations"
    return f"{weights}, {activations}, f16 KV cache (llama.cpp CPU kernels), not the exact fp32 target"


class CountingLookup:
    """llama.cpp's prompt-lookup drafter, counting its calls and drafted tokens (llama-cpp-python reports
    neither). generate() calls the drafter once before every forward but the prompt's, so forwards = calls + 1."""

    def __init__(self, lookup: Callable[[np.ndarray], np.ndarray]) -> None:
        self.lookup = lookup
        self.calls = self.drafted = 0

    def reset(self) -> None:
        self.calls = self.drafted = 0

    def __call__(self, input_ids: np.ndarray, /, **kwargs) -> np.ndarray:
        draft = self.lookup(input_ids, **kwargs)  # [<= K] token ids continuing an earlier match of the suffix
        self.calls += 1
        self.drafted += len(draft)
        return draft


class LlamaCppArm:
    """A llama_cpp.Llama at batch 1, greedy, timed like the other arms: the whole request, prompt ids to last
    token, prefill included."""

    def __init__(
        self,
        name: str,
        llama,
        encode: Callable[[str], list[int]],
        eos_ids: set[int],
        note: str,
        lookup: CountingLookup | None = None,
    ) -> None:
        self.name, self.llama, self.encode, self.eos_ids, self.note = name, llama, encode, eos_ids, note
        self.lookup = lookup

    def run(self, text: str, max_tokens: int) -> Sample:
        t0 = time.perf_counter()
        ids = self.encode(text)  # our arms' prompt ids, not llama.cpp's own tokenization
        # generate() would reuse the previous request's K/V for a shared prefix; our arms and HF's start empty.
        self.llama.reset()
        if self.lookup is not None:
            self.lookup.reset()
        tokens = 0
        for token in self.llama.generate(ids, temp=0.0, top_k=1, reset=True):
            tokens += 1
            if token in self.eos_ids or tokens >= max_tokens:
                break
        seconds = time.perf_counter() - t0
        if self.lookup is None:  # one token per forward
            return Sample(tokens, seconds, forwards=tokens)
        forwards = self.lookup.calls + 1
        return Sample(tokens, seconds, self.lookup.drafted, tokens - forwards, forwards)


def lookup_ks(ours: list) -> list[int]:
    """The K of each of our n-gram arms, so that llama.cpp's prompt lookup drafts as many tokens."""
    return sorted({llm.spec.num_speculative_tokens for llm in ours if llm.spec.method == "ngram"})


def llama_cpp_arms(a: argparse.Namespace, gguf_path: Path, base, ours: list) -> list[Arm]:
    """'llama.cpp' (plain greedy) and one 'llama.cpp lookup K=k' per K of our n-gram arms, on `gguf_path`."""
    llama_cpp = import_llama_cpp()
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    note = arithmetic_note(gguf_path)
    eos = set(base.engine.eos_token_ids)
    settings = dict(
        model_path=str(gguf_path),
        n_ctx=a.max_model_len or 8192,  # as our batch-1 arms: the longest prompt plus max_tokens fits
        n_threads=torch.get_num_threads(),
        n_threads_batch=torch.get_num_threads(),
        verbose=False,
    )
    arms: list[Arm] = [LlamaCppArm("llama.cpp", llama_cpp.Llama(**settings), base.encode, eos, note)]
    for k in lookup_ks(ours):
        lookup = CountingLookup(LlamaPromptLookupDecoding(num_pred_tokens=k))
        # logits_all by hand: llama-cpp-python 0.3.36 turns it on for a drafter but sizes its logits buffer by the
        # argument, so prompts past n_batch (512) tokens would overflow it
        llama = llama_cpp.Llama(**settings, draft_model=lookup, logits_all=True)
        arms.append(LlamaCppArm(f"llama.cpp lookup K={k}", llama, base.encode, eos, note, lookup))
    return arms
