"""Layer-skip self-speculation: greedy output equals plain greedy output, the drafter reads the target's own
cache (a wrong binding is detected), the layer search keeps the ends, and the shipped choice loads."""

from __future__ import annotations

import json

import pytest
import torch

from specdecode import LLM, SamplingParams
from specdecode.config import ConfigError
from specdecode.drafters import ASSETS
from specdecode.drafters.layer_select import LayerChoice, estimated_speedup, frequent_tokens, select_layers
from specdecode.drafters.layer_skip import LayerSkipDrafter
from specdecode.models.llama import load_llama
from tests.tiny import write_tiny_model

GREEDY = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
PROMPTS = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [11, 12, 13], [20, 21, 22, 23, 24, 25, 26], [3, 4]]


@pytest.fixture(scope="module")
def deep_target(tmp_path_factory, smollm2_tokenizer):
    path = write_tiny_model(tmp_path_factory.mktemp("deep"), num_hidden_layers=6, seed=3, embed_scale=3.0)
    smollm2_tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def choice_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("choice") / "choice.json"
    LayerChoice([0, 2, 5], 0.5, 1.1).save(path)
    return path


@pytest.fixture(scope="module")
def reference(deep_target) -> list[list[int]]:
    llm = LLM(target=str(deep_target), method="none", max_num_seqs=1)
    return [llm.generate([p], GREEDY)[0].token_ids for p in PROMPTS]


@pytest.mark.parametrize(("k", "batch"), [(1, 1), (4, 1), (3, 4)])
def test_layer_skip_greedy_equals_plain(deep_target, choice_file, reference, k, batch):
    llm = LLM(
        target=str(deep_target),
        draft=str(choice_file),
        method="layer_skip",
        num_speculative_tokens=k,
        controller="fixed",
        max_num_seqs=batch,
    )
    outs = llm.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == reference
    assert 0 < sum(o.metrics["num_accepted"] for o in outs) < sum(o.metrics["num_drafted"] for o in outs)


def test_vocab_subset_keeps_drafts_inside(deep_target, choice_file, reference):
    llm = LLM(target=str(deep_target), draft=str(choice_file), method="layer_skip", controller="fixed", max_num_seqs=4)
    subset = torch.arange(3, 60)
    llm.engine.drafter = LayerSkipDrafter(llm.target, [0, 2, 5], subset)
    llm.engine.drafter.bind_target_cache(llm.engine.cache)
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == reference
    sampled = SamplingParams(temperature=1.0, max_tokens=10, seed=0, ignore_eos=True)
    seqs = [llm.engine.add_request("s", PROMPTS[0], sampled)]
    while seqs[0].status.value != "running":
        llm.engine.step()
    proposal = llm.engine.drafter.propose(
        seqs, [3], __import__("specdecode").engine.engine.sampling_tensors(seqs, "cpu")
    )
    outside = torch.ones(llm.target.cfg.vocab_size, dtype=torch.bool)
    outside[subset] = False
    assert proposal.probs[..., outside].sum() == 0 and bool(torch.isin(proposal.token_ids, subset).all())


def test_drafting_from_a_stale_cache_is_detected(deep_target, choice_file, reference):
    """Negative control: a drafter bound to a cache other than the target's drafts from garbage context, so
    acceptance collapses (output stays equal: verification is still lossless)."""
    llm = LLM(
        target=str(deep_target),
        draft=str(choice_file),
        method="layer_skip",
        num_speculative_tokens=3,
        controller="fixed",
    )
    good = sum(o.metrics["num_accepted"] for o in llm.generate(PROMPTS, GREEDY))
    wrong = LLM(
        target=str(deep_target),
        draft=str(choice_file),
        method="layer_skip",
        num_speculative_tokens=3,
        controller="fixed",
    )
    wrong.engine.drafter.bind_target_cache(wrong.target.new_cache(8, 512))
    outs = wrong.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == reference
    assert sum(o.metrics["num_accepted"] for o in outs) < good


def test_select_layers_keeps_the_ends(deep_target):
    target = load_llama(deep_target)
    seqs = [[5, 6, 7, 8, 9, 10, 11, 12], [20, 21, 22, 23, 24]]
    choice = select_layers(target, seqs, [2, 0], min_kept=3, progress=False)
    assert choice.layer_ids[0] == 0 and choice.layer_ids[-1] == 5 and len(choice.layer_ids) >= 3
    assert [c["agreement"] for c in choice.curve][0] == 1.0 and len(choice.curve) == 4


def test_estimated_speedup_and_frequent_tokens():
    assert estimated_speedup(0.0, 0.5) == 1.0  # never draft when nothing is accepted
    assert estimated_speedup(0.9, 0.1) > 2.0
    import numpy as np

    assert frequent_tokens([np.array([5, 5, 5, 2, 2, 9])], 2).tolist() == [2, 5]


def test_missing_or_bad_choice(deep_target, tmp_path):
    with pytest.raises(ConfigError, match="select-layers"):
        LLM(target=str(deep_target), method="layer_skip")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"layer_ids": [0, 9], "agreement": 1, "estimated_speedup": 1}))
    with pytest.raises(ConfigError, match="layer ids"):
        LLM(target=str(deep_target), draft=str(bad), method="layer_skip")


def test_shipped_choice_for_smollm2():
    choice = LayerChoice.load(ASSETS / "layer_skip" / "smollm2-135m-instruct.json", 30)
    assert choice.layer_ids[0] == 0 and choice.layer_ids[-1] == 29 and len(choice.layer_ids) < 30
