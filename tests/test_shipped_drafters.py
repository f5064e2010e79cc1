"""The drafters shipped for the built-in target (the distilled draft model, the layer-skip choice, the EAGLE head)
work by name alone:
they load for `smollm2-135m-instruct`, share its vocabulary, draft tokens the target accepts, and greedy output
equals plain greedy output on the real model."""

from __future__ import annotations

import json

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from specdecode import LLM, SamplingParams
from specdecode.drafters import ASSETS
from specdecode.drafters.subset_head import VOCAB_FILE, SubsetLMHead, load_subset
from specdecode.heads.io import CONFIG_FILE, WEIGHTS_FILE
from specdecode.models.loader import resolve_model_dir
from specdecode.models.shipped_draft import DEFAULT_DRAFTS, DRAFT_ASSETS

TARGET = "smollm2-135m-instruct"
DRAFT = DEFAULT_DRAFTS[TARGET]
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a Python function that reverses a string."}],
]
GREEDY = SamplingParams(temperature=0.0, max_tokens=40)


@pytest.fixture(scope="module")
def plain() -> list[list[int]]:
    llm = LLM(target=TARGET, method="none", max_num_seqs=2)
    return [o.token_ids for o in llm.chat(CHATS, GREEDY)]


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
def test_shipped_head_files(kind):
    path = ASSETS / "heads" / TARGET / kind
    data = json.loads((path / CONFIG_FILE).read_text())
    assert data["config"]["kind"] == kind and data["config"]["target"]["vocab_size"] == 49152
    manifest = data["manifest"]
    assert manifest["command"].startswith(f"specdecode distill --head {kind}") and manifest["tokens_seen"] > 0
    assert (path / WEIGHTS_FILE).stat().st_size < 25_000_000
    assert not (path / "checkpoint").exists()  # optimizer state is not shipped
    if kind == "eagle":
        assert len(load_subset(path / VOCAB_FILE, 49152)) == 16384  # the cheap drafting head's tokens


def test_shipped_draft_files():
    path = DRAFT_ASSETS / DRAFT
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["command"].startswith("specdecode distill") and manifest["tokens_seen"] > 0
    assert manifest["eval"]["accuracy"] > 0.2 and manifest["date"] and manifest["data"]  # held-out agreement
    assert sum(f.stat().st_size for f in path.iterdir()) < 25_000_000
    assert not (path / "checkpoint").exists()  # optimizer state is not shipped
    assert len(load_subset(path / VOCAB_FILE, 49152)) == manifest["draft_vocab"]


def test_shipped_draft_is_the_default_and_shares_the_vocabulary():
    llm = LLM(target=TARGET, method="draft", num_speculative_tokens=2, max_num_seqs=1)
    assert llm.spec.draft == DRAFT
    assert llm.draft_model.cfg.vocab_size == llm.target.cfg.vocab_size
    assert isinstance(llm.draft_model.lm_head, SubsetLMHead)  # drafts from its reduced vocabulary
    draft_dir = resolve_model_dir(DRAFT)
    hf = AutoModelForCausalLM.from_pretrained(draft_dir)  # the rebuilt directory is a plain HF model too
    assert hf.config.vocab_size == 49152
    assert AutoTokenizer.from_pretrained(draft_dir).get_vocab() == llm.tokenizer.get_vocab()


@pytest.mark.parametrize(("method", "k"), [("draft", 3), ("eagle", 6), ("medusa", 4), ("layer_skip", 2)])
def test_shipped_drafter_greedy_equals_plain(method, k, plain):
    llm = LLM(target=TARGET, method=method, num_speculative_tokens=k, controller="fixed", max_num_seqs=2)
    outs = llm.chat(CHATS, GREEDY)
    assert [o.token_ids for o in outs] == plain
    assert sum(o.metrics["num_accepted"] for o in outs) > 0  # a trained or chosen drafter, not a silent one
