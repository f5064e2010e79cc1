"""Top-1 agreement of the int8 ("fast") arithmetic with the exact one, teacher-forced on the target's own answers.

    python -m experiments.int8_agreement [--model qwen2.5-coder-1.5b-instruct] [--new-tokens 64] [--out FILE]

The exact eager model (GGUF blocks, fp32 activations: models/gguf_quantized.py) answers each code prompt greedily
(chat template); then the prompt + answer is run once through the exact model and once through the same model with
its linears swapped to int8 (models/quant_int8.use_int8), and the argmax at every answer position is compared with
the answer's next token. Prints one line per prompt and the totals.
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import AutoTokenizer

from specdecode.bench.lib import provenance, write_result
from specdecode.models import quant_int8
from specdecode.models.gguf_quantized import gguf_file, load_gguf_quantized
from specdecode.models.llama import AttentionMetadata, LlamaModel
from specdecode.models.loader import resolve_model_dir

PROMPTS = (
    "Write a Python function `merge_intervals(intervals)` that merges overlapping [start, end] intervals and "
    "returns them sorted. Include a docstring.",
    "Fix the bug in this function and explain it briefly:\n\n```python\ndef mean(xs):\n    total = 0\n"
    "    for x in xs:\n        total += x\n    return total / len(xs) - 1\n```",
    "Translate this JavaScript to idiomatic Python:\n\n```js\nfunction countWords(s) {\n  const m = {};\n"
    "  for (const w of s.split(/\\s+/)) { if (w) m[w] = (m[w] || 0) + 1; }\n  return m;\n}\n```",
    "Explain what this SQL query returns:\n\nSELECT dept, COUNT(*) FROM employees WHERE salary > 50000 "
    "GROUP BY dept HAVING COUNT(*) > 3 ORDER BY 2 DESC;",
    "Write a C function `int is_palindrome(const char *s)` that ignores case and non-alphanumeric characters.",
    "Implement a thread-safe LRU cache class in Python with get and put methods, using collections.OrderedDict.",
)


@torch.inference_mode()
def greedy(model: LlamaModel, prompt: list[int], new_tokens: int, eos: int) -> list[int]:
    cache = model.new_cache(1, len(prompt) + new_tokens + 1)
    tokens, out = torch.tensor([prompt]), []
    for _ in range(new_tokens):
        start = len(prompt) + len(out) - tokens.shape[1]
        meta = AttentionMetadata.build([0], [start], tokens.shape[1], "cpu")
        logits = model(tokens, meta, cache, logits_index=torch.tensor([[tokens.shape[1] - 1]]))  # [1, 1, vocab]
        nxt = int(logits[0, -1].argmax())
        out.append(nxt)
        if nxt == eos:
            break
        tokens = torch.tensor([[nxt]])
    return out


@torch.inference_mode()
def teacher_forced_top1(model: LlamaModel, ids: list[int], first: int) -> torch.Tensor:
    """argmax of the logits at positions first-1 .. len-2 (each predicting ids[first..]) in one forward."""
    cache = model.new_cache(1, len(ids) + 1)
    meta = AttentionMetadata.build([0], [0], len(ids), "cpu")
    index = torch.arange(first - 1, len(ids) - 1)[None]  # [1, answer]
    return model(torch.tensor([ids]), meta, cache, logits_index=index)[0].argmax(-1)  # [answer]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=len(PROMPTS), help="the first N of the prompts")
    parser.add_argument("--out", default=None, help="results file (default results/int8_agreement_<model>.json)")
    args = parser.parse_args()
    model = load_gguf_quantized(gguf_file(args.model))
    tok = AutoTokenizer.from_pretrained(resolve_model_dir(args.model))
    runs = []
    for p in PROMPTS[: args.prompts]:
        text = tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
        prompt = tok(text, add_special_tokens=False).input_ids
        t = time.perf_counter()
        answer = greedy(model, prompt, args.new_tokens, tok.eos_token_id)
        seconds = time.perf_counter() - t
        print(f"answered {len(answer)} tokens in {seconds:.0f} s: {tok.decode(answer)[:60]!r}", flush=True)
        runs.append((prompt, answer))
    exact = [teacher_forced_top1(model, p + a, len(p)) for p, a in runs]
    print(f"swapped {quant_int8.use_int8(model)} linears to int8 (path {quant_int8.paths()[0]})")
    fast = [teacher_forced_top1(model, p + a, len(p)) for p, a in runs]
    agree_exact = agree_fast = fast_exact = total = 0
    for (_, a), e, f in zip(runs, exact, fast, strict=True):
        want = torch.tensor(a)
        n = len(a)
        agree_exact += int((e == want).sum())
        agree_fast += int((f == want).sum())
        fast_exact += int((f == e).sum())
        total += n
        print(
            f"{n:4d} tokens: exact prefill = answer {(e == want).float().mean():.3f}, int8 = answer "
            f"{(f == want).float().mean():.3f}"
        )
    print(
        f"all {total} answer tokens: exact prefill agrees with the greedy answer {agree_exact / total:.4f}; "
        f"int8 agrees with it {agree_fast / total:.4f} and with exact prefill {fast_exact / total:.4f}"
    )
    out = write_result(
        args.out or f"results/int8_agreement_{args.model}.json",
        {
            **provenance("experiments.int8_agreement"),
            "model": args.model,
            "answer_tokens": total,
            "exact_prefill_vs_answer": agree_exact / total,
            "fast_vs_answer": agree_fast / total,
            "fast_vs_exact_prefill": fast_exact / total,
        },
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
