"""`make demo`: the built-in SmolLM2 target, plain decoding vs speculative decoding on the same prompts: the
n-gram drafter and the shipped distilled draft model (`smollm2-135m-instruct-draft`), both lossless.

Usage: python -m specdecode.demo [--max-tokens N]
"""

from __future__ import annotations

import argparse
import sys

from specdecode import LLM, SamplingParams

PROMPTS = [
    "Rewrite this sentence in the passive voice: The committee approved the new budget after a long debate.",
    "Summarize in one sentence: Speculative decoding lets a cheap drafter propose several tokens that a large "
    "model verifies in one forward pass, so generation is faster while the output stays exactly the same.",
]


ARMS = {"n-gram": ("ngram", 5), "draft": ("draft", 1)}  # method, K (K = 1: the shipped draft's best on Spec-Bench)


def run(method: str, k: int, prompts: list[str], params: SamplingParams) -> list:
    llm = LLM(target="smollm2-135m-instruct", method=method, num_speculative_tokens=k, max_num_seqs=1)
    llm.chat([[{"role": "user", "content": "Hi"}]], SamplingParams(max_tokens=4))  # warm-up
    return [llm.chat([[{"role": "user", "content": p}]], params)[0] for p in prompts]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-tokens", type=int, default=96)
    a = ap.parse_args()
    params = SamplingParams(temperature=0.0, max_tokens=a.max_tokens)
    plain = run("none", 0, PROMPTS, params)
    spec = {name: run(method, k, PROMPTS, params) for name, (method, k) in ARMS.items()}
    for i, prompt in enumerate(PROMPTS):
        p = plain[i]
        print(f"\n>>> {prompt}\n")
        print(f"plain    ({p.metrics['tokens_per_s']:5.1f} tok/s): {p.text}\n")
        for name, outs in spec.items():
            s = outs[i]
            print(
                f"{name:8} ({s.metrics['tokens_per_s']:5.1f} tok/s, tau {s.metrics['mean_accepted_tokens']:.2f}, "
                f"{s.metrics['tokens_per_s'] / p.metrics['tokens_per_s']:.2f}x), identical output: "
                f"{p.token_ids == s.token_ids}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
