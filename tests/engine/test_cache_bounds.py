"""Padding of a ragged step never writes past a slot: prompts near the context limit prefill beside short ones."""

from __future__ import annotations

from specdecode import LLM, SamplingParams


def test_prefill_near_the_limit_beside_short_prompts(tiny_target):
    # Chunk 100: the 9- and 150-token prompts are padded to 100 beside the 199-token one (once an IndexError).
    llm = LLM(target=str(tiny_target), method="ngram", max_model_len=200, max_num_batched_tokens=100, max_num_seqs=4)
    prompts = [[5 + i % 7 for i in range(n)] for n in (9, 199, 150)]
    outs = llm.generate(prompts, SamplingParams(max_tokens=20, ignore_eos=True))
    plain = LLM(target=str(tiny_target), method="none", max_model_len=200, max_num_batched_tokens=100, max_num_seqs=1)
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.token_ids == plain.generate([prompt], SamplingParams(max_tokens=20, ignore_eos=True))[0].token_ids
