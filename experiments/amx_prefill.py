"""Prefill under the fast arithmetic with AMX tiles (models/kernels/quant_int8.cpp) against VNNI, interleaved.

    python -m experiments.amx_prefill [--output results/amx_prefill.json]

Only on a CPU whose OS grants AMX-INT8 (an Intel Xeon of the Sapphire Rapids class or later); elsewhere it says so
and stops. First the linears alone: a 4,864 x 896 weight (the 0.5B's MLP shape) of each 32-weight type, random
blocks, at 8-128 activation rows, the AMX and VNNI paths forced in turn, median of 9. Then, per case, per prompt
length: the time of a one-token request (its prefill and first token) with the op's AUTO taking AMX from 16
activation rows (the default) and with AMX off (`quant_int8.amx_from_rows(0)`), the two alternating, median of the
repeats. Cases: SmolLM2 (its Q4_1 file), the 0.5B draft's file as a target (Q5_0, Q8_0, Q4_K, Q6_K), and the 1.5B
with its default arm (the 0.5B drafting from Q4_1: the draft's prefill takes AMX, the target's K-quants keep VNNI's
code). Then the same 48-token greedy answers either way (the paths' bits are equal).
The text is this repository's docs (never the evaluation prompts).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType as Q
from tqdm import tqdm

from specdecode import LLM, SamplingParams
from specdecode.bench.code_prompts import load_prompts
from specdecode.bench.lib import provenance, write_result
from specdecode.models import quant_int8
from specdecode.models.row_groups import group_rows
from tests.models.test_quant_rows import random_blocks

CASES = (  # (target, method, prompt lengths, repeats)
    ("smollm2-135m-instruct", "none", (128, 512, 2048), 5),
    ("qwen2.5-coder-0.5b-instruct", "none", (128, 512, 2048), 3),
    ("qwen2.5-coder-1.5b-instruct", None, (128, 512), 3),
)
DOCS = ("docs/models.md", "docs/benchmarks.md", "docs/serving.md")
ON, OFF = 16, 0  # amx_from_rows


def linear_times(out: int = 4864, k: int = 896, trials: int = 9) -> dict:
    """{type: {rows: {vnni_ms, amx_ms, ratio}}}: one weight of each type, the two paths forced, alternating."""
    gen, result = np.random.default_rng(0), {}
    for qtype in (Q.Q4_1, Q.Q5_0, Q.Q8_0):  # the K-quants run VNNI's code on the AMX path
        groups = group_rows(random_blocks(qtype, out, k, gen), qtype)
        result[qtype.name] = {}
        for rows in (8, 16, 32, 128):
            x = torch.from_numpy(gen.standard_normal((rows, k), dtype=np.float32))
            times: dict[int, list[float]] = {quant_int8.VNNI: [], quant_int8.AMX: []}
            for trial in range(trials + 1):
                for path in times:
                    t0 = time.perf_counter()
                    quant_int8.quant_int8_grouped_linear(x, groups, qtype, k, out, None, path)
                    if trial:  # the first is a warm-up
                        times[path].append(time.perf_counter() - t0)
            vnni, amx = statistics.median(times[quant_int8.VNNI]), statistics.median(times[quant_int8.AMX])
            result[qtype.name][rows] = {"vnni_ms": vnni * 1e3, "amx_ms": amx * 1e3, "ratio": amx / vnni}
            print(f"  {qtype.name} {rows} rows: VNNI {vnni * 1e3:.3f} ms, AMX {amx * 1e3:.3f} ms ({amx / vnni:.2f}x)")
    return result


def prefill_times(llm: LLM, ids: list[int], lengths: tuple[int, ...], repeats: int) -> dict:
    """{length: {vnni_s, amx_s, ratio}}: one-token requests of the first `length` ids, AMX on and off alternating."""
    one = SamplingParams(temperature=0.0, max_tokens=1)
    out = {}
    for n in tqdm(lengths, desc="prefill", leave=False):
        times: dict[int, list[float]] = {ON: [], OFF: []}
        for rep in range(repeats):
            for rows in (ON, OFF) if rep % 2 else (OFF, ON):
                quant_int8.amx_from_rows(rows)
                t0 = time.perf_counter()
                llm.generate([ids[:n]], one)
                times[rows].append(time.perf_counter() - t0)
        vnni, amx = statistics.median(times[OFF]), statistics.median(times[ON])
        out[n] = {"vnni_s": vnni, "amx_s": amx, "ratio": amx / vnni}
        print(f"  {n} tokens: VNNI {vnni * 1e3:.0f} ms, AMX {amx * 1e3:.0f} ms ({amx / vnni:.3f}x)", flush=True)
    quant_int8.amx_from_rows(ON)
    return out


def same_answers(llm: LLM, texts: list[str]) -> bool:
    """Whether greedy answers (48 tokens) are the same tokens with AMX on and off."""
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    answers = {}
    for rows in (ON, OFF):
        quant_int8.amx_from_rows(rows)
        answers[rows] = [o.token_ids for o in llm.generate(texts, params)]
    quant_int8.amx_from_rows(ON)
    return answers[ON] == answers[OFF]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--output", default="results/amx_prefill.json")
    a = ap.parse_args()
    if quant_int8.AMX not in quant_int8.paths():
        sys.exit("amx_prefill: this CPU (or its OS) gives no AMX-INT8")
    print("linears, 4864 x 896", flush=True)
    linears = linear_times()
    text = "\n".join(Path(p).read_text() for p in DOCS) * 2
    rows = []
    for target, method, lengths, repeats in CASES:
        print(f"{target} (fast, method {method or 'default'})", flush=True)
        kwargs = {"method": method} if method else {}
        llm = LLM(target=target, arithmetic="fast", max_num_seqs=1, max_model_len=max(lengths) + 64, **kwargs)
        ids = llm.encode(text)
        assert len(ids) >= max(lengths), f"the docs make {len(ids)} tokens"
        dev = load_prompts("code", "dev")[:4]
        texts = [llm.apply_chat_template([{"role": "user", "content": p.text}]) for p in dev]
        times = prefill_times(llm, ids, lengths, repeats)
        same = same_answers(llm, texts)
        llm.close()
        print(f"  the same answers with and without AMX: {same}")
        rows.append({"target": target, "method": method or "default", "prefill": times, "same_answers": same})
    out = {**provenance(module="experiments.amx_prefill"), "linears": linears, "cases": rows}
    print(f"wrote {write_result(a.output, out)}")


if __name__ == "__main__":
    main()
