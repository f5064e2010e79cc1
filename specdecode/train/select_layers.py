"""`specdecode select-layers`: calibrate the layer-skip drafter on the target's own greedy answers and write its
layer choice (and, from distillation data, its vocabulary subset) for `--method layer_skip --draft F`.

The search itself is drafters/layer_select.py; this command runs the engine to get the answers it scores.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specdecode.drafters.layer_select import LayerSkipChoice, select_layers
from specdecode.drafters.subset_head import frequent_tokens
from specdecode.train import data as D

# Calibration instructions written for this purpose (never Spec-Bench prompts, which are for evaluation only).
CALIBRATION_PROMPTS = (
    "Explain how a refrigerator keeps food cold.",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "List five tips for learning a new programming language.",
    "What are the main differences between a virus and a bacterium?",
    "Summarize the water cycle in a few sentences.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Give me a recipe for a simple vegetable soup.",
    "Why do leaves change color in autumn?",
    "Describe the rules of chess for a beginner.",
    "Write a polite email asking a colleague to review a report.",
    "How does compound interest work? Give an example.",
    "What should I pack for a three-day hiking trip?",
    "Translate 'good morning, how are you?' into French and Spanish.",
    "Compare trains and airplanes for travelling 500 kilometres.",
    "Write a haiku about the sea.",
    "Explain what a database index is and when to use one.",
)


def calibration_sequences(target_name: str, device: str, max_tokens: int = 24):
    """(target, prompt + answer token lists, where each answer starts) for the target's own greedy answers to
    CALIBRATION_PROMPTS (chat template applied)."""
    from specdecode.config import SamplingParams
    from specdecode.llm import LLM  # heavy: only once calibrating

    # Eager: the layer-set probes below run the target's layers one subset at a time, outside the compiled step.
    llm = LLM(
        target=target_name, method="none", device=device, max_num_seqs=len(CALIBRATION_PROMPTS), enforce_eager=True
    )
    outs = llm.chat(
        [[{"role": "user", "content": p}] for p in CALIBRATION_PROMPTS], SamplingParams(max_tokens=max_tokens)
    )
    return llm.target, [o.prompt_token_ids + o.token_ids for o in outs], [len(o.prompt_token_ids) - 1 for o in outs]


def run_select(
    target_name: str,
    out: str | Path,
    device: str = "cpu",
    num_skip: int | None = None,
    vocab_data: str | None = None,
    vocab_size: int = 16384,
    command: str = "",
) -> LayerSkipChoice:
    """Calibrate and write the choice to `out` (and, from `vocab_data`, the vocabulary subset next to it)."""
    target, seqs, starts = calibration_sequences(target_name, device)
    subset = None
    if vocab_data is not None:  # checked like distillation data: a token beyond the vocabulary is an error
        subset = frequent_tokens(D.load_samples([vocab_data], target.cfg.vocab_size).responses(), vocab_size)
    choice = select_layers(target, seqs, starts, num_skip, subset, command=command)
    out = Path(out)
    if subset is not None:
        vocab_file = out.with_suffix(".vocab.npy")
        choice.vocab_subset = vocab_file.name
        out.parent.mkdir(parents=True, exist_ok=True)
        np.save(vocab_file, subset.numpy().astype(np.uint16 if subset.max() < 2**16 else np.uint32))
    choice.save(out)
    skipped = sorted(set(range(target.cfg.num_layers)) - set(choice.layer_ids))
    print(
        f"keep {len(choice.layer_ids)} of {target.cfg.num_layers} layers (skip {skipped}): agreement "
        f"{choice.agreement:.3f} on {choice.num_tokens} tokens, estimated speedup {choice.estimated_speedup:.2f}x;"
        f" written to {out}"
    )
    return choice
