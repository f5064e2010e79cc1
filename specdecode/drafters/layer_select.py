"""Which layers the layer-skip drafter keeps, chosen on the target's own outputs (after SWIFT).

Teacher-forced over calibration answers, the full model's argmax is the reference. A candidate layer set is
scored under the conditions the drafter meets: every position's query runs through the kept layers only, but
attends to the full model's K/V for the context (the engine's cache) and to its own K/V for itself. One
forward scores all positions at once (a custom mask over [full context | own token]), so a score costs one
partial forward. The search: each middle layer is scored alone; then layers are dropped greedily, each round
trying the `candidates` best-ranked remaining layers and dropping the one that keeps the highest agreement.
With an agreement a and a draft cost c (kept layers plus the draft's LM head, as a fraction of a full step,
counted in weights read) the estimated speedup is max_K (1 + a + ... + a^K) / (1 + K c + VERIFY_SLOPE K)
(every draft position assumed accepted at the first draft's rate a); without `num_skip` the number of skipped
layers (at least one) that maximises it wins. The first and last layer are always kept.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import torch
from tqdm import tqdm

from specdecode.config import ConfigError
from specdecode.drafters.subset_head import load_subset
from specdecode.models.llama import AttentionMetadata, LlamaModel

VERIFY_SLOPE = 0.03  # verifying K + 1 tokens costs ~1 + 0.03 K plain steps at batch 1 on CPU (measured, 9 wide 1.27x)


@dataclass
class LayerSkipChoice:
    layer_ids: list[int]  # the layers the draft runs, in order
    agreement: float  # top-1 agreement with the full model on the calibration tokens (drafting conditions)
    estimated_speedup: float
    vocab_subset: str | None = None  # a .npy of token ids next to the JSON: the draft's LM head rows
    curve: list[dict] = field(default_factory=list)  # per round: skipped layers, agreement, estimated speedup
    num_tokens: int = 0
    date: str = ""
    command: str = ""

    def save(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(asdict(self), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path, num_layers: int) -> LayerSkipChoice:
        try:
            choice = cls(**json.loads(Path(path).read_text()))
        except (OSError, ValueError, TypeError) as e:
            raise ConfigError(f"{path}: not a layer-skip choice ({e})") from None
        if not choice.layer_ids or not all(0 <= i < num_layers for i in choice.layer_ids):
            raise ConfigError(f"{path}: layer ids must lie in 0..{num_layers - 1}")
        return choice

    def load_vocab_subset(self, path: str | Path, vocab_size: int) -> torch.Tensor | None:
        """[S] int64 token ids, from the .npy named in the choice (relative to the choice's JSON `path`)."""
        return None if self.vocab_subset is None else load_subset(Path(path).parent / self.vocab_subset, vocab_size)


def estimated_speedup(agreement: float, cost: float, k_max: int = 8) -> float:
    """Best over K of expected tokens per step over the step's cost (in plain steps), at acceptance `agreement`."""
    best = 1.0
    for k in range(1, k_max + 1):
        tokens = sum(agreement**j for j in range(k + 1))
        best = max(best, tokens / (k * cost + 1.0 + VERIFY_SLOPE * k))
    return best


def draft_cost(target: LlamaModel, num_kept: int, head_rows: int | None = None) -> float:
    """A draft token's cost as a fraction of a full step: weights read (kept layers + draft head) over all."""
    cfg = target.cfg
    per_layer = _layer_params(cfg)
    head = cfg.vocab_size * cfg.hidden_size
    draft_head = (head_rows or cfg.vocab_size) * cfg.hidden_size
    return (num_kept * per_layer + draft_head) / (cfg.num_layers * per_layer + head)


def _layer_params(cfg) -> int:
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    return cfg.hidden_size * (q + 2 * kv) + q * cfg.hidden_size + 3 * cfg.hidden_size * cfg.intermediate_size


@dataclass
class _DraftingMetadata(AttentionMetadata):
    """Metadata whose mask is given: each query sees the full model's context K/V and its own K/V only."""

    mask: torch.Tensor | None = None  # [B, 1, T, 2T] bool

    def attention_mask(self, num_tokens: int) -> torch.Tensor | None:
        return self.mask


class AgreementProbe:
    """Scores layer sets on fixed calibration sequences. The full model fills cache positions 0..T-1 once; a
    layer set then reruns only the counted tokens (W per row, from each row's start) at cache positions
    T..T+W-1 with their true RoPE positions, query i attending to the full keys before it and to its own key:
    exactly the first draft's view in the engine."""

    def __init__(self, target: LlamaModel, seqs: list[list[int]], starts: list[int], subset: torch.Tensor) -> None:
        self.target, self.subset = target, subset  # subset: [S] token ids the draft's head scores
        self.head = target.lm_head_weight()[subset]  # [S, hidden]
        b, t = len(seqs), max(map(len, seqs))
        w = max(len(s) - st for s, st in zip(seqs, starts, strict=True))
        device = target.device
        ids = torch.tensor([s + [0] * (t - len(s)) for s in seqs], dtype=torch.long, device=device)  # [B, T]
        self.cache = target.new_cache(b, t + w)
        full = AttentionMetadata.build(list(range(b)), [0] * b, t, device)
        none = torch.zeros((b, 0), dtype=torch.long, device=device)  # skip the LM head: the probe scores hidden
        hidden = target(ids, full, self.cache, none, return_hidden=True)[1]  # [B, T, hidden]
        start = torch.tensor(starts, device=device)[:, None]  # [B, 1]
        positions = start + torch.arange(w, device=device)  # [B, W] absolute positions of the counted tokens
        self.counted = positions < torch.tensor([len(s) for s in seqs], device=device)[:, None]  # [B, W]
        positions = positions.clamp(max=t - 1)
        self.tokens = torch.gather(ids, 1, positions)  # [B, W]
        picked = torch.gather(hidden, 1, positions[..., None].expand(-1, -1, hidden.shape[-1]))  # [B, W, hidden]
        self.reference = (picked[self.counted] @ target.lm_head_weight().T).argmax(-1)  # [N] full model's argmax
        context = torch.arange(t, device=device)[None, None] < positions[..., None]  # [B, W, T] keys before i
        own = torch.eye(w, dtype=torch.bool, device=device).expand(b, w, w)  # [B, W, W]
        self.meta = _DraftingMetadata(
            slots=full.slots,
            start=torch.full((b,), t, device=device),
            positions=positions,
            kv_len=t + w,
            write_pos=t + torch.arange(w, device=device).expand(b, w),
            mask=torch.cat((context, own), dim=2)[:, None],  # [B, 1, W, T + W]
        )

    @property
    def num_tokens(self) -> int:
        return int(self.counted.sum())

    @torch.inference_mode()
    def agreement(self, layer_ids: list[int]) -> float:
        none = torch.zeros((self.tokens.shape[0], 0), dtype=torch.long, device=self.tokens.device)
        _, hidden = self.target(self.tokens, self.meta, self.cache, none, return_hidden=True, layer_ids=layer_ids)
        ids = (hidden[self.counted] @ self.head.T).argmax(-1)  # [N] indices into the head's rows
        return float((self.subset[ids] == self.reference).float().mean())


@torch.inference_mode()
def select_layers(
    target: LlamaModel,
    seqs: list[list[int]],
    starts: list[int] | None = None,
    num_skip: int | None = None,
    vocab_subset: torch.Tensor | None = None,
    candidates: int = 3,
    min_kept: int = 4,
    patience: int = 3,
    progress: bool = True,
    command: str = "",
) -> LayerSkipChoice:
    """seqs: token sequences; starts[b]: the first position of b whose next-token agreement counts (default 0).
    num_skip: skip exactly that many layers; None: as many as maximise the estimated speedup, searching until
    `patience` rounds in a row fail to improve it."""
    n = target.cfg.num_layers
    if n < 3:
        raise ConfigError(f"layer skipping needs at least 3 layers, the target has {n}")
    max_skip = n - max(min_kept, 2)
    if num_skip is not None and not 1 <= num_skip <= n - 2:
        raise ConfigError(f"--num-skip must be in 1..{n - 2} (the first and last layer stay), got {num_skip}")
    rounds = num_skip if num_skip is not None else max_skip
    device = target.device
    subset = (torch.arange(target.cfg.vocab_size) if vocab_subset is None else vocab_subset).to(device)
    probe = AgreementProbe(target, seqs, starts or [0] * len(seqs), subset)
    cost = lambda kept: draft_cost(target, kept, None if vocab_subset is None else len(subset))  # noqa: E731

    middle = list(range(1, n - 1))
    bar = tqdm(total=len(middle) + rounds * candidates, desc="select layers", disable=not progress)
    alone = {}
    for layer in middle:
        alone[layer] = probe.agreement([i for i in range(n) if i != layer])
        bar.update()
    skipped: list[int] = []
    a = probe.agreement(list(range(n)))  # below 1 only through the vocabulary subset
    curve = [{"skipped": [], "agreement": a, "estimated_speedup": estimated_speedup(a, cost(n))}]
    for _ in range(rounds):
        best_round = max(range(len(curve)), key=lambda r: curve[r]["estimated_speedup"])
        if num_skip is None and len(curve) - 1 - best_round >= patience:
            break  # agreement only falls from here: more skipping will not pay
        remaining = sorted((i for i in middle if i not in skipped), key=lambda i: -alone[i])[:candidates]
        scores = {
            i: alone[i] if not skipped else probe.agreement([j for j in range(n) if j not in {*skipped, i}])
            for i in remaining
        }
        bar.update(candidates if skipped else 0)
        drop = max(remaining, key=lambda i: scores[i])
        skipped.append(drop)
        a = scores[drop]
        speed = estimated_speedup(a, cost(n - len(skipped)))
        curve.append({"skipped": sorted(skipped), "agreement": a, "estimated_speedup": speed})
        bar.set_postfix(kept=n - len(skipped), agreement=f"{a:.3f}", speedup=f"{speed:.2f}")
    # num_skip given: the last round; else the best estimate (ties, e.g. every round at 1.0, to fewer skips)
    pick = curve[-1] if num_skip is not None else max(curve[1:], key=lambda c: c["estimated_speedup"])
    bar.close()
    kept = [i for i in range(n) if i not in pick["skipped"]]
    return LayerSkipChoice(
        kept,
        pick["agreement"],
        pick["estimated_speedup"],
        None,
        curve,
        probe.num_tokens,
        datetime.now(UTC).isoformat(timespec="seconds"),
        command,
    )
