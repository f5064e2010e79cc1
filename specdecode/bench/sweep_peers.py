"""The sweep's peers at concurrency 1: transformers `generate()` and its speculative modes on the same prompts.

transformers decodes one request at a time, so peers only have a C = 1 figure. Their per-token latency is a
request's seconds / tokens (prefill included: `generate()` exposes no first-token time).
"""

from __future__ import annotations

import argparse

from tqdm import tqdm

from specdecode.bench.lib import Arm
from specdecode.bench.specbench import HFArm, hf_arms
from specdecode.bench.sweep_config import LevelRun, SweepConfig

# transformers' dynamic assisted decoding: the draft stops early below this confidence, K follows the heuristic.
ASSISTANT_CONFIDENCE = 0.4


def peer_arms(a: argparse.Namespace, base) -> list[Arm]:
    """specbench's peers (plain, prompt lookup or assisted with the same K) plus assisted's dynamic mode."""
    arms = hf_arms(a, base, [base])
    for arm in list(arms):
        if isinstance(arm, HFArm) and "assistant_model" in arm.kwargs:
            dynamic = {
                **arm.kwargs,
                "num_assistant_tokens_schedule": "heuristic",
                "assistant_confidence_threshold": ASSISTANT_CONFIDENCE,
            }
            arms.append(HFArm("HF assisted dynamic", arm.model, arm.tokenizer, arm.eos_ids, **dynamic))
    return arms


def run_peers(a: argparse.Namespace, base, texts: list[str], cfg: SweepConfig) -> dict[str, LevelRun]:
    """Each peer on `texts` at batch 1, interleaved prompt by prompt."""
    arms = peer_arms(a, base)
    for arm in arms:
        for text in texts[: cfg.warmup]:
            arm.run(text, min(cfg.max_tokens, 16))
    runs = {arm.name: LevelRun(0.0, 0, len(texts), [], []) for arm in arms}
    for text in tqdm(texts, desc="peers", unit="req"):
        for arm in arms:
            sample = arm.run(text, cfg.max_tokens)
            run = runs[arm.name]
            run.seconds += sample.seconds
            run.tokens += sample.tokens
            if sample.tokens:
                run.tpot_s.append(sample.seconds / sample.tokens)
    return runs
