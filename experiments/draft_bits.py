"""What fewer bits a weight would cost the 0.5B draft in agreement: its linears fake-quantized, teacher-forced.

    python -m experiments.draft_bits [--output results/draft_bits_dev.json]

A draft step of the Qwen2.5-Coder 0.5B is its weights' bytes (~255 MB a token, Q4_1 linears: 5 bits a weight), so
a 3-bit draft would read ~30% fewer and draft ~30% faster, if it agreed with the target as often. This measures
that before any kernel is written: the 1.5B's greedy answers (fast arithmetic, K = 0, 128 tokens) to the 16 dev
code prompts (never the eval split), then the draft's top-1 over its drafting vocabulary at each answer token,
teacher-forced, in fp32 (transformers, from the GGUF) with every linear but the head replaced by its values
quantized per block of `block` weights to 2^bits levels between a scale and a minimum kept in fp16 (Q4_1's scheme
at 4 bits and 32; "search" tries 16 clips of the block's range and keeps the one of least squared error), or
by a GGUF type's quantizer, gguf's (llama.cpp's reference) Q4_1 and Q4_0, as models/requantize.py uses them
(`--variants` picks rows by the start of their names; all by default).
Agreement here is fp32's, not the int8 engine's: compare the rows with each other.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
import transformers
from gguf import GGMLQuantizationType as Q
from gguf import quants
from tqdm import tqdm

from specdecode import LLM, SamplingParams
from specdecode.bench.code_prompts import load_prompts
from specdecode.bench.lib import provenance, write_result
from specdecode.drafters.subset_head import load_subset
from specdecode.models.gguf_quantized import gguf_file
from specdecode.models.loader import resolve_model_dir
from specdecode.models.shipped_draft import DRAFT_ASSETS

TARGET, DRAFT = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"


def by_type(qtype: Q):
    """w [out, in] -> its values through gguf's `qtype` quantizer and back."""

    def values(w: torch.Tensor) -> torch.Tensor:
        blocks = quants.quantize(w.numpy(), qtype)
        return torch.from_numpy(quants.dequantize(blocks, qtype).astype(np.float32))

    return values


# (name, (bits, block, search) or a function of the weight); None: the file's own values
VARIANTS = (
    ("Q4_1 (gguf's quantizer)", by_type(Q.Q4_1)),
    ("Q4_0 (gguf's quantizer)", by_type(Q.Q4_0)),
    ("file", None),
    ("4-bit, 32 (Q4_1, as the draft runs)", (4, 32, False)),
    ("3-bit, 32", (3, 32, False)),
    ("3-bit, 32, search", (3, 32, True)),
    ("3-bit, 16, search", (3, 16, True)),
    ("3-bit, 64, search", (3, 64, True)),
    ("2-bit, 32, search", (2, 32, True)),
)
CLIPS = (0.0, 0.05, 0.1, 0.15)  # shares of a block's range cut off its bottom and its top (search)


def answers(max_tokens: int) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, the target's greedy answer ids) for each dev code prompt."""
    llm = LLM(target=TARGET, arithmetic="fast", method="none")
    out = []
    for p in tqdm(load_prompts("code", "dev"), desc="target answers"):
        text = llm.apply_chat_template([{"role": "user", "content": p.text}])
        done = llm.generate([text], SamplingParams(temperature=0.0, max_tokens=max_tokens))[0].outputs[0]
        out.append((llm.encode(text), list(done.token_ids)))
    llm.close()
    return out


def fake_quantized(w: torch.Tensor, bits: int, block: int, search: bool) -> torch.Tensor:
    """w [out, in] with each block of `block` weights along a row rounded to 2^bits levels from an fp16 minimum in
    fp16 steps; search: the clip of the block's range (CLIPS at each end) of least squared error."""
    x = w.reshape(w.shape[0], -1, block)  # [out, blocks, block]
    lo, hi = x.amin(-1, keepdim=True), x.amax(-1, keepdim=True)  # [out, blocks, 1]
    levels = 2**bits - 1
    best, best_err = None, None
    for a, b in [(a, b) for a in CLIPS for b in CLIPS] if search else [(0.0, 0.0)]:
        low, high = lo + a * (hi - lo), hi - b * (hi - lo)
        step = ((high - low) / levels).half().float().clamp(min=1e-7)  # a constant block: any step
        low = low.half().float()
        y = low + ((x - low) / step).round().clamp(0, levels) * step  # [out, blocks, block]
        err = ((y - x) ** 2).sum(-1, keepdim=True)  # [out, blocks, 1]
        if best is None:
            best, best_err = y, err
        else:
            best, best_err = torch.where(err < best_err, y, best), torch.minimum(err, best_err)
    return best.reshape(w.shape)


@torch.inference_mode()
def agreement(model, subset: torch.Tensor, data: list[tuple[list[int], list[int]]]) -> float:
    """Share of answer tokens that are the draft's argmax over its drafting vocabulary subset [S], teacher-forced."""
    hits = total = 0
    for prompt, answer in data:
        logits = model(torch.tensor([prompt + answer[:-1]])).logits[0, len(prompt) - 1 :]  # [len(answer), vocab]
        drafts = subset[logits[:, subset].argmax(-1)]  # [len(answer)]
        hits += int((drafts == torch.tensor(answer)).sum())
        total += len(answer)
    return hits / total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--variants", default=None, help="comma-separated names' prefixes (default: all)")
    ap.add_argument("--output", default="results/draft_bits_dev.json")
    a = ap.parse_args()
    data = answers(a.max_tokens)
    files = resolve_model_dir(DRAFT, weights=False)
    gguf = str(gguf_file(DRAFT))
    model = transformers.AutoModelForCausalLM.from_pretrained(files, gguf_file=gguf, dtype=torch.float32).eval()
    subset = load_subset(DRAFT_ASSETS / f"{DRAFT}.vocab.npy", model.config.vocab_size)
    linears = {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and n != "lm_head"}
    original = {n: m.weight.detach().clone() for n, m in linears.items()}
    rows = {}
    chosen = None if a.variants is None else a.variants.split(",")
    for name, spec in VARIANTS:
        if chosen is not None and not any(name.startswith(c) for c in chosen):
            continue
        with torch.no_grad():
            for n, m in linears.items():
                if spec is None:
                    m.weight.copy_(original[n])
                else:
                    m.weight.copy_(spec(original[n]) if callable(spec) else fake_quantized(original[n], *spec))
        rows[name] = agreement(model, subset, data)
        print(f"{name:40s} agreement {rows[name]:.4f}", flush=True)
    tokens = int(np.sum([len(ans) for _, ans in data]))
    out = {**provenance(module="experiments.draft_bits"), "prompts": len(data), "tokens": tokens, "agreement": rows}
    print(f"wrote {write_result(a.output, out)}")


if __name__ == "__main__":
    main()
