"""Each built-in target's default arm: the drafter and K that `LLM(target=...)` (and every command without
--method) uses, chosen on the target's dev prompts (the code set's dev split: never the evaluation prompts), with
the command and results file that measured it. A target not listed, or settings that name a method, get nothing
from here: the config's own defaults (n-gram, K = 5) and what the caller gave.
"""

from __future__ import annotations

from dataclasses import dataclass

from specdecode.config import ARITHMETIC_ENV, ARITHMETICS, from_environment


@dataclass(frozen=True)
class DefaultArm:
    method: str
    num_speculative_tokens: int
    measured: str  # the results file whose dev run chose it
    draft_stop_below: float = 0.0  # a draft model arm's --draft-stop-below
    draft_lookup: int = 0  # a draft model arm's --draft-lookup

    def draft_settings(self) -> dict:
        """The draft model settings this arm sets (those left at 0 are the config's own defaults)."""
        given = {"draft_stop_below": self.draft_stop_below, "draft_lookup": self.draft_lookup}
        return {name: value for name, value in given.items() if value}


# SmolLM2: chosen 2026-11-26 on a 2-core AMD EPYC, fast arithmetic (the lane-wise kernel of that morning), greedy,
# 128 tokens, the code set's dev split: n-gram made 1.17x (suffix 0.59x, the shipped draft 0.63x); it serves the
# exact arithmetic too. The 1.5B under exact (the default): 2026-11-27, after the exact kernel's prefetch, all 16
# dev prompts: the 0.5B draft K = 4 stopping below 0.7 1.20x exact K = 0, K = 3 1.17x, n-gram K = 3 1.07x, the
# draft itself exact (results/code_dev_pair_exact.json; before the prefetch the draft lost there, 0.84x on the
# eval prompts); with the draft in the fast arithmetic (draft_arithmetic's default since): 1.42x, 1.41x, 1.03x
# (results/code_dev_pair_exact_fastdraft.json).
DEFAULT_ARMS: dict[str, DefaultArm] = {
    "smollm2-135m-instruct": DefaultArm("ngram", 5, "results/code_dev_smollm2_fast.json"),
    "qwen2.5-coder-1.5b-instruct": DefaultArm(
        "draft", 4, "results/code_dev_pair_exact_fastdraft.json", draft_stop_below=0.7
    ),
}

# Under --arithmetic fast, where a dev run of the current kernel chose otherwise. 2026-11-26, the grouped-rows
# kernel, all 16 dev prompts: the 0.5B draft K = 3 1.30x fast K = 0 (K = 5 1.23x, K = 7 1.10x, n-gram 1.10x).
# 2026-11-27, the prefetching kernel, the same prompts: K = 3 1.32x, K = 4 stopping below 0.7 1.39x, K = 6 stopping
# below 0.8 1.36x, goodput (K_max 8) 1.30x, goodput stopping below 0.8 1.34x (results/code_dev_pair_stop.json).
# 2026-11-28, the draft requantized to Q4_1 (models/requantize.py), the same prompts: fixed K = 4 below 0.7 1.27x,
# K = 5-8 1.31x, goodput K_max 8 below 0.8 1.21x (results/code_dev_pair_q4_1.json). The arm runs under goodput,
# whose K_max 4 and 6 that run did not measure, so it stays. 2026-11-30, prompt lookup ahead of the draft
# (--draft-lookup, drafters/lookup_first.py), all 16 dev code prompts: the arm 1.59x fast K = 0, with lookup from 3
# tokens 1.62x, from 4 1.61x (results/code_dev_pair_lookup.json); on the dev chat prompts (2 a category) 61.0 ->
# 62.2 tok/s, summarization 61.9 -> 90.3 (results/chat_dev_pair_lookup.json).
FAST_ARMS: dict[str, DefaultArm] = {
    "qwen2.5-coder-1.5b-instruct": DefaultArm(
        "draft", 4, "results/code_dev_pair_lookup.json", draft_stop_below=0.7, draft_lookup=3
    ),
}


def default_arm(target: str, settings: dict) -> DefaultArm | None:
    """The arm for `target` in the arithmetic the settings (or $SPECDECODE_ARITHMETIC) name; None if it has none."""
    arithmetic = from_environment(settings.get("arithmetic"), ARITHMETIC_ENV, ARITHMETICS)
    return (FAST_ARMS if arithmetic == "fast" and target in FAST_ARMS else DEFAULT_ARMS).get(target)


def with_default_arm(target: str, settings: dict) -> dict:
    """`settings` (LLM keywords) with the target's default method and K (and a draft arm's stop and lookup) filled
    in where no method is given; a K (or a draft setting) given without a method keeps its value."""
    arm = default_arm(target, settings)
    if arm is None or settings.get("method") is not None:
        return settings
    filled = {"method": arm.method, "num_speculative_tokens": arm.num_speculative_tokens, **settings}
    for name, value in arm.draft_settings().items():
        if settings.get(name) is None:
            filled[name] = value
    return filled
