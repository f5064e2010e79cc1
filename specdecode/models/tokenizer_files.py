"""A model directory's tokenizer, read from disk once per process for each set of files.

`AutoTokenizer.from_pretrained` parses tokenizer.json every time (0.22 s for SmolLM2's 49,152 tokens on two cores);
an `LLM` built again on the same model (a speculative LLM sharing a plain one's target, a benchmark's arms, the test
suite's hundreds of engines) read the same files again. Here the parsed tokenizer is kept by the content of its
files and each caller gets its own deep copy (0.10 s): a caller that changes its tokenizer changes no one else's.
"""

from __future__ import annotations

import copy
import hashlib
import json
import threading
from collections import OrderedDict
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase

KEPT = 4  # parsed tokenizers kept, most recently used first (Qwen2.5's 151,936 tokens: ~100 MB each)
WEIGHTS = (".safetensors", ".bin", ".gguf", ".pt", ".pth")  # never read by a tokenizer: not hashed
LARGE = 64 * 2**20  # bytes: a larger file (another format's weights, say) is keyed by its size and mtime alone

_kept: OrderedDict[str, PreTrainedTokenizerBase] = OrderedDict()
_lock = threading.Lock()


def files_key(model_dir: Path) -> str:
    """A hex key over what `AutoTokenizer.from_pretrained(model_dir)` reads: every file of the directory but the
    weights, config.json by its model_type alone (the rest of it, the model's sizes, does not reach the tokenizer)."""
    h = hashlib.blake2b(digest_size=16)
    for path in sorted(p for p in Path(model_dir).iterdir() if p.is_file() and p.suffix not in WEIGHTS):
        h.update(path.name.encode() + b"\0")
        if path.name == "config.json":
            h.update(str(json.loads(path.read_text()).get("model_type")).encode())
        elif (stat := path.stat()).st_size > LARGE:
            h.update(f"{stat.st_size} {stat.st_mtime_ns}".encode())
        else:
            h.update(path.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def _parsed(model_dir: Path) -> PreTrainedTokenizerBase:
    key = files_key(model_dir)
    with _lock:
        if key in _kept:
            _kept.move_to_end(key)
            return _kept[key]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    with _lock:
        _kept[key] = tokenizer
        while len(_kept) > KEPT:
            _kept.popitem(last=False)
    return tokenizer


def load_tokenizer(model_dir: Path) -> PreTrainedTokenizerBase:
    """The tokenizer of `model_dir`, the caller's own copy."""
    return copy.deepcopy(_parsed(model_dir))


def vocabulary(model_dir: Path) -> dict[str, int]:
    """`model_dir`'s tokenizer's vocabulary (token -> id), without a copy of the tokenizer."""
    return _parsed(model_dir).get_vocab()
