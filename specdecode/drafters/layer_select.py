"""Which layers the layer-skip drafter keeps, chosen on the target's own outputs (after SWIFT).

Teacher-forced over calibration answers, the full model's argmax is the reference (on the answer positions it
is the answer itself). Each middle layer is scored once by the agreement that remains when it alone is
skipped; then the r least important layers are skipped together, for every r, and the agreement a and the
draft cost c (kept layers plus the LM head, as a fraction of a full step) give an estimated speedup
max_K E[tokens | a, K] / (K c + verify(K)). The r that maximises it wins (ties, such as
every r estimated at 1.0 because none pays, go to the best agreement per kept layer). A one-shot ranking, not SWIFT's
Bayesian search: ~2n forwards instead of hundreds. Agreement is measured with the skipped model's own K/V
for the context while drafting reads the full model's, so the engine's measured acceptance is the real test.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from specdecode.config import ConfigError
from specdecode.models.llama import AttentionMetadata, LlamaModel

VERIFY_SLOPE = 0.03  # verifying K + 1 tokens costs ~1 + 0.03 K plain steps at batch 1 on CPU (measured, 9 wide 1.27x)


@dataclass
class LayerChoice:
    layer_ids: list[int]  # the layers the draft runs, in order
    agreement: float  # top-1 agreement with the full model on the calibration tokens
    estimated_speedup: float
    curve: list[dict] = field(default_factory=list)  # per round: skipped layers, agreement, estimated speedup
    num_tokens: int = 0
    date: str = ""
    command: str = ""

    def save(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(asdict(self), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path, num_layers: int) -> LayerChoice:
        try:
            data = json.loads(Path(path).read_text())
            choice = cls(**data)
        except (OSError, ValueError, TypeError) as e:
            raise ConfigError(f"{path}: not a layer-skip choice ({e})") from None
        if not choice.layer_ids or not all(0 <= i < num_layers for i in choice.layer_ids):
            raise ConfigError(f"{path}: layer ids must lie in 0..{num_layers - 1}")
        return choice


def estimated_speedup(agreement: float, cost: float, k_max: int = 8) -> float:
    """Best over K of expected tokens per step over the step's cost (in plain steps), at acceptance `agreement`."""
    best = 1.0
    for k in range(1, k_max + 1):
        tokens = sum(agreement**j for j in range(k + 1))
        best = max(best, tokens / (k * cost + 1.0 + VERIFY_SLOPE * k))
    return best


def draft_cost(target: LlamaModel, num_kept: int) -> float:
    """A draft token's cost as a fraction of a full step: weights read (kept layers + LM head) over all weights."""
    cfg = target.cfg
    per_layer = _layer_params(cfg)
    head = cfg.vocab_size * cfg.hidden_size
    return (num_kept * per_layer + head) / (cfg.num_layers * per_layer + head)


def _layer_params(cfg) -> int:
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    return cfg.hidden_size * (q + 2 * kv) + q * cfg.hidden_size + 3 * cfg.hidden_size * cfg.intermediate_size


@torch.inference_mode()
def _argmax(target: LlamaModel, seqs: list[list[int]], layer_ids: list[int] | None) -> torch.Tensor:
    """Teacher-forced argmax [B, T] of every sequence, in one right-padded batch."""
    width = max(map(len, seqs))
    device = target.embed.weight.device
    ids = torch.tensor([s + [0] * (width - len(s)) for s in seqs], dtype=torch.long, device=device)  # [B, T]
    meta = AttentionMetadata.build(list(range(len(seqs))), [0] * len(seqs), width, device)
    return target(ids, meta, target.new_cache(len(seqs), width), layer_ids=layer_ids).argmax(-1)


def select_layers(
    target: LlamaModel,
    seqs: list[list[int]],
    starts: list[int] | None = None,
    min_kept: int = 4,
    progress: bool = True,
    command: str = "",
) -> LayerChoice:
    """seqs: token sequences; starts[b]: the first position of b whose next-token agreement counts (default 0)."""
    n = target.cfg.num_layers
    if n < 3:
        raise ConfigError(f"layer skipping needs at least 3 layers, the target has {n}")
    width = max(map(len, seqs))
    pos = torch.arange(width)[None]  # [1, T]
    lo = torch.tensor(starts or [0] * len(seqs))[:, None]
    hi = torch.tensor([len(s) for s in seqs])[:, None]
    counted = ((pos >= lo) & (pos < hi)).to(target.embed.weight.device)  # [B, T]
    reference = _argmax(target, seqs, None)

    def agreement(layer_ids: list[int]) -> float:
        return float((_argmax(target, seqs, layer_ids) == reference)[counted].float().mean())

    middle = list(range(1, n - 1))
    bar = tqdm(total=len(middle) + n - max(min_kept, 2), desc="select layers", disable=not progress)
    alone = {}
    for layer in middle:
        alone[layer] = agreement([i for i in range(n) if i != layer])
        bar.update()
    order = sorted(middle, key=lambda i: -alone[i])  # least important first
    curve = [{"skipped": [], "agreement": 1.0, "estimated_speedup": 1.0}]
    best: LayerChoice | None = None  # skipping nothing is no drafter: the best r >= 1, even if it loses
    for r in range(1, n - max(min_kept, 2) + 1):
        skipped = set(order[:r])
        kept = [i for i in range(n) if i not in skipped]
        a = agreement(kept)
        speed = estimated_speedup(a, draft_cost(target, len(kept)))
        curve.append({"skipped": sorted(skipped), "agreement": a, "estimated_speedup": speed})
        bar.update()
        bar.set_postfix(kept=len(kept), agreement=f"{a:.3f}", speedup=f"{speed:.2f}")
        if best is None or (speed, a / len(kept)) > (best.estimated_speedup, best.agreement / len(best.layer_ids)):
            best = LayerChoice(kept, a, speed)
    bar.close()
    assert best is not None
    best.curve = curve
    best.num_tokens = int(counted.sum())
    best.date = datetime.now(UTC).isoformat(timespec="seconds")
    best.command = command
    return best


def frequent_tokens(token_arrays: list[np.ndarray], size: int) -> torch.Tensor:
    """[size] the most frequent token ids (a draft vocabulary subset), sorted by id."""
    counts = np.bincount(np.concatenate(token_arrays).astype(np.int64))
    top = np.argsort(-counts, kind="stable")[:size]
    return torch.from_numpy(np.sort(top))


# Calibration instructions written for this purpose (never Spec-Bench prompts, which are for evaluation only).
CALIBRATION_PROMPTS = (
    "Explain how a refrigerator keeps food cold.",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "List five tips for learning a new programming language.",
    "What are the main differences between a virus and a bacterium?",
    "Summarize the water cycle in a few sentences.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Give me a recipe for a simple vegetable soup.",
    "Why do leaves change color in autumn?",
)


def calibration_sequences(target_name: str, device: str, max_tokens: int = 64):
    """(target, prompt + answer token lists, where each answer starts) for the target's own greedy answers to
    CALIBRATION_PROMPTS (chat template applied)."""
    from specdecode.config import SamplingParams
    from specdecode.llm import LLM  # the engine imports the drafters: import it only when calibrating

    llm = LLM(target=target_name, method="none", device=device, max_num_seqs=len(CALIBRATION_PROMPTS))
    outs = llm.chat(
        [[{"role": "user", "content": p}] for p in CALIBRATION_PROMPTS], SamplingParams(max_tokens=max_tokens)
    )
    return llm.target, [o.prompt_token_ids + o.token_ids for o in outs], [len(o.prompt_token_ids) - 1 for o in outs]


def run_select(target_name: str, out: str | Path, device: str = "cpu", min_kept: int = 8, command: str = "") -> None:
    target, seqs, starts = calibration_sequences(target_name, device)
    choice = select_layers(target, seqs, starts, min_kept=min_kept, command=command)
    choice.save(out)
    skipped = sorted(set(range(target.cfg.num_layers)) - set(choice.layer_ids))
    print(
        f"keep {len(choice.layer_ids)} of {target.cfg.num_layers} layers (skip {skipped}): agreement "
        f"{choice.agreement:.3f}, estimated speedup {choice.estimated_speedup:.2f}x; written to {out}"
    )
