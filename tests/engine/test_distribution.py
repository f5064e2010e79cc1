"""End to end: the joint distribution of the first two generated tokens under speculative sampling equals the
target's own (computed exactly from the target), with a negative control that must be detected."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specdecode import LLM, SamplingParams
from specdecode.control.confidence import ConfidenceController
from specdecode.control.cost import CostModel
from specdecode.control.goodput import GoodputController
from specdecode.drafters.subset_head import SubsetLMHead
from specdecode.engine.runner import prefill
from specdecode.sampling import SamplingTensors, process_logits
from tests.stats import fits
from tests.tiny import write_tiny_model

VOCAB = 12
PROMPT = [3, 7, 1, 9]
N = 12_000
PARAMS = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=3, ignore_eos=True)


@pytest.fixture(scope="module")
def pair(tmp_path_factory, smollm2_tokenizer):
    dirs = []
    for name, seed, layers in (("t", 0, 2), ("d", 5, 1)):
        d = write_tiny_model(
            tmp_path_factory.mktemp(name), seed=seed, vocab_size=VOCAB, embed_scale=8.0, num_hidden_layers=layers
        )
        smollm2_tokenizer.save_pretrained(d)
        dirs.append(d)
    return dirs


def exact_joint(llm: LLM) -> torch.Tensor:
    """[vocab, vocab] P(x1, x2 | prompt) under the processed target distribution."""
    model = llm.target
    st = SamplingTensors.from_params([PARAMS], "cpu")
    cache = model.new_cache(1, 16)
    with torch.inference_mode():
        p1 = process_logits(prefill(model, cache, 0, PROMPT, 64), st)[0, 0]  # [vocab]
        rows = []
        for x1 in range(VOCAB):
            cache.set_length(0, len(PROMPT))
            rows.append(process_logits(prefill(model, cache, 0, [x1], 64), st)[0, 0])
    return p1[:, None] * torch.stack(rows)  # [vocab, vocab]


def sampled_joint(llm: LLM, n: int = N, drafted: list[int] | None = None) -> torch.Tensor:
    """[vocab, vocab] counts of (x1, x2); `drafted` receives how many drafts were verified in all."""
    outs = llm.generate([PROMPT] * n, PARAMS)
    counts = torch.zeros(VOCAB, VOCAB)
    for o in outs:
        counts[o.token_ids[0], o.token_ids[1]] += 1
    if drafted is not None:
        drafted.append(sum(o.metrics["num_drafted"] for o in outs))
    return counts


def make(pair, controller: str = "fixed") -> LLM:
    target, draft = pair
    return LLM(
        target=str(target),
        draft=str(draft),
        method="draft",
        num_speculative_tokens=3,
        controller=controller,
        max_num_seqs=1024,
        prefill_chunk=8192,
    )


# Dynamic controllers use fewer samples to stay fast; a cheap-verify cost model keeps goodput speculating at
# batch 1024 (the CPU prior would rightly turn it off), and confidence cuts rows by the draft's own top-q.
CONTROLLER_CASES = {
    "fixed": (lambda: None, N),
    "goodput": (lambda: GoodputController(cost=CostModel(np.array([1.0, 0.0, 1e-6, 0.0]))), 3000),
    "confidence": (lambda: ConfidenceController(threshold=0.5), 3000),
}


@pytest.mark.parametrize("controller", list(CONTROLLER_CASES))
def test_joint_of_first_two_tokens_equals_target(pair, controller):
    build, n = CONTROLLER_CASES[controller]
    llm = make(pair, controller)
    if build() is not None:
        llm.engine.controller = build()
    drafted: list[int] = []
    counts = sampled_joint(llm, n, drafted)
    ok, stat, crit = fits(counts, exact_joint(llm))
    assert ok, f"chi2 {stat:.1f} >= {crit:.1f}"
    assert drafted[0] >= n // 4  # speculation really ran (confidence cuts many rows to zero drafts)


def test_draft_q_at_wrong_temperature_is_detected(pair):
    """Negative control: drafts drawn from q but q reported as processed at temperature 2 (sqrt(q) renormalised).

    (Reporting sampled drafts as one-hot would not do: that rule is still lossless, only less often accepted.)"""
    llm = make(pair)
    propose = llm.engine.drafter.propose

    def lying_propose(seqs, num_tokens, st):
        proposal = propose(seqs, num_tokens, st)
        if proposal.probs is not None:  # None on steps that propose nothing
            flat = proposal.probs.sqrt()
            proposal.probs = flat / flat.sum(-1, keepdim=True)
        return proposal

    llm.engine.drafter.propose = lying_propose
    assert not fits(sampled_joint(llm), exact_joint(llm))[0]


def test_draft_with_a_vocabulary_subset_stays_lossless(pair):
    """A draft that can only propose 5 of the 12 tokens (q = 0 elsewhere, as with `--draft-vocab`): the
    target's tokens outside the subset come back through the residual, so the joint is still the target's."""
    llm = make(pair)
    SubsetLMHead.install(llm.draft_model, torch.tensor([0, 2, 5, 7, 11]))
    drafted: list[int] = []
    counts = sampled_joint(llm, 4000, drafted)
    ok, stat, crit = fits(counts, exact_joint(llm))
    assert ok, f"chi2 {stat:.1f} >= {crit:.1f}"
    assert drafted[0] >= 4000
