"""Layer-skip self-speculation: greedy output equals plain greedy output (with and without a vocabulary subset),
sampled drafts stay inside the subset, the calibration probe sees exactly what the drafter sees, the drafter
reads the target's own cache (a wrong binding is detected), the layer search keeps the ends, and the shipped
choice loads."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from specdecode import LLM, SamplingParams
from specdecode.cli import main
from specdecode.config import ConfigError
from specdecode.drafters import ASSETS
from specdecode.drafters.layer_select import (
    AgreementProbe,
    LayerSkipChoice,
    estimated_speedup,
    select_layers,
)
from specdecode.drafters.layer_skip import LayerSkipDrafter
from specdecode.drafters.subset_head import frequent_tokens
from specdecode.engine.engine import sampling_tensors
from specdecode.models.llama import AttentionMetadata, load_llama
from specdecode.train.data import load_samples
from tests.tiny import write_tiny_model

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
PROMPTS = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [11, 12, 13], [20, 21, 22, 23, 24, 25, 26], [3, 4]]
KEPT = [0, 2, 5]
SUBSET = np.arange(3, 60)  # token ids the subset head scores


@pytest.fixture(scope="module")
def deep_target(tmp_path_factory, smollm2_tokenizer):
    path = write_tiny_model(tmp_path_factory.mktemp("deep"), num_hidden_layers=6, seed=3, embed_scale=3.0)
    smollm2_tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def choice_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("choice") / "choice.json"
    LayerSkipChoice(KEPT, 0.5, 1.1).save(path)
    return path


@pytest.fixture(scope="module")
def subset_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("subset") / "choice.json"
    np.save(path.with_suffix(".vocab.npy"), SUBSET.astype(np.uint16))
    LayerSkipChoice(KEPT, 0.5, 1.1, vocab_subset="choice.vocab.npy").save(path)
    return path


@pytest.fixture(scope="module")
def reference(deep_target) -> list[list[int]]:
    llm = LLM(target=str(deep_target), method="none", max_num_seqs=4)
    return [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]


def layer_skip_llm(target, choice, k: int = 3, batch: int = 4) -> LLM:
    return LLM(
        target=str(target),
        draft=str(choice),
        method="layer_skip",
        num_speculative_tokens=k,
        controller="fixed",
        max_num_seqs=batch,
    )


@pytest.mark.parametrize(("k", "batch", "subset"), [(1, 1, False), (4, 1, True), (3, 4, False), (2, 4, True)])
def test_layer_skip_greedy_equals_plain(deep_target, choice_file, subset_file, reference, k, batch, subset):
    llm = layer_skip_llm(deep_target, subset_file if subset else choice_file, k, batch)
    assert isinstance(llm.engine.drafter, LayerSkipDrafter) and (llm.engine.drafter.head is not None) == subset
    outs = llm.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == reference
    assert 0 < sum(o.metrics["num_accepted"] for o in outs) < sum(o.metrics["num_drafted"] for o in outs)


def test_sampled_drafts_stay_inside_the_subset_and_are_seeded(deep_target, subset_file):
    llm = layer_skip_llm(deep_target, subset_file)
    sampled = SamplingParams(temperature=1.0, max_tokens=12, seed=7, ignore_eos=True)
    first = [o.token_ids for o in llm.generate(PROMPTS, sampled)]
    assert [o.token_ids for o in llm.generate(PROMPTS, sampled)] == first
    seqs = [llm.engine.add_request("s", PROMPTS[0], sampled)]
    while seqs[0].status.value != "running":
        llm.engine.step()
    proposal = llm.engine.drafter.propose(seqs, [3], sampling_tensors(seqs, "cpu", llm.target.cfg.vocab_size))
    outside = torch.ones(llm.target.cfg.vocab_size, dtype=torch.bool)
    outside[SUBSET] = False
    assert proposal.probs.shape == (1, 3, llm.target.cfg.vocab_size)
    assert proposal.probs[..., outside].sum() == 0 and torch.allclose(proposal.probs.sum(-1), torch.ones(1, 3))
    assert bool(torch.isin(proposal.token_ids, torch.from_numpy(SUBSET)).all())


@pytest.mark.parametrize("subset", [None, SUBSET])
def test_probe_sees_what_the_drafter_sees(deep_target, subset):
    """The calibration's one-forward score equals drafting position by position on the full model's cache."""
    target = load_llama(deep_target)
    seq, start = [5, 6, 7, 8, 9, 10, 11, 12, 40, 41, 42, 43], 3
    subset_t = None if subset is None else torch.from_numpy(subset)
    probe = AgreementProbe(target, [seq], [start], torch.arange(96) if subset is None else subset_t)
    if subset is None:  # all layers under the drafting view are the full model
        assert probe.agreement(list(range(6))) == 1.0
    cache = target.new_cache(1, len(seq))
    ids = torch.tensor([seq])  # [1, T]
    with torch.inference_mode():
        full = target(ids, AttentionMetadata.build([0], [0], len(seq), "cpu"), cache).argmax(-1)[0]  # [T]
        drafter = LayerSkipDrafter(target, KEPT, subset_t)
        drafter.bind_target_cache(cache)
        # Latest position first: drafting at p overwrites the kept layers' K/V at p, which no earlier p reads.
        drafts = {p: drafter._logits(ids[:, p : p + 1], [p], [0]).argmax(-1).item() for p in reversed(range(start, 12))}
    manual = np.mean([drafts[p] == full[p].item() for p in range(start, len(seq))])
    assert probe.num_tokens == len(seq) - start
    assert probe.agreement(KEPT) == pytest.approx(manual)
    assert 0.0 < manual < 1.0  # the comparison has both outcomes to get wrong


def test_drafting_from_a_stale_cache_is_detected(deep_target, choice_file, reference):
    """Negative control: a drafter bound to a cache other than the target's drafts from garbage context, so
    acceptance collapses (output stays equal: verification is still lossless)."""
    good = sum(o.metrics["num_accepted"] for o in layer_skip_llm(deep_target, choice_file).generate(PROMPTS, GREEDY))
    wrong = layer_skip_llm(deep_target, choice_file)
    wrong.engine.drafter.bind_target_cache(wrong.target.new_cache(8, 512))
    outs = wrong.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == reference
    assert sum(o.metrics["num_accepted"] for o in outs) < good


def test_select_layers_keeps_the_ends(deep_target):
    target = load_llama(deep_target)
    seqs = [[5, 6, 7, 8, 9, 10, 11, 12], [20, 21, 22, 23, 24]]
    fixed = select_layers(target, seqs, [2, 0], num_skip=2, progress=False)
    assert fixed.layer_ids[0] == 0 and fixed.layer_ids[-1] == 5 and len(fixed.layer_ids) == 4
    assert fixed.layer_ids == sorted(set(fixed.layer_ids)) and len(fixed.curve) == 3
    assert fixed.curve[0]["agreement"] == 1.0 and fixed.num_tokens == 6 + 5
    best = select_layers(target, seqs, [2, 0], vocab_subset=torch.arange(3, 60), min_kept=2, progress=False)
    assert best.layer_ids[0] == 0 and best.layer_ids[-1] == 5 and 2 <= len(best.layer_ids) <= 5
    with pytest.raises(ConfigError, match="num-skip"):
        select_layers(target, seqs, num_skip=5, progress=False)


def test_estimated_speedup_and_frequent_tokens(tmp_path):
    assert estimated_speedup(0.0, 0.5) == 1.0  # never draft when nothing is accepted
    assert estimated_speedup(0.9, 0.1) > 2.0
    assert frequent_tokens([np.array([5, 5, 5, 2, 2, 9])], 2).tolist() == [2, 5]
    assert frequent_tokens([np.array([5, 5, 5, 2, 2, 9])], 2, always=[9]).tolist() == [5, 9]  # 2 makes room
    assert frequent_tokens([np.array([5, 5, 5, 2, 2, 9])], 3, always=[11]).tolist() == [2, 5, 11]  # never seen
    data = tmp_path / "d.npz"
    np.savez(
        data,
        tokens=np.array([1, 2, 7, 7, 1, 8], dtype=np.uint16),
        offsets=np.array([0, 4, 6]),
        prompt_len=np.array([2, 1], dtype=np.int32),
        response_len=np.array([2, 1], dtype=np.int32),
    )
    assert [r.tolist() for r in load_samples([data], 96).responses()] == [[7, 7], [8]]


def test_missing_or_bad_choice(deep_target, tmp_path, capsys):
    with pytest.raises(ConfigError, match="select-layers"):
        LLM(target=str(deep_target), method="layer_skip")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"layer_ids": [0, 9], "agreement": 1, "estimated_speedup": 1}))
    with pytest.raises(ConfigError, match="layer ids"):
        LLM(target=str(deep_target), draft=str(bad), method="layer_skip")
    assert main(["select-layers", "--target", str(deep_target), "--num-skip", "0"]) == 2
    assert main(["select-layers", "--target", str(deep_target), "--vocab-data", str(tmp_path / "no.npz")]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 2  # one line each


def test_shipped_choice_for_smollm2():
    path = ASSETS / "layer_skip" / "smollm2-135m-instruct.json"
    choice = LayerSkipChoice.load(path, 30)
    assert choice.layer_ids[0] == 0 and choice.layer_ids[-1] == 29 and len(choice.layer_ids) < 30
    assert choice.layer_ids == sorted(set(choice.layer_ids)) and 0 < choice.agreement <= 1
    assert choice.num_tokens >= 256 and choice.command.startswith("specdecode select-layers")
    subset = choice.load_vocab_subset(path, 49152)
    assert subset is not None and len(set(subset.tolist())) == len(subset) and int(subset.max()) < 49152
    assert (path.parent / choice.vocab_subset).stat().st_size < 100_000
