"""The 0.5B draft's greedy drafts from its drafting vocabulary's logits alone, against the full vocabulary's.

    python -m experiments.compact_drafts [--split dev] [--k 4] [--stop 0.7] [--arithmetic fast]
        [--out results/compact_drafts_dev.json]

On one loaded 1.5B, three arms take turns prompt by prompt over the code set's `split` (greedy, 128 tokens, whole
request): K = 0; the draft arm (fixed K, stopping below `--stop`) with compact drafts (drafters/draft_model.py:
the head scores the 32k-token subset and the drafter takes its argmax and top probability there); and the same arm
made to draft as before, from the subset's logits spread over the 151,936-token vocabulary (-inf outside), its
one-hot q and softmax over all of it. The two draft arms must give the same drafts and tokens: the run stops if
their outputs differ. Reported: tok/s, speedup over K = 0, τ per arm, and the compact arm over the full one.
"""

from __future__ import annotations

import argparse

from tqdm import tqdm

from experiments.draft_weights import TARGET, arm_result, arm_rows, new_totals, timed_chat
from specdecode.bench.code_prompts import load_prompts
from specdecode.bench.lib import write_result
from specdecode.config import SamplingParams
from specdecode.llm import LLM


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--split", default="dev", choices=["dev", "eval"])
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--stop", type=float, default=0.7)
    ap.add_argument("--arithmetic", default="fast", choices=["fast", "exact"])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--out", default="results/compact_drafts_dev.json")
    a = ap.parse_args()
    spec = dict(method="draft", num_speculative_tokens=a.k, controller="fixed", draft_stop_below=a.stop)
    common = dict(arithmetic=a.arithmetic, max_num_seqs=1)
    plain = LLM(TARGET, method="none", **common)
    arms = {
        "K = 0": plain,
        "draft, compact": LLM(TARGET, share_target=plain, **spec, **common),
        "draft, full vocabulary": LLM(TARGET, share_target=plain, **spec, **common),
    }
    arms["draft, full vocabulary"].engine.drafter.compact_drafts = lambda st: False  # this arm's drafter only
    for llm in arms.values():
        llm.warm_up()
    params = SamplingParams(temperature=0.0, max_tokens=a.max_tokens)
    totals = {name: new_totals() for name in arms}
    for p in tqdm(load_prompts("code", a.split), desc="compact drafts", unit="prompt"):
        outs = {}
        for name, llm in arms.items():
            out = timed_chat(llm, p.text, params, totals[name])
            outs[name] = (out.token_ids, out.metrics.get("num_drafted", 0))
        if outs["draft, compact"] != outs["draft, full vocabulary"]:
            raise SystemExit(f"{p.question_id}: the compact and full-vocabulary drafts differ")
    rows = arm_rows(totals)
    for name, row in rows.items():
        print(f"{name:>24}: {row['tok_s']:6.2f} tok/s  {row['speedup']:5.3f}x K = 0  tau {row['tau']:.2f}")
    ratio = rows["draft, compact"]["tok_s"] / rows["draft, full vocabulary"]["tok_s"]
    print(f"compact over full vocabulary: {ratio:.3f}x")
    result = {**arm_result("experiments.compact_drafts", plain.target, a, rows), "compact_over_full": ratio}
    print(f"wrote {write_result(a.out, result)}")


if __name__ == "__main__":
    main()
