"""On the real SmolLM2-135M-Instruct: logits and greedy text equal transformers' for the same weights."""

from __future__ import annotations

import pytest
import torch
import transformers

from specdecode import LLM, SamplingParams
from specdecode.models.llama import AttentionMetadata, load_llama

QUESTIONS = [
    "What is the capital of France?",
    "Write a Python function that reverses a string.",
    "Summarize: The cat sat on the mat. The cat was happy. The mat was red.",
]


@pytest.fixture(scope="module")
def hf_model(smollm2_dir):
    return transformers.AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()


def test_logits_match_transformers(smollm2_dir, smollm2_tokenizer, hf_model):
    ids = smollm2_tokenizer(QUESTIONS[0]).input_ids
    ours = load_llama(smollm2_dir)
    cache = ours.new_cache(1, 64)
    with torch.inference_mode():
        got = ours(torch.tensor([ids]), AttentionMetadata.build([0], [0], len(ids), "cpu"), cache)[0]
        want = hf_model(torch.tensor([ids])).logits[0]
    assert (got - want).abs().max() < 1e-3


CHATS = [[{"role": "user", "content": q}] for q in QUESTIONS]
MAX_TOKENS = 48


@pytest.fixture(scope="module")
def transformers_greedy(smollm2_tokenizer, hf_model) -> list[list[int]]:
    """transformers.generate's greedy continuation of each chat, computed once for the three methods below."""
    outs = []
    for chat in CHATS:
        ids = smollm2_tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt")
        ids = ids["input_ids"] if not torch.is_tensor(ids) else ids
        with torch.inference_mode():
            ref = hf_model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=MAX_TOKENS,
                do_sample=False,
                eos_token_id=smollm2_tokenizer.eos_token_id,
                pad_token_id=smollm2_tokenizer.eos_token_id,
            )
        outs.append(ref[0, ids.shape[1] :].tolist())
    return outs


@pytest.mark.parametrize(
    ("method", "enforce_eager"),
    [("none", True), ("ngram", True), ("ngram_tree", False)],  # the last one through the compiled step
)
def test_greedy_text_equals_transformers_generate(method, enforce_eager, smollm2_dir, transformers_greedy):
    llm = LLM(  # K = 5 at every step: drafts are verified all along (and no step-time probe of the compiled model)
        target=str(smollm2_dir),
        method=method,
        num_speculative_tokens=5,
        controller="fixed",
        max_num_seqs=3,
        enforce_eager=enforce_eager,
    )
    assert llm.target.step.compiled is not enforce_eager
    outs = llm.chat(CHATS, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS))
    assert [o.token_ids for o in outs] == transformers_greedy
    assert "Paris" in outs[0].text
    if method != "none":
        assert sum(o.metrics["num_accepted"] for o in outs) > 0
