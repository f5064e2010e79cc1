"""A prompt's prefill through SDPA against the few-queries kernel in pieces (models/attention.py), interleaved.

    python -m experiments.prefill_pieces [--output results/prefill_pieces.json]

Per model and arithmetic (SmolLM2 exact and fast, the Qwen2.5-Coder 1.5B fast), per prompt length: the time of a
one-token request (its prefill and first token) with `attention.PREFILL_IN_PIECES` off (SDPA, as before) and on,
the two alternating, median of the repeats. The text is this repository's docs (never the evaluation prompts).
Then batch invariance: the 8 dev code prompts' greedy answers (48 tokens, with log-probabilities) one at a time
against all 8 batched under token budgets of 32 and 2,048, each way: how many answers differ.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from tqdm import tqdm

from specdecode import LLM, SamplingParams
from specdecode.bench.code_prompts import load_prompts
from specdecode.bench.lib import provenance, write_result
from specdecode.models import attention

CASES = (  # (target, arithmetic, prompt lengths, repeats)
    ("smollm2-135m-instruct", "exact", (256, 2048, 7900), 3),
    ("smollm2-135m-instruct", "fast", (256, 2048, 7900), 3),
    ("qwen2.5-coder-1.5b-instruct", "fast", (256, 2048, 8192), 2),
)
DOCS = ("docs/models.md", "docs/benchmarks.md", "docs/serving.md")


def prefill_times(llm: LLM, ids: list[int], lengths: tuple[int, ...], repeats: int) -> dict:
    """{length: {sdpa_s, pieces_s, ratio}}: one-token requests of the first `length` ids, the two paths alternating."""
    one = SamplingParams(temperature=0.0, max_tokens=1)
    out = {}
    for n in tqdm(lengths, desc="prefill", leave=False):
        times: dict[bool, list[float]] = {False: [], True: []}
        for rep in range(repeats):
            for pieces in (True, False) if rep % 2 else (False, True):
                attention.PREFILL_IN_PIECES = pieces
                t0 = time.perf_counter()
                llm.generate([ids[:n]], one)
                times[pieces].append(time.perf_counter() - t0)
        sdpa, pieces = statistics.median(times[False]), statistics.median(times[True])
        out[n] = {"sdpa_s": sdpa, "pieces_s": pieces, "ratio": pieces / sdpa}
        print(f"  {n} tokens: SDPA {sdpa * 1e3:.0f} ms, pieces {pieces * 1e3:.0f} ms ({pieces / sdpa:.3f}x)")
    attention.PREFILL_IN_PIECES = True
    return out


def differing_answers(loaded: LLM, target: str, arithmetic: str, texts: list[str]) -> dict:
    """{sdpa, pieces}: how many of the prompts' answers (tokens and log-probabilities) differ batched from alone,
    over the budgets; every engine shares `loaded`'s target."""
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True, logprobs=1)
    base = LLM(target=target, arithmetic=arithmetic, method="none", max_num_seqs=len(texts), share_target=loaded)
    out = {}
    for pieces in (False, True):
        attention.PREFILL_IN_PIECES = pieces
        alone = [repr(base.generate([t], params)[0].outputs[0].logprobs) for t in texts]
        count = 0
        for budget in (32, 2048):
            llm = LLM(
                target=target, arithmetic=arithmetic, method="none", max_num_seqs=len(texts),
                max_num_batched_tokens=budget, share_target=base,
            )  # fmt: skip
            batched = [repr(o.outputs[0].logprobs) for o in llm.generate(texts, params)]
            count += sum(a != b for a, b in zip(alone, batched, strict=True))
            llm.close()
        out["pieces" if pieces else "sdpa"] = count
    attention.PREFILL_IN_PIECES = True
    base.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--output", default="results/prefill_pieces.json")
    a = ap.parse_args()
    text = "\n".join(Path(p).read_text() for p in DOCS) * 2
    rows = []
    for target, arithmetic, lengths, repeats in CASES:
        print(f"{target} ({arithmetic})", flush=True)
        llm = LLM(target=target, arithmetic=arithmetic, method="none", max_num_seqs=1, max_model_len=max(lengths) + 64)
        ids = llm.encode(text)
        assert len(ids) >= max(lengths), f"the docs make {len(ids)} tokens"
        dev = load_prompts("code", "dev")[:8]
        texts = [llm.apply_chat_template([{"role": "user", "content": p.text}]) for p in dev]
        times = prefill_times(llm, ids, lengths, repeats)
        differ = differing_answers(llm, target, arithmetic, texts)
        llm.close()
        print(f"  answers differing batched (of {2 * len(texts)}): SDPA {differ['sdpa']}, pieces {differ['pieces']}")
        rows.append({"target": target, "arithmetic": arithmetic, "prefill": times, "differing_answers": differ})
    out = {**provenance(module="experiments.prefill_pieces"), "cases": rows}
    print(f"wrote {write_result(a.output, out)}")


if __name__ == "__main__":
    main()
