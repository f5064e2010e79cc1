"""`specdecode distill vocab`: a draft model's drafting vocabulary, the most frequent tokens of a training corpus.

A draft that scores only S of the V tokens reads S / V of its LM head (drafters/subset_head.py): the Qwen2.5-Coder
0.5B's head is 151,936 x 896 Q8_0, 139 MB of the ~370 MB a draft step reads. A token outside the subset is one the
draft cannot propose, so S trades the head's cost against coverage of what the target writes. The counts come
from text the target's tokenizer encodes: files (source code, prose) and distillation response files (.npz, the
format of ../shared/data/distill, decoded by the tokenizer that wrote them). Never benchmark prompts.

    specdecode distill vocab --draft qwen2.5-coder-0.5b-instruct --size 65536 \\
        --texts /usr/lib/python3.11 --responses ../shared/data/distill/*.npz \\
        --out specdecode/assets/drafts/qwen2.5-coder-0.5b-instruct.vocab.npy
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
from tqdm import tqdm

from specdecode.config import ConfigError

TEXT_SUFFIXES = (".py", ".md", ".txt", ".rst", ".c", ".h", ".cpp", ".hpp", ".js", ".ts", ".rs", ".go", ".sql", ".sh")

SKIPPED_DIRS = ("site-packages",)
BATCH = 256  # texts per tokenizer call


def text_files(paths: Iterable[str]) -> list[Path]:
    """The files named, and the files with a TEXT_SUFFIXES suffix under the directories named, sorted. Under a
    directory, test directories (their code is unlike what people ask for) and installed packages
    (site-packages: a Python's lib directory holds them beside the standard library) are left out."""
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files += [f for f in p.rglob("*") if f.suffix in TEXT_SUFFIXES and f.is_file() and _kept(f.relative_to(p))]
        elif p.is_file():
            files.append(p)
        else:
            raise ConfigError(f"--texts {p}: no such file or directory")
    return sorted(files)


def _kept(relative: Path) -> bool:
    return not any(d.startswith("test") or d in SKIPPED_DIRS for d in relative.parts[:-1])


def response_texts(path: Path, tokenizer) -> Iterator[str]:
    """The responses of a distillation .npz (`tokens`, `offsets`, `prompt_len`), decoded to text."""
    try:
        data = np.load(path)
        tokens, offsets, prompt_len = data["tokens"], data["offsets"], data["prompt_len"]
    except (OSError, ValueError, KeyError) as e:
        raise ConfigError(f"--responses {path}: not a distillation file ({e})") from None
    for i in range(len(offsets) - 1):
        yield tokenizer.decode(tokens[offsets[i] + prompt_len[i] : offsets[i + 1]], skip_special_tokens=True)


def count_tokens(tokenizer, texts: Iterable[str], vocab_size: int, desc: str) -> np.ndarray:
    """[vocab_size] int64: how often `tokenizer` emits each id over `texts`."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    batch: list[str] = []
    for text in tqdm(texts, desc=desc, unit=" texts"):
        batch.append(text)
        if len(batch) == BATCH:
            counts += _counted(tokenizer, batch, vocab_size)
            batch = []
    return counts + (_counted(tokenizer, batch, vocab_size) if batch else 0)


def _counted(tokenizer, texts: list[str], vocab_size: int) -> np.ndarray:
    ids = np.concatenate([np.asarray(x, dtype=np.int64) for x in tokenizer(texts)["input_ids"]] + [np.zeros(0, int)])
    return np.bincount(ids, minlength=vocab_size)[:vocab_size]


def top_tokens(counts: np.ndarray, size: int, always: list[int]) -> np.ndarray:
    """[size] int64 sorted: the ids in `always`, then the most frequent, ties (unseen tokens too) to the lower id
    (a byte-level BPE gives its earlier, commoner merges the lower ids)."""
    if not 0 < size <= len(counts):
        raise ConfigError(f"--size must be in 1..{len(counts)}, got {size}")
    ranked = counts.astype(np.float64)
    ranked[always] = np.inf
    return np.sort(np.argsort(-ranked, kind="stable")[:size])


def coverage(vocab: np.ndarray, token_ids: np.ndarray) -> float:
    """The share of token_ids [N] inside vocab [S]."""
    return float(np.isin(token_ids, vocab).mean()) if len(token_ids) else float("nan")


def add_vocab_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--draft", required=True, help="the draft model (a built-in name, .gguf or directory)")
    p.add_argument("--size", type=int, default=65536, help="tokens in the drafting vocabulary")
    p.add_argument("--texts", nargs="*", default=[], help="text files or directories (code, prose) to count")
    p.add_argument("--responses", nargs="*", default=[], help="distillation .npz files to count (decoded)")
    p.add_argument("--responses-tokenizer", default="smollm2-135m-instruct", help="the model that wrote them")
    p.add_argument("--out", required=True, help="the .npy to write (assets/drafts/NAME.vocab.npy ships it)")


def run_vocab(a: argparse.Namespace) -> None:
    from transformers import AutoTokenizer  # slow imports once the arguments parse

    from specdecode.models.llama import LlamaConfig
    from specdecode.models.loader import resolve_model_dir

    if not a.texts and not a.responses:
        raise ConfigError("give --texts and/or --responses to count tokens over")
    draft_dir = resolve_model_dir(a.draft, weights=False)
    tokenizer = AutoTokenizer.from_pretrained(draft_dir)
    vocab_size = LlamaConfig.from_dir(draft_dir).vocab_size  # Qwen pads it
    counts = count_tokens(tokenizer, (f.read_text(errors="replace") for f in text_files(a.texts)), vocab_size, "texts")
    if a.responses:
        writer = AutoTokenizer.from_pretrained(resolve_model_dir(a.responses_tokenizer, weights=False))
        for path in map(Path, a.responses):
            counts += count_tokens(tokenizer, response_texts(path, writer), vocab_size, path.name)
    vocab = top_tokens(counts, a.size, sorted(tokenizer.all_special_ids))
    np.save(a.out, vocab.astype(np.int32))
    share = counts[vocab].sum() / max(counts.sum(), 1)
    print(f"{len(vocab)} of {vocab_size} tokens written to {a.out}: {share:.4f} of the {counts.sum():,} counted")
