"""`specdecode distill generate`: the target's responses as training data, resumable, in the training format."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from specdecode.config import ConfigError, SamplingParams
from specdecode.llm import LLM
from specdecode.train.data import load_samples
from specdecode.train.generate import GenerateConfig, generate_data, load_prompt_items, sampled_mask
from tests.train.conftest import VOCAB

MAX_TOKENS = 6


def write_prompt_ids(path: Path, num_prompts: int, seed: int = 0) -> Path:
    """Token-id prompts: the tiny target's vocabulary (96) is too small for text through the real tokenizer."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(4, 10, num_prompts).tolist()
    lines = [json.dumps({"prompt_ids": rng.integers(3, VOCAB, n).tolist()}) for n in lengths]
    path.write_text("\n".join(lines) + "\n")
    return path


def config(tiny_target, tmp_path, num_prompts: int = 8, **kw) -> GenerateConfig:
    prompts = write_prompt_ids(tmp_path / "prompts.jsonl", num_prompts)
    kw = {"max_tokens": MAX_TOKENS, "sampled_fraction": 0.5, "batch_size": 4, "progress": False, **kw}
    return GenerateConfig(str(prompts), str(tmp_path / "out.npz"), target=str(tiny_target), **kw)


def test_output_loads_and_greedy_samples_are_the_targets(tiny_target, tmp_path):
    cfg = config(tiny_target, tmp_path)
    result = generate_data(cfg)
    assert result.num_samples == 8 and not cfg.partial.exists()
    samples = load_samples([result.out], VOCAB)
    with np.load(result.out) as d:
        sampled, index, dtype = d["sampled"], d["prompt_index"], d["tokens"].dtype
    assert dtype == np.uint16
    assert index.tolist() == list(range(8)) and sampled.sum() == 4  # the requested fraction
    reference = LLM(str(tiny_target), method="none", max_num_seqs=4)
    prompts = load_prompt_items(cfg.prompts)
    for i in np.flatnonzero(sampled == 0).tolist():
        seq = samples.tokens[samples.offsets[i] : samples.offsets[i + 1]].tolist()
        p = int(samples.prompt_len[i])
        assert seq[:p] == prompts[i]
        (want,) = reference.generate([prompts[i]], SamplingParams(max_tokens=MAX_TOKENS))
        assert seq[p:] == want.token_ids


def test_resume_after_interruption_skips_done_prompts(tiny_target, tmp_path, monkeypatch):
    cfg = config(tiny_target, tmp_path, chunk_size=4)
    calls: list[int] = []
    real = LLM.generate

    def counted(self, prompts, params=None, use_tqdm=False):
        calls.append(len(prompts))
        if calls == [4, 4]:  # the first run is stopped in its second chunk
            raise KeyboardInterrupt
        return real(self, prompts, params, use_tqdm)

    monkeypatch.setattr(LLM, "generate", counted)
    with pytest.raises(KeyboardInterrupt):
        generate_data(cfg)
    assert cfg.partial.exists() and not Path(cfg.out).exists()
    with np.load(cfg.partial) as d:
        assert d["prompt_index"].tolist() == [0, 1, 2, 3]
    calls.clear()
    result = generate_data(cfg)
    assert calls == [4]  # only the four prompts the first run did not finish
    assert not cfg.partial.exists()
    with np.load(result.out) as d:
        assert d["prompt_index"].tolist() == list(range(8)) and len(d["offsets"]) == 9


def test_limit_keeps_the_sampled_choice(tiny_target, tmp_path):
    mask = sampled_mask(100, 0.4, seed=3)
    assert mask.sum() == 40
    for n in range(1, 100):
        assert abs(mask[:n].sum() - 0.4 * n) < 1  # every prefix (any --limit) holds the requested share
    assert (sampled_mask(100, 0.4, seed=3) == mask).all() and not (sampled_mask(100, 0.4, seed=4) == mask).all()


def test_existing_output_needs_overwrite(tiny_target, tmp_path):
    cfg = config(tiny_target, tmp_path, num_prompts=2)
    Path(cfg.out).write_bytes(b"")
    with pytest.raises(ConfigError, match="--overwrite"):
        generate_data(cfg)


def test_benchmark_prompts_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="evaluation only"):
        GenerateConfig(str(tmp_path / "specbench_question.jsonl"), str(tmp_path / "out.npz"))


def test_long_prompts_are_skipped(tiny_target, tmp_path):
    cfg = config(tiny_target, tmp_path, max_prompt_tokens=5)
    lines = [json.dumps({"prompt_ids": list(range(3, 3 + n))}) for n in (4, 9, 5, 6)]
    Path(cfg.prompts).write_text("\n".join(lines))
    result = generate_data(cfg)
    with np.load(result.out) as d:
        assert d["prompt_index"].tolist() == [0, 2] and d["skipped"].tolist() == [1, 3]
    assert result.num_skipped == 2


def test_gzipped_text_prompts(tmp_path):
    path = tmp_path / "prompts.jsonl.gz"
    rows = [{"source": "x", "prompt": "Name a colour."}, {"question_id": 1, "turns": ["Add 2 and 2."]}]
    path.write_bytes(gzip.compress("\n".join(json.dumps(r) for r in rows).encode()))
    assert load_prompt_items(path) == ["Name a colour.", "Add 2 and 2."]
