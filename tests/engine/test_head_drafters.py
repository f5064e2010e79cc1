"""EAGLE, Medusa and MTP drafters (random heads) through the engine: greedy output equals plain greedy output,
chain-deep and tree-wide, at batch 1 and 4; sampling runs; bad head directories are clear errors."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from specdecode import LLM, SamplingParams
from specdecode.config import ConfigError
from specdecode.heads import HeadConfig, build_heads, save_heads
from specdecode.models.llama import load_llama

GREEDY = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
PROMPTS = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [11, 12, 13], [20, 21, 22, 23, 24, 25, 26], [3]]


def write_heads(out, target_dir, kind: str, num_heads: int, seed: int = 0):
    target = load_llama(target_dir, inference=False)
    cfg = HeadConfig(kind, num_heads, target.cfg)
    torch.manual_seed(seed)
    heads = build_heads(cfg)
    with torch.no_grad():  # untrained but not silent: random perturbations of the zero/identity start
        for p in heads.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return save_heads(heads, cfg, out, {"note": "random test heads"})


@pytest.fixture(scope="module")
def heads(tmp_path_factory, tiny_target):
    root = tmp_path_factory.mktemp("heads")
    return {kind: write_heads(root / kind, tiny_target, kind, 3) for kind in ("eagle", "medusa", "mtp")}


@pytest.fixture(scope="module")
def reference(tiny_target) -> list[list[int]]:
    llm = LLM(target=str(tiny_target), method="none", max_num_seqs=1)
    return [llm.generate([p], GREEDY)[0].token_ids for p in PROMPTS]


@pytest.mark.parametrize("kind", ["eagle", "medusa", "mtp"])
@pytest.mark.parametrize(("k", "batch"), [(1, 1), (6, 1), (12, 4)])
def test_heads_greedy_equals_plain_greedy(kind, k, batch, heads, tiny_target, reference):
    llm = LLM(
        target=str(tiny_target),
        draft=str(heads[kind]),
        method=kind,
        num_speculative_tokens=k,
        controller="fixed",
        max_num_seqs=batch,
    )
    outs = llm.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == reference
    assert sum(o.metrics["num_drafted"] for o in outs) > 0


@pytest.mark.parametrize("kind", ["eagle", "medusa", "mtp"])
def test_heads_sample_under_goodput(kind, heads, tiny_target):
    llm = LLM(target=str(tiny_target), draft=str(heads[kind]), method=kind, num_speculative_tokens=8, max_num_seqs=4)
    params = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=20, seed=1, ignore_eos=True)
    first = [o.token_ids for o in llm.generate(PROMPTS, params)]
    assert all(len(t) == 20 for t in first)


def test_heads_for_another_target_are_rejected(tmp_path, heads, tiny_draft):
    with pytest.raises(ConfigError, match="trained for a target"):
        LLM(target=str(tiny_draft), draft=str(heads["medusa"]), method="medusa")


def test_bad_head_directories(tmp_path, tiny_target, heads):
    with pytest.raises(ConfigError, match="not a head directory"):
        LLM(target=str(tiny_target), draft=str(tmp_path), method="eagle")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "head.json").write_text(json.dumps({"config": {"kind": "medusa"}}))
    (broken / "heads.safetensors").write_bytes((heads["medusa"] / "heads.safetensors").read_bytes())
    with pytest.raises(ConfigError, match="unreadable head config"):
        LLM(target=str(tiny_target), draft=str(broken), method="medusa")
    with pytest.raises(ConfigError, match="needs trained heads"):
        LLM(target=str(tiny_target), method="mtp")


def _with_vocab(tmp_path, heads_dir, ids: np.ndarray):
    out = tmp_path / "eagle_subset"
    shutil.copytree(heads_dir, out)
    np.save(out / "vocab.npy", ids)
    return out


def test_eagle_vocab_subset_is_lossless_and_restricts_candidates(tmp_path, heads, tiny_target, reference):
    vocab = load_llama(tiny_target).cfg.vocab_size
    subset = np.arange(0, vocab, 2)  # even token ids only
    path = _with_vocab(tmp_path, heads["eagle"], subset)
    llm = LLM(target=str(tiny_target), draft=str(path), method="eagle", num_speculative_tokens=6, max_num_seqs=4)
    outs = llm.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == reference
    drafter = llm.engine.drafter
    logp = drafter._logp(torch.randn(3, drafter.target.cfg.hidden_size))  # [3, vocab]
    assert torch.isinf(logp[:, 1::2]).all() and torch.isfinite(logp[:, ::2]).all()


def test_eagle_bad_vocab_subset(tmp_path, heads, tiny_target):
    vocab = load_llama(tiny_target).cfg.vocab_size
    path = _with_vocab(tmp_path, heads["eagle"], np.array([0, vocab]))
    with pytest.raises(ConfigError, match="vocabulary subset"):
        LLM(target=str(tiny_target), draft=str(path), method="eagle")
