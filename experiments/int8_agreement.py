"""Top-1 agreement of the int8 ("fast") arithmetic with the exact one, teacher-forced on the target's own answers.

    python -m experiments.int8_agreement [--model qwen2.5-coder-1.5b-instruct] [--new-tokens 64] [--out FILE]
        [--context N --prompts-file FILE --texts M]

The exact eager model (GGUF blocks, fp32 activations: models/gguf_quantized.py) answers each code prompt greedily
(chat template); then the prompt + answer is run once through the exact model and once through the same model with
its linears swapped to int8 (models/quant_int8.use_int8), and the argmax at every answer position is compared with
the answer's next token. Prints one line per prompt and the totals.

The int8 model runs twice: over an fp32 KV cache, and over a bf16 one (what `kv_cache_dtype="auto"` gives the fast
arithmetic: models/kv_dtype.py), teacher-forced in pieces of KERNEL_MAX_QUERIES tokens so that the bf16 few-queries
kernel computes it as a decode step would (a longer piece goes to SDPA over the widened cache).
--context N: the prompts are N tokens of --prompts-file's text (never Spec-Bench's; the distillation prompts are
the dev prose) with a question after it, in the chat template, as `bench long-context` builds them: where bf16
attention's rounding has the most keys to add up.
"""

from __future__ import annotations

import argparse
import time
from types import SimpleNamespace

import torch
from transformers import AutoTokenizer

from specdecode.bench.lib import provenance, write_result
from specdecode.bench.long_context import QUESTION, ROW_STRIDE
from specdecode.bench.long_prompt import long_prompt_ids
from specdecode.models import few_rows, quant_int8
from specdecode.models.attention import KERNEL_MAX_QUERIES
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
def teacher_forced_top1(model: LlamaModel, ids: list[int], first: int, piece: int | None = None) -> torch.Tensor:
    """argmax of the logits at positions first-1 .. len-2 (each predicting ids[first..]): in one forward, or in
    forwards of `piece` tokens (the logits at the answer's positions only)."""
    cache = model.new_cache(1, len(ids) + 1)
    piece = piece or len(ids)
    top = []
    for start in range(0, len(ids) - 1, piece):
        stop = min(start + piece, len(ids) - 1)  # positions start .. stop - 1
        meta = AttentionMetadata.build([0], [start], stop - start, "cpu")
        wanted = [p - start for p in range(max(start, first - 1), stop)]
        logits = model(torch.tensor([ids[start:stop]]), meta, cache, logits_index=torch.tensor([wanted or [0]]))
        if wanted:
            top.append(logits[0].argmax(-1))  # [len(wanted)]
    return torch.cat(top)  # [answer]


def long_prompts(tok, n: int, path: str, count: int) -> list[str]:
    """`count` user messages of ~n tokens of the file's text (rows ROW_STRIDE tokens apart) and the question."""
    text = long_prompt_ids(SimpleNamespace(tokenizer=tok), n + (count - 1) * ROW_STRIDE, path)  # what it asks of an LLM
    return [tok.decode(text[i * ROW_STRIDE : i * ROW_STRIDE + n]) + QUESTION for i in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=len(PROMPTS), help="the first N of the prompts")
    parser.add_argument("--out", default=None, help="results file (default results/int8_agreement_<model>.json)")
    parser.add_argument("--context", type=int, default=0, help="prompts of this many tokens of --prompts-file")
    parser.add_argument("--prompts-file", default="../shared/data/distill/prompts.jsonl.gz")
    parser.add_argument("--texts", type=int, default=2, help="long prompts (--context)")
    args = parser.parse_args()
    model = load_gguf_quantized(gguf_file(args.model))
    tok = AutoTokenizer.from_pretrained(resolve_model_dir(args.model))
    runs = []
    prompts = long_prompts(tok, args.context, args.prompts_file, args.texts) if args.context else PROMPTS
    for p in prompts[: args.prompts]:
        text = tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
        prompt = tok(text, add_special_tokens=False).input_ids
        t = time.perf_counter()
        answer = greedy(model, prompt, args.new_tokens, tok.eos_token_id)
        seconds = time.perf_counter() - t
        print(f"answered {len(answer)} tokens in {seconds:.0f} s: {tok.decode(answer)[:60]!r}", flush=True)
        runs.append((prompt, answer))
    exact = [teacher_forced_top1(model, p + a, len(p)) for p, a in runs]
    print(f"swapped {quant_int8.use_int8(model)} linears to int8 (path {quant_int8.paths()[0]})")
    fast = {"fp32": [teacher_forced_top1(model, p + a, len(p)) for p, a in runs]}
    few_rows.require()  # the bf16 few-queries kernel, in pieces a decode step's size
    model.kv_dtype = torch.bfloat16
    fast["bf16"] = [teacher_forced_top1(model, p + a, len(p), KERNEL_MAX_QUERIES) for p, a in runs]
    answers = [torch.tensor(a) for _, a in runs]
    total = sum(len(a) for a in answers)

    def share(tops: list[torch.Tensor], truth: list[torch.Tensor]) -> float:
        return sum(int((x == y).sum()) for x, y in zip(tops, truth, strict=True)) / total

    for i, a in enumerate(answers):
        line = "  ".join(f"int8, {kv} KV = answer {(f[i] == a).float().mean():.3f}" for kv, f in fast.items())
        print(f"{len(a):4d} tokens: exact prefill = answer {(exact[i] == a).float().mean():.3f}, {line}")
    agreement = {kv: {"vs_answer": share(f, answers), "vs_exact_prefill": share(f, exact)} for kv, f in fast.items()}
    print(f"all {total} answer tokens: exact prefill agrees with the greedy answer {share(exact, answers):.4f}")
    for kv, v in agreement.items():
        answer, prefill = v["vs_answer"], v["vs_exact_prefill"]
        print(f"  int8, {kv} KV cache: with the answer {answer:.4f}, with exact prefill {prefill:.4f}")
    out = write_result(
        args.out or f"results/int8_agreement_{args.model}.json",
        {
            **provenance("experiments.int8_agreement"),
            "model": args.model,
            "context": args.context or None,
            "answer_tokens": total,
            "exact_prefill_vs_answer": share(exact, answers),
            "fast_vs_answer": agreement["bf16"]["vs_answer"],  # the fast arithmetic as served (kv_cache_dtype auto)
            "fast_vs_exact_prefill": agreement["bf16"]["vs_exact_prefill"],
            "by_kv_cache_dtype": agreement,
        },
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
