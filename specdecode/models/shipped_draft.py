"""Drafts shipped inside the package, stored without the tensors they share with their target.

A draft distilled with `--init-from-target --freeze-embeddings` keeps the target's embedding (and, tied, its
LM head): for SmolLM2-135M that is 49,152 x 576 floats, 113 MB of a 2-layer draft's 141 MB in fp32. The
shipped copy holds only the rest (decoder layers and final norm, in bf16) plus the draft vocabulary
(vocab.npy) and the training manifest. On first use `rebuild_draft` writes a complete Hugging Face directory
(the target's embedding + the layers in fp32 + the target's tokenizer), which the loader keeps in its model
cache and which specdecode and `transformers.AutoModelForCausalLM` both load like any other draft.

Usage:
    specdecode distill pack DRAFT_DIR specdecode/assets/drafts/smollm2-135m-instruct-draft
"""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from specdecode.atomic_dir import write_atomically
from specdecode.config import ConfigError
from specdecode.models.provision import PARTED_DEFAULT_DRAFTS

DRAFT_ASSETS = Path(__file__).resolve().parent.parent / "assets" / "drafts"
PACKED_WEIGHTS = "layers.safetensors"
EMBEDDING = "model.embed_tokens.weight"
CARRIED = ("config.json", "vocab.npy", "manifest.json")  # copied as they are (vocab.npy only when present)

# Built-in draft name -> the built-in target it was distilled from, and the reverse: the default draft (for
# the Qwen2.5-Coder pair, the smaller model of the family).
BUILTIN_DRAFTS: dict[str, str] = {"smollm2-135m-instruct-draft": "smollm2-135m-instruct"}
DEFAULT_DRAFTS: dict[str, str] = {target: draft for draft, target in BUILTIN_DRAFTS.items()} | PARTED_DEFAULT_DRAFTS


def _target_embedding(target_dir: Path) -> torch.Tensor:
    """[vocab, hidden] the target's input embedding, read from whichever shard holds it."""
    for shard in sorted(target_dir.glob("*.safetensors")):
        with safe_open(shard, framework="pt") as f:
            if EMBEDDING in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                return f.get_tensor(EMBEDDING)
    raise ConfigError(f"{target_dir}: no {EMBEDDING} in the target's weights")


def pack_draft(src: Path, dst: Path, target_dir: Path) -> Path:
    """Write the shippable form of the draft directory `src` to `dst` (replaced if it exists)."""
    if not (src / "config.json").is_file() or not (src / "model.safetensors").is_file():
        raise ConfigError(f"{src} is not a draft directory (needs config.json and model.safetensors)")
    config = json.loads((src / "config.json").read_text())
    if not config.get("tie_word_embeddings"):
        raise ConfigError(f"{src}: only drafts with a tied LM head can be packed (they share the target's)")
    tensors = load_file(src / "model.safetensors")
    if not torch.equal(tensors.get(EMBEDDING, torch.empty(0)), _target_embedding(target_dir)):
        raise ConfigError(f"{src}: the embedding differs from the target's; train with --freeze-embeddings")
    own = {k: v.to(torch.bfloat16).contiguous() for k, v in tensors.items() if k not in (EMBEDDING, "lm_head.weight")}

    def fill(tmp: Path) -> None:
        save_file(own, tmp / PACKED_WEIGHTS, metadata={"format": "pt"})
        for name in CARRIED:
            if (src / name).is_file():
                shutil.copy(src / name, tmp / name)
        _note_packing(tmp / "manifest.json", src)
        _readable(tmp)

    return write_atomically(dst, fill)


def _readable(directory: Path) -> None:
    """mkdtemp makes a private directory; a packed draft is package data that every user must read."""
    directory.chmod(0o755)
    for f in directory.iterdir():
        f.chmod(0o644)


def _note_packing(manifest_path: Path, src: Path) -> None:
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
    manifest["packed"] = {
        "from": str(src),
        "dtype": "bfloat16",
        "shared_with_target": [EMBEDDING, "lm_head.weight (tied)"],
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")


def packed_weights(name: str) -> Path:
    """The packed weights file of built-in draft `name`."""
    path = DRAFT_ASSETS / name / PACKED_WEIGHTS
    if not path.is_file():
        raise ConfigError(f"built-in draft {name!r} is missing from {path.parent}; reinstall specdecode")
    return path


def rebuild_draft(name: str, out: Path, target_dir: Path) -> None:
    """Write the complete Hugging Face directory of built-in draft `name` into `out` (the loader caches it)."""
    asset = DRAFT_ASSETS / name
    tensors = {k: v.float() for k, v in load_file(packed_weights(name)).items()}
    tensors[EMBEDDING] = _target_embedding(target_dir).float()
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    for f in target_dir.iterdir():  # the target's tokenizer: a draft shares its vocabulary
        if f.name.startswith(("tokenizer", "special_tokens")) or f.name == "chat_template.jinja":
            shutil.copy(f, out / f.name)
    for n in CARRIED:
        if (asset / n).is_file():
            shutil.copy(asset / n, out / n)
    _readable(out)
