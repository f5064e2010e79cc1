"""Whether an fp32 CPU linear's output for a row depends on the rows beside it, and what each kind costs.

    python -m experiments.linear_row_invariance [--output results/linear_row_invariance.json]

The kinds an eager model's linears can take (models/fp32_linears.py): plain `F.linear`, MKL-packed, oneDNN-packed
(models/packed_linear.py) and the few-rows GEMM (models/few_rows.py). For each, on random weights of three shapes
(SmolLM2's MLP [576 -> 1536], the tiny test model's [64 -> 192] and its head [64 -> 49152]): at how many of the row
counts 2-99 the first row's output differs, bit for bit, from that row computed alone. Then the time of 30
[576 -> 1536] linears (beyond the caches, as a step streams them) at 1-1,024 rows, the kinds interleaved, median of
the repeats. Then SmolLM2's dense checkpoint on the eager step: how many of the 6 dev code prompts' greedy answers
(16 tokens with log-probabilities) differ batched from alone under token budgets of 32 and 512, with the few-rows
GEMM and with the machine's packing instead.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from specdecode import LLM, SamplingParams
from specdecode.bench.code_prompts import load_prompts
from specdecode.bench.lib import provenance, write_result
from specdecode.models import few_rows, packed_linear
from specdecode.models.loader import resolve_model_dir

SHAPES = ((576, 1536), (64, 192), (64, 49152))
ROWS = (1, 9, 64, 256, 1024)
KINDS = ("plain", "mkl", "onednn", "few-rows")


def wrap(kind: str, lin: nn.Linear) -> nn.Module:
    if kind == "plain":
        return lin
    if kind == "few-rows":
        return few_rows.FewRowsLinear(lin)
    return packed_linear._packer(kind)(lin)


@torch.inference_mode()
def row_counts_that_change_a_row(kind: str, shape: tuple[int, int], most: int = 99) -> list[int]:
    """The row counts n in 2..most at which row 0 of an [n, in] input comes out other than alone."""
    gen = torch.Generator().manual_seed(0)
    lin = nn.Linear(*shape, bias=False).requires_grad_(False)
    nn.init.normal_(lin.weight, generator=gen)
    x = torch.randn(most, shape[0], generator=gen)  # [most, in]
    m = wrap(kind, lin)
    alone = m(x[:1])  # [1, out]
    return [n for n in range(2, most + 1) if not torch.equal(m(x[:n])[:1], alone)]


@torch.inference_mode()
def times_ms(layers: int = 30, repeats: int = 5) -> dict[int, dict[str, float]]:
    """{rows: {kind: ms}} for `layers` [576 -> 1536] linears, the kinds in turn within each repeat."""
    gen = torch.Generator().manual_seed(0)
    plain = [nn.Linear(576, 1536, bias=False).requires_grad_(False) for _ in range(layers)]
    for lin in plain:
        nn.init.normal_(lin.weight, generator=gen)
    stacks = {kind: [wrap(kind, lin) for lin in plain] for kind in KINDS}
    out = {}
    for rows in ROWS:
        x = torch.randn(rows, 576, generator=gen)  # [rows, 576]
        seen: dict[str, list[float]] = {kind: [] for kind in KINDS}
        for rep in range(repeats + 1):  # the first warms up
            for kind in KINDS if rep % 2 else reversed(KINDS):
                t0 = time.perf_counter()
                for m in stacks[kind]:
                    m(x)
                if rep:
                    seen[kind].append((time.perf_counter() - t0) * 1e3)
        out[rows] = {kind: statistics.median(v) for kind, v in seen.items()}
        print(f"  {rows:5d} rows: " + ", ".join(f"{k} {v:.1f} ms" for k, v in out[rows].items()), flush=True)
    return out


def differing_answers(target: str) -> int:
    """How many of 6 dev code prompts' answers differ batched (budgets 32 and 512) from alone, on the eager step."""
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, logprobs=1)
    alone_llm = LLM(target=target, method="none", max_num_seqs=6, enforce_eager=True)
    texts = [alone_llm.apply_chat_template([{"role": "user", "content": p.text}]) for p in load_prompts("code", "dev")]
    texts = texts[:6]
    alone = [repr(alone_llm.generate([t], params)[0].outputs[0].logprobs) for t in texts]
    count = 0
    for budget in (32, 512):
        llm = LLM(
            target=target, method="none", max_num_seqs=6, max_num_batched_tokens=budget, share_target=alone_llm,
            enforce_eager=True,
        )  # fmt: skip
        count += sum(a != repr(o.outputs[0].logprobs) for a, o in zip(alone, llm.generate(texts, params), strict=True))
        llm.close()
    alone_llm.close()
    return count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--output", default="results/linear_row_invariance.json")
    a = ap.parse_args()
    few_rows.require()
    changed = {}
    for shape in SHAPES:
        changed[f"{shape[0]}x{shape[1]}"] = {k: len(row_counts_that_change_a_row(k, shape)) for k in KINDS}
        print(f"  [{shape[0]} -> {shape[1]}] row counts 2-99 that change row 0: {changed[f'{shape[0]}x{shape[1]}']}")
    times = times_ms()
    target = str(resolve_model_dir("smollm2-135m-instruct", progress=False))
    differ = {"few-rows": differing_answers(target)}
    install = few_rows.install
    few_rows.install = lambda model: 0  # every linear keeps the machine's packing
    differ[f"packing ({packed_linear.choice()})"] = differing_answers(target)
    few_rows.install = install
    print(f"  SmolLM2 dense, eager: answers differing batched (of 12): {differ}")
    out = {
        **provenance(module="experiments.linear_row_invariance"),
        "row_counts_changing_row_0_of_98": changed,
        "ms_30_linears_576x1536": times,
        "smollm2_dense_eager_answers_differing_of_12": differ,
    }
    print(f"wrote {write_result(a.output, out)}")


if __name__ == "__main__":
    main()
