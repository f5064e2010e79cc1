"""Penalties, logit_bias and logprobs under speculation, against an independent reference: a `transformers`
forward over the whole sequence at every step, with the penalties applied by a plain loop over tokens.

Greedy output with penalties equals that reference token for token for every drafter; the negative control
forgets the drafted prefix when the target penalises a verify position, and the same assertion fails. Logprobs
equal the reference's log-softmax at each emitted token, whichever way the token was emitted.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
import torch
from transformers import AutoModelForCausalLM

import specdecode.engine.engine
import specdecode.engine.logprobs
from specdecode import LLM, SamplingParams
from specdecode.config import ConfigError
from specdecode.heads import HEAD_KINDS

PROMPTS = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [11, 12, 13, 11, 12]]
PENALISED = SamplingParams(
    max_tokens=24,
    ignore_eos=True,
    frequency_penalty=1.2,
    presence_penalty=0.6,
    repetition_penalty=1.4,
    logit_bias={7: 4.0, 30: -5.0},
)
METHODS = ["none", "ngram", "ngram_tree", "suffix", "suffix_tree", "draft", "self", "layer_skip"]
HEADS = list(HEAD_KINDS)


@pytest.fixture(scope="module")
def hf(tiny_target):
    return AutoModelForCausalLM.from_pretrained(tiny_target, torch_dtype=torch.float32).eval()


def reference_logits(hf, prompt: list[int], output: list[int], params: SamplingParams) -> torch.Tensor:
    """[vocab] the next token's adjusted logits, penalties applied token by token (vLLM's order and rules)."""
    with torch.no_grad():
        return penalise(hf(torch.tensor([prompt + output])).logits[0, -1], prompt, output, params)


def penalise(logits: torch.Tensor, prompt: list[int], output: list[int], params: SamplingParams) -> torch.Tensor:
    """[vocab] logits -> a float64 copy with logit_bias and the penalties applied by hand, one token at a time."""
    logits = logits.double().clone()
    for token, bias in (params.logit_bias or {}).items():
        logits[token] += bias
    for token in set(prompt) | set(output):
        rp = params.repetition_penalty
        logits[token] = logits[token] / rp if logits[token] > 0 else logits[token] * rp
    for token, count in Counter(output).items():
        logits[token] -= params.frequency_penalty * count + params.presence_penalty
    return logits


def reference_greedy(hf, prompt: list[int], params: SamplingParams) -> list[int]:
    output: list[int] = []
    for _ in range(params.max_tokens):
        output.append(int(reference_logits(hf, prompt, output, params).argmax()))
    return output


def make(method: str, tiny_target, drafts, k: int = 4) -> LLM:
    return LLM(
        target=str(tiny_target),
        draft=drafts.get(method),
        method=method,
        num_speculative_tokens=k,
        controller="fixed",
        max_num_seqs=2,
    )


@pytest.fixture(scope="module")
def expected(hf) -> list[list[int]]:
    return [reference_greedy(hf, p, PENALISED) for p in PROMPTS]


@pytest.mark.parametrize("method", METHODS + HEADS)
def test_greedy_with_penalties_equals_the_reference(method, tiny_target, drafts, expected):
    outs = make(method, tiny_target, drafts).generate(PROMPTS, PENALISED)
    assert [o.token_ids for o in outs] == expected


def test_the_reference_is_not_plain_greedy(tiny_target, drafts, expected):
    """Guard on the test itself: the penalties change the output, so equality above says something."""
    plain = make("none", tiny_target, drafts).generate(
        PROMPTS,
        replace(PENALISED, frequency_penalty=0.0, presence_penalty=0.0, repetition_penalty=1.0, logit_bias=None),
    )
    assert [o.token_ids for o in plain] != expected


def test_forgetting_the_drafted_prefix_is_caught(tiny_target, drafts, expected, monkeypatch):
    """Fault: the target penalises every verify position as if no draft came before it."""
    real = specdecode.engine.engine.chain_paths
    monkeypatch.setattr(specdecode.engine.engine, "chain_paths", lambda d: torch.full_like(real(d), -1))
    outs = make("self", tiny_target, drafts).generate(PROMPTS, PENALISED)  # self-drafts are accepted: paths matter
    got = [o.token_ids for o in outs]
    wrong = sum(a != b for g, e in zip(got, expected, strict=True) for a, b in zip(g, e, strict=True))
    assert wrong >= 10, f"only {wrong} of 48 tokens differ"


LOGPROB_CASES = [
    SamplingParams(max_tokens=16, ignore_eos=True, logprobs=3),
    SamplingParams(max_tokens=16, ignore_eos=True, logprobs=2, temperature=0.8, seed=3, frequency_penalty=0.5),
]


def check_logprobs(hf, prompt: list[int], out, params: SamplingParams) -> float:
    """Largest difference between the engine's logprobs and the reference's; top ids must agree too."""
    worst = 0.0
    temperature = params.temperature or 1.0
    for i, lp in enumerate(out.logprobs):
        ref = (reference_logits(hf, prompt, out.token_ids[:i], params) / temperature).log_softmax(-1)
        assert lp.token_id == out.token_ids[i] and len(lp.top) == params.logprobs
        ref_top = ref.topk(params.logprobs).values.tolist()  # the alternatives are the most likely, in order
        diffs = [lp.logprob - float(ref[lp.token_id])]
        diffs += [v - float(ref[t]) for t, v in lp.top] + [v - r for (_, v), r in zip(lp.top, ref_top, strict=True)]
        worst = max([worst] + [abs(d) for d in diffs])
    return worst


# The sampled case through every drafter; the greedy one through a chain, a tree and the sampled self-draft.
LOGPROB_RUNS = [(m, 1) for m in METHODS + HEADS] + [(m, 0) for m in ("ngram", "ngram_tree", "self")]


@pytest.mark.parametrize(("method", "case"), LOGPROB_RUNS)
def test_logprobs_equal_the_reference(method, case, tiny_target, drafts, hf):
    params = LOGPROB_CASES[case]
    outs = make(method, tiny_target, drafts).generate(PROMPTS, params)
    for prompt, out in zip(PROMPTS, outs, strict=True):
        assert len(out.logprobs) == len(out.token_ids) == params.max_tokens
        assert check_logprobs(hf, prompt, out, params) < 1e-3
    if method == "self":
        assert sum(o.metrics["num_accepted"] for o in outs) > 10  # accepted drafts' logprobs were checked


def test_logprobs_read_at_the_wrong_position_are_caught(tiny_target, drafts, hf, monkeypatch):
    """Fault: each emitted token's logprob is read from the next position's distribution."""
    real = specdecode.engine.logprobs.emitted_positions
    monkeypatch.setattr(
        specdecode.engine.logprobs,
        "emitted_positions",
        lambda r: (real(r) + 1).clamp(max=r.output_token_ids.shape[1] - 1),
    )
    params = LOGPROB_CASES[0]
    outs = make("self", tiny_target, drafts).generate(PROMPTS, params)
    assert max(check_logprobs(hf, p, o, params) for p, o in zip(PROMPTS, outs, strict=True)) > 0.1


def test_bad_penalties_and_bias_are_clear_errors(tiny_target, drafts):
    llm = make("ngram", tiny_target, drafts)
    with pytest.raises(ConfigError, match="logit_bias keys must be token ids in 0..95"):
        llm.generate(PROMPTS[:1], SamplingParams(logit_bias={96: 1.0}))
    for bad in (
        dict(repetition_penalty=5e-324),  # the schema fuzzer's: a logit divided by it is inf
        dict(frequency_penalty=2.5),
        dict(presence_penalty=-3.0),
        dict(repetition_penalty=0.0),
        dict(logit_bias={3: 101.0}),
        dict(logprobs=21),
        dict(n=0),
    ):
        with pytest.raises(ConfigError):
            SamplingParams(**bad)
