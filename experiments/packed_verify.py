"""What a verify padded to its widest row costs when the target runs only the real tokens (models/llama.packs_rows).

    python -m experiments.packed_verify [--target qwen2.5-coder-1.5b-instruct] [--arithmetic fast]
        [--rows 8] [--context 2048] [--repeats 20] [--out results/packed_verify.json]

One target forward of `rows` rows at `context` cached tokens each (the cache's values do not change what a
forward costs), in four shapes, taking turns so that the machine's drift hits them alike:

- `plain`: one token a row (a K = 0 step);
- `one row drafts`: [rows, 2] with one row's draft real and the other rows' second token padding (a probe of one
  row, or a drafter that matched in one row);
- `half the rows draft`: [rows, 2], half the rows' second token real;
- `every row drafts`: [rows, 2], all real: what the padded batch of the second shape cost before, when padding was
  computed like real tokens.

Reported: the median seconds of each shape over the repeats (the first, a warm-up, dropped) and each one's cost
over `plain`.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from tqdm import tqdm

from specdecode.bench.lib import provenance, write_result
from specdecode.llm import LLM
from specdecode.models.llama import AttentionMetadata


def shapes(rows: int) -> dict[str, tuple[int, list[int]]]:
    """Name -> (tokens per row, real tokens of each row)."""
    half = rows // 2
    return {
        "plain": (1, [1] * rows),
        "one row drafts": (2, [2] + [1] * (rows - 1)),
        "half the rows draft": (2, [2] * half + [1] * (rows - half)),
        "every row drafts": (2, [2] * rows),
    }


def forward_seconds(model, cache, context: int, width: int, real: list[int]) -> float:
    tokens = torch.zeros((len(real), width), dtype=torch.long)  # [rows, width]
    meta = AttentionMetadata.build(list(range(len(real))), [context] * len(real), width, "cpu", num_new=real)
    t0 = time.perf_counter()
    with torch.inference_mode():
        model(tokens, meta, cache)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--arithmetic", default="fast", choices=["exact", "fast"])
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", default="results/packed_verify.json")
    a = ap.parse_args()
    llm = LLM(target=a.target, method="none", arithmetic=a.arithmetic, max_model_len=64)
    model = llm.target
    cache = model.new_cache(a.rows, a.context + 4)
    cases = shapes(a.rows)
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in tqdm(range(a.repeats + 1), desc="packed verify", unit="round"):
        for name, (width, real) in cases.items():
            times[name].append(forward_seconds(model, cache, a.context, width, real))
    medians = {name: statistics.median(ts[1:]) for name, ts in times.items()}
    plain = medians["plain"]
    for name, s in medians.items():
        print(f"{name:>20}: {s * 1e3:7.1f} ms  {s / plain:5.2f}x plain")
    result = {
        **provenance("experiments.packed_verify", model),
        "target": a.target,
        "arithmetic": a.arithmetic,
        "rows": a.rows,
        "context": a.context,
        "repeats": a.repeats,
        "shapes": {name: {"tokens_per_row": w, "real": r} for name, (w, r) in cases.items()},
        "median_s": medians,
        "over_plain": {name: s / plain for name, s in medians.items()},
    }
    print(f"wrote {write_result(a.out, result)}")


if __name__ == "__main__":
    main()
