"""What changes a row's logits before temperature: logit_bias, penalties and a grammar's token mask.

Speculation stays exact under all of them because every position sees the history plain decoding would see
there. The target's logits at verify position j continue the committed tokens *and the drafts on j's path*
(d_1..d_j of a chain, j's ancestors in a tree): the penalties count those drafts and the grammar advances
through them. A path that leaves the grammar cannot be accepted (its first bad token has probability 0 at its
parent), so what lies below it is never reached; its mask is left open rather than empty, so no row turns NaN.

Drafters that sample their own q (draft model, layer skip) apply the same adjustments to q with their drafted
prefix. Exactness does not need it (rejection sampling is exact for whatever q the drafts were drawn from), but
it keeps q close to p, and acceptance with it.

Order, as vLLM v1: logit_bias, then the repetition, frequency and presence penalties, then the grammar mask.
Presence and frequency count output tokens; repetition counts prompt and output tokens (vLLM's semantics).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from specdecode.config import SamplingParams

PAD = -1  # = sampling.PAD_TOKEN_ID: a path's unused places


class TokenMasker(Protocol):
    """A request's grammar state (specdecode/grammar.py): which tokens may follow each path from here."""

    def allowed(self, paths: list[list[int]]) -> tuple[torch.Tensor, list[bool]]: ...


def chain_paths(drafts: torch.Tensor) -> torch.Tensor:
    """drafts [num_seqs, k] -> [num_seqs, k + 1, k]: position j's path is d_1..d_j (PAD after)."""
    k = drafts.shape[1]
    before = torch.arange(k, device=drafts.device)[None] < torch.arange(k + 1, device=drafts.device)[:, None]
    return torch.where(before[None], drafts[:, None, :], PAD)  # [num_seqs, k + 1, k]


def tree_paths(drafts: torch.Tensor, ancestors: torch.Tensor) -> torch.Tensor:
    """drafts [num_seqs, N], ancestor-or-self mask [num_seqs, N + 1, N + 1] -> [num_seqs, N + 1, N].

    Parents precede children (tree.py), so index order along a path is root-to-node order.
    """
    return torch.where(ancestors[:, :, 1:], drafts[:, None, :], PAD)


def _dense(rows: list[list[int]], vocab: int, device: torch.device) -> torch.Tensor:
    """Token counts [num_rows, vocab] float32 of each row's token list."""
    width = max((len(r) for r in rows), default=0)
    ids = torch.full((len(rows), max(width, 1)), PAD, dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, : len(r)] = torch.tensor(r, dtype=torch.long)
    ids = ids.to(device)
    counts = torch.zeros((len(rows), vocab), device=device)
    return counts.scatter_add_(1, ids.clamp(min=0), (ids >= 0).float())


@dataclass
class LogitAdjuster:
    """A step's adjustments for its batch; built once per step, applied to the target's and a drafter's logits."""

    presence: torch.Tensor  # [num_seqs, 1, 1]
    frequency: torch.Tensor  # [num_seqs, 1, 1]
    repetition: torch.Tensor  # [num_seqs, 1, 1], 1 = off
    counts: torch.Tensor | None  # [num_seqs, vocab] float32 output-token counts (None: no presence/frequency)
    prompt_seen: torch.Tensor | None  # [num_seqs, vocab] bool prompt tokens (None: no repetition penalty)
    bias: torch.Tensor | None  # [num_seqs, vocab] float32
    grammars: list[TokenMasker | None]

    @classmethod
    def build(
        cls,
        params: list[SamplingParams],
        prompts: list[list[int]],
        outputs: list[list[int]],
        grammars: list[TokenMasker | None],
        vocab: int,
        device: torch.device | str,
    ) -> LogitAdjuster | None:
        """None when no row adjusts anything: the common case costs nothing."""
        if not any(p.adjusts_logits for p in params):
            return None
        device = torch.device(device)

        def column(name: str) -> torch.Tensor:
            return torch.tensor([getattr(p, name) for p in params], device=device)[:, None, None]

        presence, frequency, repetition = (
            column("presence_penalty"),
            column("frequency_penalty"),
            column("repetition_penalty"),
        )
        counting = any(p.presence_penalty or p.frequency_penalty or p.repetition_penalty != 1.0 for p in params)
        repeating = any(p.repetition_penalty != 1.0 for p in params)
        bias = None
        if any(p.logit_bias for p in params):
            bias = torch.zeros((len(params), vocab), device=device)
            for b, p in enumerate(params):
                for token, value in (p.logit_bias or {}).items():
                    bias[b, token] = value
        return cls(
            presence.float(),
            frequency.float(),
            repetition.float(),
            _dense(outputs, vocab, device) if counting else None,
            _dense(prompts, vocab, device) > 0 if repeating else None,
            bias,
            list(grammars),
        )

    def grammar_masks(self, paths: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
        """paths [num_seqs, n, m] -> allowed [num_seqs, n, vocab] bool (None: no grammar in the batch) and
        valid [num_seqs, n] bool (the path itself stays in the grammar). One host read of the paths."""
        num_seqs, n, _ = paths.shape
        valid = torch.ones((num_seqs, n), dtype=torch.bool)
        if not any(self.grammars):
            return None, valid.to(paths.device)
        rows = paths.tolist()
        masks = []
        for b, grammar in enumerate(self.grammars):
            if grammar is None:
                masks.append(None)
                continue
            allowed, ok = grammar.allowed([[t for t in path if t != PAD] for path in rows[b]])  # [n, vocab]
            allowed[~torch.tensor(ok)] = True  # below a token that left the grammar: never reached, left open
            valid[b] = torch.tensor(ok)
            masks.append(allowed)
        vocab = next(m for m in masks if m is not None).shape[-1]
        full = torch.ones((num_seqs, n, vocab), dtype=torch.bool)
        for b, m in enumerate(masks):
            if m is not None:
                full[b] = m
        return full.to(paths.device), valid.to(paths.device)

    def __call__(self, logits: torch.Tensor, paths: torch.Tensor, allowed: torch.Tensor | None = None) -> torch.Tensor:
        """logits [num_seqs, n, vocab] at positions whose paths beyond the committed tokens are paths
        [num_seqs, n, m] (PAD-padded) -> adjusted float32 logits. allowed: the grammar masks of these paths
        when the caller has them already (grammar_masks), else they are computed here."""
        logits = logits.float()
        if self.bias is not None:
            logits = logits + self.bias[:, None, :]
        if self.counts is not None or self.prompt_seen is not None:
            logits = self._penalise(logits, paths)
        if allowed is None and any(self.grammars):
            allowed = self.grammar_masks(paths)[0]
        if allowed is not None:
            logits = logits.masked_fill(~allowed, float("-inf"))
        return logits

    def _penalise(self, logits: torch.Tensor, paths: torch.Tensor) -> torch.Tensor:
        num_seqs, n, vocab = logits.shape
        drafted = torch.zeros((num_seqs, n, vocab), device=logits.device)  # path tokens, counted per position
        drafted.scatter_add_(-1, paths.clamp(min=0), (paths >= 0).float())
        counts = drafted if self.counts is None else self.counts[:, None, :] + drafted  # [num_seqs, n, vocab]
        if self.prompt_seen is not None:
            seen = (counts > 0) | self.prompt_seen[:, None, :]  # [num_seqs, n, vocab]
            scaled = torch.where(logits > 0, logits / self.repetition, logits * self.repetition)
            logits = torch.where(seen, scaled, logits)
        return logits - self.frequency * counts - self.presence * (counts > 0).float()
