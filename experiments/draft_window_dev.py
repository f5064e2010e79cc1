"""The draft model's attention window (--draft-window), chosen on the code set's dev split at a long context: one
loaded pair, one prefilled prompt, each window in turn on a fresh drafter over the same draft, arms interleaved.

    python -m experiments.draft_window_dev --context 8192 --windows 0 1024 4096 \\
        --output results/draft_window_dev.json

The prompt is bench long-context's (the dev prompts' text concatenated to the context, then its question, chat
template). Per window and arm (K = 0, fixed K = 1, fixed K = 3): decode tok/s of 64 tokens per repeat (the rows
rewound to the prompt's end between runs, as bench long-context does) and the drafts' acceptance.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from tqdm import tqdm

from specdecode.bench import long_context as lc
from specdecode.bench.code_prompts import load_prompts
from specdecode.bench.lib import provenance, write_result
from specdecode.bench.sweep import build_engine
from specdecode.bench.sweep_config import ArmSpec
from specdecode.drafters.draft_model import DraftModelDrafter
from specdecode.llm import LLM

ARMS = [ArmSpec("none", "fixed", 0), ArmSpec("fixed:1", "fixed", 1), ArmSpec("fixed:3", "fixed", 3)]
TOKENS = 64


def dev_text_file() -> Path:
    """The dev split of the code prompts as a jsonl of its own (long_context.text_ids reads a whole file)."""
    path = Path(tempfile.mkdtemp()) / "code_dev.jsonl"
    path.write_text("".join(json.dumps({"prompt": q.text}) + "\n" for q in load_prompts("code", "dev")))
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    p.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    p.add_argument("--context", type=int, default=8192)
    p.add_argument("--windows", type=int, nargs="+", default=[0, 1024, 4096])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--output", default="results/draft_window_dev.json")
    a = p.parse_args()
    llm = LLM(a.target, method="draft", draft=a.draft, num_speculative_tokens=3, controller="fixed",
              arithmetic="fast", max_num_batched_tokens=2048)  # fmt: skip
    text = lc.text_ids(llm, [a.context], 1, str(dev_text_file()))
    prompts = lc.context_prompts(llm, text, a.context, 1, chat=True)
    budget = llm.engine_config.max_num_batched_tokens
    max_len = a.context + lc.row_room(a.context, 1, TOKENS, 3, budget)
    engine = build_engine(llm, ARMS[-1], 1, max_len)
    seqs = lc.prefill(engine, prompts, max_len - a.context)
    lc.rewind(engine, seqs)
    runs: dict[str, dict[str, list]] = {str(w): {arm.name: [] for arm in ARMS} for w in a.windows}
    bar = tqdm(total=a.repeats * len(a.windows) * len(ARMS), desc="draft windows")
    for _ in range(a.repeats):
        for w in a.windows:
            engine.drafter = DraftModelDrafter(llm.draft_model, 1, max_len, budget, window=w)
            for s in seqs:
                engine.drafter.add_sequence(s)
            lc.warm_up(engine, seqs, ARMS[1], until_drafted=True)
            for arm in ARMS:
                lc.set_arm(engine, arm, llm)
                run = lc.decode(engine, seqs, TOKENS)
                lc.rewind(engine, seqs)
                runs[str(w)][arm.name].append(
                    {"tok_s": run.tokens / run.seconds, "acceptance": run.accepted / max(run.drafted, 1)}
                )
                bar.update(1)
            for s in seqs:
                engine.drafter.remove_sequence(s)
    for w, arms in runs.items():
        for name, rs in arms.items():
            tps = " ".join(f"{r['tok_s']:.1f}" for r in rs)
            print(f"window {w:>5} {name:8} tok/s {tps}  acceptance {rs[0]['acceptance']:.3f}")
    result = {**provenance("experiments.draft_window_dev", llm.target), "context": a.context, "tokens": TOKENS}
    print("wrote", write_result(a.output, {**result, "runs": runs}))


if __name__ == "__main__":
    main()
