"""`specdecode distill generate`: distillation data from the target's own responses, produced with the engine.

Each prompt is chat-formatted and answered by the target; a deterministic share of prompts is sampled at
temperature 1.0 (with a per-prompt seed), the rest decoded greedily. Speculation (default: n-gram) only speeds
this up: verification is lossless, so the responses are the target's. Results are flushed to OUT.partial.npz
after every chunk of prompts; rerunning the same command resumes where it stopped.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from specdecode.config import ConfigError, SamplingParams
from specdecode.prompts import PromptError, parse_prompt, read_jsonl_objects
from specdecode.train.responses import MAX_VOCAB, Responses, Sample

PromptItem = str | list[int]  # text to chat-format, or token ids used as they are
SETTINGS_KEYS = ("target", "prompts", "max_tokens", "sampled_fraction", "seed", "max_prompt_tokens")


@dataclass(frozen=True)
class GenerateConfig:
    prompts: str
    out: str
    target: str = "smollm2-135m-instruct"
    max_tokens: int = 400
    sampled_fraction: float = 0.4
    limit: int | None = None
    batch_size: int = 16
    chunk_size: int = 64
    method: str = "ngram"
    num_speculative_tokens: int = 4
    draft: str | None = None
    max_prompt_tokens: int = 1024
    device: str = "cpu"
    dtype: str = "float32"
    seed: int = 0
    overwrite: bool = False
    progress: bool = True

    def __post_init__(self) -> None:
        if "specbench" in Path(self.prompts).name.lower().replace("-", "").replace("_", ""):
            raise ConfigError(f"{self.prompts}: benchmark prompts are for evaluation only, never training data")
        if not self.out.endswith(".npz"):
            raise ConfigError(f"--out must name a .npz file, got {self.out}")
        if not 0.0 <= self.sampled_fraction <= 1.0:
            raise ConfigError(f"sampled fraction must be in [0, 1], got {self.sampled_fraction}")
        for name in ("max_tokens", "batch_size", "chunk_size", "max_prompt_tokens"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"limit must be >= 1, got {self.limit}")

    @property
    def partial(self) -> Path:
        return Path(self.out[: -len(".npz")] + ".partial.npz")

    def settings(self) -> str:
        return json.dumps({k: v for k, v in asdict(self).items() if k in SETTINGS_KEYS}, sort_keys=True)


def load_prompt_items(path: str | Path) -> list[PromptItem]:
    """`prompt` strings or Spec-Bench `turns` (chat-formatted later), or `prompt_ids` lists (used as they are)."""
    items: list[PromptItem] = []
    for obj, where in read_jsonl_objects(path):
        ids = obj.get("prompt_ids")
        if ids is None:
            items.append(parse_prompt(obj, where).text)
        elif isinstance(ids, list) and ids and all(isinstance(t, int) and t >= 0 for t in ids):
            items.append(ids)
        else:
            raise PromptError(f"{where}: 'prompt_ids' must be a non-empty list of token ids")
    if not items:
        raise PromptError(f"{path}: no prompts")
    return items


def sampled_mask(num_prompts: int, fraction: float, seed: int) -> np.ndarray:
    """[num_prompts] bool. Evenly spread with a seeded phase: every prefix of n prompts holds floor or ceil of
    n * fraction sampled ones, so --limit never changes which prompts are sampled."""
    phase = np.random.default_rng(seed).random()
    marks = np.floor(np.arange(num_prompts + 1) * fraction + phase)  # [num_prompts + 1]
    return np.diff(marks) > 0


def request_params(index: int, sampled: bool, cfg: GenerateConfig) -> SamplingParams:
    if not sampled:
        return SamplingParams(temperature=0.0, max_tokens=cfg.max_tokens)
    seed = int(np.random.SeedSequence([cfg.seed, index]).generate_state(1)[0])  # per prompt, order-independent
    return SamplingParams(temperature=1.0, max_tokens=cfg.max_tokens, seed=seed)


def encode_item(llm, item: PromptItem) -> list[int]:
    if isinstance(item, list):
        return item
    return llm.encode(llm.apply_chat_template([{"role": "user", "content": item}]))


def _start(cfg: GenerateConfig) -> Responses:
    """A fresh run, or the partial output of an interrupted one with the same settings."""
    if Path(cfg.out).exists() and not cfg.overwrite:
        raise ConfigError(f"{cfg.out} exists; pass --overwrite to replace it")
    if not cfg.partial.exists():
        return Responses(cfg.settings())
    responses = Responses.load(cfg.partial)
    if responses.settings != cfg.settings():
        raise ConfigError(f"{cfg.partial} was made with other settings ({responses.settings}); delete it or match them")
    return responses


def _make_llm(cfg: GenerateConfig):
    from specdecode.llm import LLM  # torch only once the settings are valid

    llm = LLM(
        target=cfg.target,
        draft=cfg.draft,
        method=cfg.method,
        num_speculative_tokens=cfg.num_speculative_tokens,
        max_num_seqs=cfg.batch_size,
        max_model_len=cfg.max_prompt_tokens + cfg.max_tokens,
        device=cfg.device,
        dtype=cfg.dtype,
    )
    vocab = max(llm.target.cfg.vocab_size, len(llm.tokenizer))
    if vocab > MAX_VOCAB:
        raise ConfigError(f"the target's vocabulary ({vocab}) does not fit the uint16 token ids of the data format")
    return llm


def run_chunk(llm, cfg: GenerateConfig, items: dict[int, PromptItem], mask: np.ndarray, out: Responses) -> None:
    """Answer the prompts `items` (prompt index -> prompt) in one engine call; record results in `out`."""
    max_prompt = min(cfg.max_prompt_tokens, llm.max_model_len - 1)
    todo: dict[int, list[int]] = {}
    for i, item in items.items():
        ids = encode_item(llm, item)
        if len(ids) > max_prompt:
            out.skipped.add(i)
        else:
            todo[i] = ids
    if not todo:
        return
    params = [request_params(i, bool(mask[i]), cfg) for i in todo]
    results = llm.generate(list(todo.values()), params)
    for (i, ids), res in zip(todo.items(), results, strict=True):
        out.samples[i] = Sample(ids, list(res.token_ids), bool(mask[i]))


@dataclass(frozen=True)
class GenerateResult:
    out: Path
    num_samples: int
    num_skipped: int
    num_response_tokens: int


def generate_data(cfg: GenerateConfig) -> GenerateResult:
    responses = _start(cfg)
    items = load_prompt_items(cfg.prompts)[: cfg.limit]
    mask = sampled_mask(len(items), cfg.sampled_fraction, cfg.seed)  # [num_prompts]
    responses.keep_below(len(items))  # a resumed run with a smaller --limit stores only its prompts
    pending = [i for i in range(len(items)) if i not in responses.done()]
    llm = _make_llm(cfg) if pending else None
    bar = tqdm(total=len(items), initial=len(items) - len(pending), desc="distill generate", disable=not cfg.progress)
    for lo in range(0, len(pending), cfg.chunk_size):
        chunk = pending[lo : lo + cfg.chunk_size]
        run_chunk(llm, cfg, {i: items[i] for i in chunk}, mask, responses)
        responses.save(cfg.partial)
        bar.update(len(chunk))
    bar.close()
    if not responses.samples:
        raise ConfigError(f"no prompt of {cfg.prompts} fits --max-prompt-tokens {cfg.max_prompt_tokens}")
    out = Path(cfg.out)
    responses.save(out)
    cfg.partial.unlink(missing_ok=True)
    tokens = sum(len(s.response_ids) for s in responses.samples.values())
    return GenerateResult(out, len(responses.samples), len(responses.skipped), tokens)
