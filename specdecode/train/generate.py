"""`specdecode distill generate`: distillation data from the target's own responses, produced with the engine.

Each prompt is chat-formatted and answered by the target; a deterministic share of prompts is sampled at
temperature 1.0 (with a per-prompt seed), the rest decoded greedily. Speculation (default: n-gram) only speeds
this up: verification is lossless, so the responses are the target's. Results are flushed to OUT.partial.npz
after every chunk of prompts; rerunning the same command resumes where it stopped.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from specdecode.config import ConfigError, SamplingParams, llm_settings
from specdecode.prompts import PromptError, parse_prompt, read_jsonl_objects
from specdecode.train.config import GenerateConfig
from specdecode.train.responses import MAX_VOCAB, Responses, Sample

PromptItem = str | list[int]  # text to chat-format, or token ids used as they are


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

    room = cfg.max_prompt_tokens + cfg.max_tokens
    llm = LLM(cfg.target, max_num_seqs=cfg.batch_size, max_model_len=room, **llm_settings(cfg))
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
