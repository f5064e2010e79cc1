"""The drafters shipped for the built-in target (the layer-skip choice, the EAGLE head) work by name alone:
they load for `smollm2-135m-instruct`, share its vocabulary, draft tokens the target accepts, and greedy output
equals plain greedy output on the real model."""

from __future__ import annotations

import json

import pytest

from specdecode import LLM, SamplingParams
from specdecode.drafters import ASSETS
from specdecode.drafters.subset_head import load_subset
from specdecode.heads.io import CONFIG_FILE, VOCAB_FILE, WEIGHTS_FILE

TARGET = "smollm2-135m-instruct"
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a Python function that reverses a string."}],
]
GREEDY = SamplingParams(temperature=0.0, max_tokens=40)


@pytest.fixture(scope="module")
def plain() -> list[list[int]]:
    llm = LLM(target=TARGET, method="none", max_num_seqs=2)
    return [o.token_ids for o in llm.chat(CHATS, GREEDY)]


def test_shipped_eagle_head_files():
    path = ASSETS / "heads" / TARGET / "eagle"
    data = json.loads((path / CONFIG_FILE).read_text())
    assert data["config"]["kind"] == "eagle" and data["config"]["target"]["vocab_size"] == 49152
    manifest = data["manifest"]
    assert manifest["command"].startswith("specdecode distill --head eagle") and manifest["tokens_seen"] > 0
    assert (path / WEIGHTS_FILE).stat().st_size < 25_000_000
    assert not (path / "checkpoint").exists()  # optimizer state is not shipped
    assert len(load_subset(path / VOCAB_FILE, 49152)) == 16384  # the cheap drafting head's tokens


@pytest.mark.parametrize(("method", "k"), [("eagle", 6), ("layer_skip", 2)])
def test_shipped_drafter_greedy_equals_plain(method, k, plain):
    llm = LLM(target=TARGET, method=method, num_speculative_tokens=k, controller="fixed", max_num_seqs=2)
    outs = llm.chat(CHATS, GREEDY)
    assert [o.token_ids for o in outs] == plain
    assert sum(o.metrics["num_accepted"] for o in outs) > 0  # a trained or chosen drafter, not a silent one
