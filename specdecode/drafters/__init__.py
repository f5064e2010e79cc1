"""Drafters by method name. Each builder takes what the engine has and returns a `Drafter`."""

from __future__ import annotations

from dataclasses import dataclass

from specdecode.config import ConfigError, EngineConfig, SpeculativeConfig
from specdecode.drafters.base import Drafter, Proposal
from specdecode.drafters.draft_model import DraftModelDrafter
from specdecode.drafters.ngram import NgramDrafter
from specdecode.drafters.ngram_tree import NgramTreeDrafter
from specdecode.drafters.none import NoDrafter
from specdecode.drafters.self_draft import self_drafter
from specdecode.models.llama import LlamaModel


@dataclass
class DrafterContext:
    target: LlamaModel
    draft: LlamaModel | None
    spec: SpeculativeConfig
    engine: EngineConfig
    max_len: int


def _draft_model(ctx: DrafterContext) -> Drafter:
    if ctx.draft is None:
        raise ConfigError("method 'draft' needs a draft model (--draft)")
    return DraftModelDrafter(ctx.draft, ctx.engine.max_num_seqs, ctx.max_len, ctx.engine.prefill_chunk)


DRAFTERS = {
    "draft": _draft_model,
    "ngram": lambda ctx: NgramDrafter(ctx.spec.ngram_min, ctx.spec.ngram_max, ctx.engine.device),
    "ngram_tree": lambda ctx: NgramTreeDrafter(ctx.spec.ngram_min, ctx.spec.ngram_max, ctx.engine.device),
    "self": lambda ctx: self_drafter(ctx.target, ctx.engine.max_num_seqs, ctx.max_len, ctx.engine.prefill_chunk),
    "none": lambda ctx: NoDrafter(ctx.engine.device),
}


def make_drafter(ctx: DrafterContext) -> Drafter:
    return DRAFTERS[ctx.spec.method](ctx)


__all__ = ["DRAFTERS", "Drafter", "DrafterContext", "Proposal", "make_drafter"]
