"""The draft's drafting-vocabulary size, chosen on the code set's dev split: one loaded pair, each vocabulary
installed in turn on the same draft, variants interleaved prompt by prompt (their order rotating), greedy.

    specdecode distill vocab --draft qwen2.5-coder-0.5b-instruct --size 49152 ... --out /tmp/v49k.npy  # etc.
    python -m experiments.draft_vocab_dev --vocabs full /tmp/v65k.npy /tmp/v49k.npy \\
        specdecode/assets/drafts/qwen2.5-coder-0.5b-instruct.vocab.npy --output results/draft_vocab_dev.json

Reports per vocabulary: whole-request tok/s (total tokens / total seconds), drafts accepted, and the share of the
target's answer tokens inside the vocabulary.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from tqdm import tqdm

from specdecode.bench.code_prompts import load_prompts
from specdecode.bench.lib import provenance, write_result
from specdecode.config import SamplingParams
from specdecode.drafters.draft_model import use_subset
from specdecode.drafters.subset_head import load_subset
from specdecode.llm import LLM


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    p.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    p.add_argument("--vocabs", nargs="+", required=True, help=".npy files, or 'full'")
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--every", type=int, default=2, help="every n-th dev prompt")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--arithmetic", default="fast")
    p.add_argument("--output", default="results/draft_vocab_dev.json")
    a = p.parse_args()
    llm = LLM(a.target, method="draft", draft=a.draft, num_speculative_tokens=a.k, controller="fixed",
              arithmetic=a.arithmetic, draft_vocab="full")  # fmt: skip
    draft = llm.draft_model
    full_head, full_step = draft.lm_head, draft.step
    subsets = {v: None if v == "full" else load_subset(v, draft.cfg.vocab_size) for v in a.vocabs}

    def use(name: str) -> None:
        draft.lm_head, draft.step = full_head, full_step
        if subsets[name] is not None:
            use_subset(draft, subsets[name])

    prompts = [q.text for q in load_prompts("code", "dev")][:: a.every]
    params = SamplingParams(temperature=0.0, max_tokens=a.max_tokens)
    totals = {v: {"seconds": 0.0, "tokens": 0, "accepted": 0, "inside": 0} for v in a.vocabs}
    llm.chat([[{"role": "user", "content": prompts[0]}]], SamplingParams(temperature=0.0, max_tokens=8))  # warm-up
    for i, prompt in enumerate(tqdm(prompts, desc="dev prompts")):
        for name in a.vocabs[i % len(a.vocabs) :] + a.vocabs[: i % len(a.vocabs)]:
            use(name)
            start = time.perf_counter()
            out = llm.chat([[{"role": "user", "content": prompt}]], params)[0]
            t = totals[name]
            t["seconds"] += time.perf_counter() - start
            t["tokens"] += len(out.token_ids)
            t["accepted"] += out.metrics["num_accepted"]
            subset = subsets[name]
            t["inside"] += len(out.token_ids) if subset is None else int(np.isin(out.token_ids, subset.numpy()).sum())
    rows = {
        v: {
            "size": draft.cfg.vocab_size if subsets[v] is None else len(subsets[v]),
            "tok_s": t["tokens"] / t["seconds"],
            "accepted": t["accepted"],
            "coverage": t["inside"] / t["tokens"],
        }
        for v, t in totals.items()
    }
    for v, r in rows.items():
        print(f"{r['size']:>7} {r['tok_s']:6.2f} tok/s  accepted {r['accepted']}  coverage {r['coverage']:.4f}  ({v})")
    result = {
        **provenance("experiments.draft_vocab_dev", llm.target),
        "prompts": len(prompts),
        "k": a.k,
        "arithmetic": a.arithmetic,
        "vocabs": rows,
    }
    write_result(a.output, result)


if __name__ == "__main__":
    main()
