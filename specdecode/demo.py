"""`make demo`: plain decoding vs speculative decoding on the same prompts, both lossless. With the Qwen2.5-Coder
pair installed (`make models`) it runs the 1.5B target on code prompts: its default arm (what `LLM(target=...)`
picks: the 0.5B draft model) and n-gram lookup; without it, the built-in SmolLM2 target with the n-gram drafter
and the shipped distilled draft model (`smollm2-135m-instruct-draft`).

Usage: python -m specdecode.demo [--model smollm2|pair] [--max-tokens N]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from specdecode import LLM, SamplingParams
from specdecode.models.provision import ProvisionError, check_installed


@dataclass(frozen=True)
class Demo:
    target: str
    prompts: tuple[str, ...]
    arms: dict[str, dict]  # name -> LLM settings beside the target


SMOLLM2 = Demo(
    "smollm2-135m-instruct",
    (
        "Rewrite this sentence in the passive voice: The committee approved the new budget after a long debate.",
        "Summarize in one sentence: Speculative decoding lets a cheap drafter propose several tokens that a large "
        "model verifies in one forward pass, so generation is faster while the output stays exactly the same.",
    ),
    {
        "n-gram": {"method": "ngram", "num_speculative_tokens": 5},
        "draft": {"method": "draft", "num_speculative_tokens": 1},  # the shipped draft's best K on Spec-Bench
    },
)
PAIR = Demo(
    "qwen2.5-coder-1.5b-instruct",
    (
        "Write a Python function `is_prime(n)` with a docstring and two doctests.",
        "Rename the variable `tmp` to `total` in this function and return the result:\n\n```python\ndef add_all(xs):\n"
        "    tmp = 0\n    for x in xs:\n        tmp += x\n    return tmp\n```",
    ),
    {"default (0.5B draft)": {}, "n-gram": {"method": "ngram", "num_speculative_tokens": 3}},
)


def pick(choice: str | None) -> Demo:
    """The pair where it is installed (or asked for), else SmolLM2."""
    if choice == "smollm2":
        return SMOLLM2
    try:
        check_installed(PAIR.target)
        check_installed("qwen2.5-coder-0.5b-instruct")
    except ProvisionError:
        if choice == "pair":
            raise
        return SMOLLM2
    return PAIR


def run(demo: Demo, settings: dict, params: SamplingParams) -> list:
    llm = LLM(target=demo.target, max_num_seqs=1, **settings)
    llm.chat([[{"role": "user", "content": "Hi"}]], SamplingParams(max_tokens=4))  # warm-up
    return [llm.chat([[{"role": "user", "content": p}]], params)[0] for p in demo.prompts]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=("smollm2", "pair"), default=None, help="default: the pair if installed")
    ap.add_argument("--max-tokens", type=int, default=96)
    a = ap.parse_args()
    try:
        demo = pick(a.model)
    except ProvisionError as e:
        print(f"demo: {e}", file=sys.stderr)
        return 2
    print(f"target: {demo.target}")
    params = SamplingParams(temperature=0.0, max_tokens=a.max_tokens)
    plain = run(demo, {"method": "none"}, params)
    spec = {name: run(demo, settings, params) for name, settings in demo.arms.items()}
    for i, prompt in enumerate(demo.prompts):
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
