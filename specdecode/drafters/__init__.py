"""Drafters by method name. Each builder takes what the engine has and returns a `Drafter`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specdecode.config import ConfigError, EngineConfig, SpeculativeConfig
from specdecode.drafters.base import Drafter, Proposal
from specdecode.drafters.draft_model import DraftModelDrafter
from specdecode.drafters.eagle import EagleDrafter
from specdecode.drafters.layer_select import LayerSkipChoice
from specdecode.drafters.layer_skip import LayerSkipDrafter
from specdecode.drafters.medusa import MedusaDrafter
from specdecode.drafters.mtp import MtpDrafter
from specdecode.drafters.ngram import NgramDrafter
from specdecode.drafters.ngram_tree import NgramTreeDrafter
from specdecode.drafters.none import NoDrafter
from specdecode.drafters.self_draft import self_drafter
from specdecode.drafters.subset_head import VOCAB_FILE, load_subset
from specdecode.drafters.suffix import SuffixDrafter
from specdecode.drafters.tree_search import TreeShape
from specdecode.heads import load_heads
from specdecode.models import fp32_linears
from specdecode.models.llama import LlamaModel

ASSETS = Path(__file__).resolve().parent.parent / "assets"  # shipped heads and layer choices, per target


@dataclass
class DrafterContext:
    target: LlamaModel
    draft: LlamaModel | None
    spec: SpeculativeConfig
    engine: EngineConfig
    max_len: int
    target_name: str = ""  # the name the user gave (a built-in name finds the shipped heads)


def lookup_drafter(n_min: int, n_max: int, device: str) -> NgramDrafter | None:
    """Prompt lookup ahead of a draft model (drafters/lookup_first.py): suffixes of n_min tokens or more; None at 0."""
    return NgramDrafter(n_min, max(n_min, n_max), device) if n_min else None


def _draft_model(ctx: DrafterContext) -> Drafter:
    if ctx.draft is None:
        raise ConfigError("method 'draft' needs a draft model (--draft)")
    return DraftModelDrafter(
        ctx.draft,
        ctx.engine.max_num_seqs,
        ctx.max_len,
        ctx.engine.max_num_batched_tokens,
        stop_below=ctx.spec.draft_stop_below,
        window=ctx.spec.draft_window,
        lookup=lookup_drafter(ctx.spec.draft_lookup, ctx.spec.ngram_max, ctx.engine.device),
    )


def _heads_dir(ctx: DrafterContext, kind: str) -> Path:
    """--draft names the heads; without it, the heads shipped for a built-in target."""
    if ctx.spec.draft:
        return Path(ctx.spec.draft)
    shipped = ASSETS / "heads" / ctx.target_name / kind
    if (shipped / "head.json").is_file():
        return shipped
    raise ConfigError(
        f"method {kind!r} needs trained heads: pass --draft DIR (train them with `specdecode distill --head {kind}`);"
        f" none are shipped for target {ctx.target_name!r}"
    )


def _head_drafter(kind: str):
    def build(ctx: DrafterContext) -> Drafter:
        device, dtype = ctx.target.device, ctx.target.dtype
        path = _heads_dir(ctx, kind)
        heads, cfg, _ = load_heads(path, ctx.target, device, dtype)
        fp32_linears.install(heads, device, dtype)
        shape = TreeShape()
        if kind == "eagle":  # an optional vocab.npy beside the head restricts its candidates (a cheaper LM head)
            vocab = path / VOCAB_FILE
            subset = load_subset(vocab, ctx.target.cfg.vocab_size) if vocab.is_file() else None
            engine = ctx.engine
            return EagleDrafter(
                ctx.target, heads, shape, engine.max_num_seqs, ctx.max_len, subset, engine.max_num_batched_tokens
            )
        drafter = MedusaDrafter if kind == "medusa" else MtpDrafter
        return drafter(ctx.target, heads, cfg.num_heads, shape)

    return build


def _layer_skip(ctx: DrafterContext) -> Drafter:
    """--draft names a layer choice (JSON from `specdecode select-layers`); else the one shipped for the target.
    No choice: a clear error naming the command (calibrating silently would cost minutes at start-up)."""
    path = Path(ctx.spec.draft) if ctx.spec.draft else ASSETS / "layer_skip" / f"{ctx.target_name}.json"
    if not path.is_file():
        raise ConfigError(
            f"method 'layer_skip' needs a layer choice: run `specdecode select-layers --target {ctx.target_name}"
            " --out F` and pass --draft F"
        )
    choice = LayerSkipChoice.load(path, ctx.target.cfg.num_layers)
    return LayerSkipDrafter(ctx.target, choice.layer_ids, choice.load_vocab_subset(path, ctx.target.cfg.vocab_size))


def _suffix(tree: bool):
    def build(ctx: DrafterContext) -> Drafter:
        return SuffixDrafter.from_config(ctx.spec, ctx.target.cfg.vocab_size, tree, ctx.engine.device)

    return build


DRAFTERS = {
    "draft": _draft_model,
    "ngram": lambda ctx: NgramDrafter(ctx.spec.ngram_min, ctx.spec.ngram_max, ctx.engine.device),
    "ngram_tree": lambda ctx: NgramTreeDrafter(ctx.spec.ngram_min, ctx.spec.ngram_max, ctx.engine.device),
    "suffix": _suffix(tree=False),
    "suffix_tree": _suffix(tree=True),
    "self": lambda ctx: self_drafter(
        ctx.target, ctx.engine.max_num_seqs, ctx.max_len, ctx.engine.max_num_batched_tokens
    ),
    "eagle": _head_drafter("eagle"),
    "medusa": _head_drafter("medusa"),
    "mtp": _head_drafter("mtp"),
    "layer_skip": _layer_skip,
    "none": lambda ctx: NoDrafter(ctx.engine.device),
}


def make_drafter(ctx: DrafterContext) -> Drafter:
    return DRAFTERS[ctx.spec.method](ctx)


__all__ = ["DRAFTERS", "Drafter", "DrafterContext", "Proposal", "make_drafter"]
