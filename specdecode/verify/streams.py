"""Random draws for a batch of requests: a seeded request's draws are keyed by what they are for, not drawn in order.

A seeded request must give the same tokens alone or beside others, so its randomness cannot depend on the batch
(how many rows, how wide the drafts are padded). Each of its draws comes from a generator seeded with a hash of
(seed, purpose, key), where the key names the draw inside the request; unseeded rows share one batched draw
from the global RNG. Which key a purpose uses matters for exactness, not only for reproducibility:

- TARGET, the target's own sample of the token at absolute position t (the exponential race in verify.py), is
  keyed by t alone. So a seeded request decides every token from the same noise whatever K, batch or drafter.
  A step looks at the noise of positions past its first mismatch but never acts on it, so reusing it when the
  next step reaches those positions is still a fresh draw.
- ACCEPT, RECOVER and DRAFT (rejection sampling of sampled drafts) are keyed by the step's origin (the absolute
  position of its pending token) and an index within the step. Drafts past the first rejection are discarded,
  but a controller may have seen their confidences; the origin advances every step, so no draw is ever reused.
"""

from __future__ import annotations

from enum import IntEnum

import torch

from specdecode.verify.sampling import SamplingTensors

_MASK = (1 << 64) - 1
_TINY = torch.finfo(torch.float32).tiny  # uniforms are clamped here so Exp(1) noise stays finite (<= 87.3)


class Purpose(IntEnum):
    TARGET = 1  # the target's sample of the token at an absolute position; key: that position
    ACCEPT = 2  # acceptance uniforms of a step's sampled drafts; key: (origin, draft index)
    RECOVER = 3  # the recovered or bonus token of a rejection-sampled step; key: (origin, 0)
    DRAFT = 4  # a drafter's sample of draft j in a step; key: (origin, j)


def _mix(x: int) -> int:
    """splitmix64's finaliser: a bijection on 64-bit words that spreads every input bit over the output."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def stream_seed(seed: int, purpose: Purpose, *key: int) -> int:
    """The generator seed of one keyed draw: a 64-bit hash of (seed, purpose, key)."""
    h = _mix(seed & _MASK)
    for word in (int(purpose), *key):
        h = _mix(h ^ (word & _MASK))
    return h


def _key(purpose: Purpose, origin: int, j: int) -> tuple[int, ...]:
    # Column j of a step decides (or drafts) the token at origin + 1 + j.
    return (origin + 1 + j,) if purpose is Purpose.TARGET else (origin, j)


def uniforms(st: SamplingTensors, purpose: Purpose, columns: range, width: int = 1) -> torch.Tensor:
    """[num_seqs, len(columns), width] uniforms in [0, 1); seeded rows keyed per column (see `_key`)."""
    num_seqs = len(st.seeds)
    out = torch.empty((num_seqs, len(columns), width), device=st.device)
    unseeded = [b for b, s in enumerate(st.seeds) if s is None]
    if len(unseeded) == num_seqs:
        return out.uniform_()  # one batched draw from the global RNG
    if unseeded:
        out[unseeded] = torch.rand((len(unseeded), len(columns), width), device=st.device)
    gen = torch.Generator(device=st.device)
    for b, seed in enumerate(st.seeds):
        if seed is None:
            continue
        for c, j in enumerate(columns):
            gen.manual_seed(stream_seed(seed, purpose, *_key(purpose, st.origins[b], j)))
            out[b, c].uniform_(generator=gen)
    return out


def exponentials(st: SamplingTensors, purpose: Purpose, columns: range, width: int) -> torch.Tensor:
    """[num_seqs, len(columns), width] Exp(1) noise as -log(U), positive and finite (cheaper than exponential_)."""
    return uniforms(st, purpose, columns, width).clamp_(min=_TINY).log_().neg_()


def race(probs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """probs [..., vocab] (unnormalised is fine), noise [..., vocab] Exp(1) -> [...] token ids with P(v) ~ probs[v].

    The exponential race: argmax(probs / E) picks v with probability probs[v] / sum(probs), with no
    normalisation and no host sync. A one-hot probs row always picks its token (E is finite).
    """
    return (probs / noise).argmax(-1)


def sample(probs: torch.Tensor, st: SamplingTensors, purpose: Purpose, column: int = 0) -> torch.Tensor:
    """probs [num_seqs, vocab] -> token ids [num_seqs] int64, each row one draw of its stream's `column`."""
    return race(probs, exponentials(st, purpose, range(column, column + 1), probs.shape[-1])[:, 0])
