"""Spec-Bench style benchmark: per-category tokens/s, speedup over our own K = 0, acceptance and tau.

Every arm sees the same prompts in the same run; arms are interleaved prompt by prompt so that slow drift of a
noisy machine hits them all alike. Peers (transformers `generate()` and its speculative modes) run at batch 1.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field

import torch
from rich.console import Console
from rich.table import Table
from tqdm import tqdm

from specdecode.bench.code_prompts import load_prompts
from specdecode.bench.draft_tradeoff import plot_tradeoff, render_tradeoff, step_costs
from specdecode.bench.lib import Arm, Sample, draft_name, provenance, turn_order, write_result
from specdecode.config import ConfigError, SamplingParams, SpeculativeConfig
from specdecode.prompts import Prompt


class EngineArm:
    """Our engine at batch 1, greedy. Its decoding part, as llama.cpp's tools count theirs: the tokens after the
    first (which the prompt's forward makes) and the time from the first token to the end."""

    def __init__(self, name: str, llm) -> None:
        self.name, self.llm = name, llm

    def run(self, text: str, max_tokens: int) -> Sample:
        t0 = time.perf_counter()
        out = self.llm.generate([text], SamplingParams(temperature=0.0, max_tokens=max_tokens))[0]
        seconds = time.perf_counter() - t0
        m = out.metrics
        trees = "node_acceptance_rate" in m
        decode = m["elapsed_s"] - m.get("time_to_first_token_s", m["elapsed_s"])
        return Sample(
            m["num_generated"], seconds, m["num_drafted"], m["num_accepted"], m["num_target_forwards"], trees,
            decode_seconds=decode or None, decode_tokens=m["num_generated"] - 1,
        )  # fmt: skip


class HFArm:
    """transformers `generate()` with the given extra arguments (prompt lookup, assistant model, ...)."""

    def __init__(self, name: str, model, tokenizer, eos_ids: list[int], **generate_kwargs) -> None:
        self.name, self.model, self.tokenizer = name, model, tokenizer
        self.eos_ids = eos_ids
        self.kwargs = generate_kwargs

    @torch.inference_mode()
    def run(self, text: str, max_tokens: int) -> Sample:
        t0 = time.perf_counter()
        ids = self.tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids
        out = self.model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_tokens,
            do_sample=False,
            eos_token_id=self.eos_ids,
            pad_token_id=self.eos_ids[0],
            **self.kwargs,
        )
        return Sample(out.shape[1] - ids.shape[1], time.perf_counter() - t0)


@dataclass
class ArmResult:
    samples: dict[str, list[Sample]] = field(default_factory=lambda: defaultdict(list))

    @staticmethod
    def summarise(samples: list[Sample]) -> dict[str, float]:
        tokens = sum(s.tokens for s in samples)
        seconds = sum(s.seconds for s in samples)
        drafted = sum(s.drafted for s in samples)
        accepted = sum(s.accepted for s in samples)
        forwards = sum(s.forwards for s in samples)
        decode = {"decode_tokens_per_s": decode_rate(samples)} if all(s.decode_seconds for s in samples) else {}
        return {
            "tokens": tokens,
            "seconds": seconds,
            "tokens_per_s": tokens / seconds if seconds else 0.0,
            # Tree arms get their own name: accepted / drafted nodes is not a chain's per-draft acceptance.
            "node_acceptance_rate" if any(s.trees for s in samples) else "acceptance_rate": (
                accepted / drafted if drafted else 0.0
            ),
            "mean_accepted_tokens": (accepted + forwards) / forwards if forwards else float("nan"),
            **decode,
        }

    def table(self) -> dict[str, dict[str, float]]:
        rows = {cat: self.summarise(s) for cat, s in self.samples.items()}
        rows["overall"] = self.summarise([s for ss in self.samples.values() for s in ss])
        return rows


def decode_rate(samples: list[Sample]) -> float:
    """Tokens per second of decoding alone, prompt evaluation excluded."""
    return sum(s.decode_tokens for s in samples) / sum(s.decode_seconds for s in samples)


def select_prompts(prompts: list[Prompt], per_category: int, categories: list[str] | None = None) -> list[Prompt]:
    """The first `per_category` prompts of each category (all where <= 0), of `categories` only where given: a
    category the file lacks is an error (a typo would otherwise time nothing)."""
    if categories is not None:
        missing = sorted(set(categories) - {p.category for p in prompts})
        if missing:
            raise ConfigError(f"no prompts of categor{'y' if len(missing) == 1 else 'ies'} {', '.join(missing)}")
        prompts = [p for p in prompts if p.category in categories]
    if per_category <= 0:
        return prompts
    seen: dict[str, int] = defaultdict(int)
    picked = []
    for p in prompts:
        if seen[p.category] < per_category:
            seen[p.category] += 1
            picked.append(p)
    return picked


def run_arms(
    arms: list[Arm], texts: list[tuple[str, str]], max_tokens: int, warmup: int, rounds: int = 1
) -> dict[str, ArmResult]:
    """texts: (category, prompt text). Arms interleaved per prompt; with `rounds` > 1 every arm runs each prompt that
    many times in a row of turns, the arms' order reversed every other turn, so that a drift of the machine's speed
    favours no arm (every run is a sample: a category's figures are its runs' sums)."""
    for arm in arms:
        for _, text in texts[:warmup]:
            arm.run(text, min(max_tokens, 16))
    results = {arm.name: ArmResult() for arm in arms}
    for category, text in tqdm(texts, desc="bench", unit="prompt"):
        for turn in range(rounds):
            for arm in turn_order(arms, turn):
                results[arm.name].samples[category].append(arm.run(text, max_tokens))
    return results


def build_arms(a: argparse.Namespace) -> list[Arm]:
    from specdecode.bench import llama_cpp_native, llama_cpp_peer
    from specdecode.llm_args import llm_from_args

    peer_gguf = llama_cpp_peer.require(a.target) if a.llama_cpp else None  # before any model loads
    native_gguf = llama_cpp_native.require(a.target) if a.llama_cpp_native else None
    # Batch 1 needs one cache slot, so the bench takes the model's whole context: long RAG prompts fit.
    batch1 = dict(max_num_seqs=1, max_model_len=a.max_model_len or 8192)
    base = llm_from_args(a, method="none", **batch1)
    arms: list[Arm] = [EngineArm("ours K=0", base)]
    if a.eager_baseline:
        arms.append(EngineArm("ours K=0 eager", llm_from_args(a, method="none", enforce_eager=True, **batch1)))
    if a.methods:  # one arm per method, each on its own engine over the one loaded target, all in this run
        for m in a.methods:
            draft = {"draft": m.draft} if m.draft else {}
            if m.method == "draft":  # its own field, never the default arm's (filled into the command's flags)
                draft["draft_stop_below"] = m.stop_below
                draft["draft_lookup"] = m.lookup
            llm = llm_from_args(
                a,
                method=m.method,
                num_speculative_tokens=m.k,
                controller=m.controller,
                share_target=base,
                **draft,
                **batch1,
            )
            arms.append(EngineArm(f"ours {arm_label(llm.spec, m.draft)}", llm))
    elif a.method != "none":
        llm = llm_from_args(a, share_target=base, **batch1)
        arms.append(EngineArm(f"ours {arm_label(llm.spec)}", llm))
    ours = [arm.llm for arm in arms[1:] if arm.llm.spec.method != "none"]
    if a.peers:
        arms += hf_arms(a, base, ours)
    if peer_gguf is not None:
        arms += llama_cpp_peer.llama_cpp_arms(a, peer_gguf, base, ours)
    if native_gguf is not None:
        arms += llama_cpp_native.native_arms(a, native_gguf, ours)
    return arms


def arm_label(spec: SpeculativeConfig, weights: str | None = None) -> str:
    """'ngram K=8 goodput', 'draft[smollm2-135m-instruct-draft] K=2 fixed', 'eagle[e3] K=8 fixed' for an arm
    given its own weights (a METHOD@DIR arm)."""
    named = weights or (spec.draft if spec.method == "draft" else None)
    name = f"{spec.method}[{draft_name(named)}]" if named else spec.method
    stop = f" stop<{spec.draft_stop_below:g}" if spec.method == "draft" and spec.draft_stop_below else ""
    lookup = f" lookup>={spec.draft_lookup}" if spec.method == "draft" and spec.draft_lookup else ""
    return f"{name} K={spec.num_speculative_tokens} {spec.controller}{stop}{lookup}"


def hf_arms(a: argparse.Namespace, base, ours: list) -> list[Arm]:
    """HF generate, plus per n-gram arm prompt lookup and per draft arm assisted generation, each with our
    arm's K (K_max for a dynamic controller) and the same draft model, at a constant K."""
    dtype = getattr(torch, a.dtype)
    model = hf_model(a.target, dtype).to(a.device).eval()
    eos = sorted(base.engine.eos_token_ids)
    arms: list[Arm] = [HFArm("HF generate", model, base.tokenizer, eos)]
    drafts: dict[str, torch.nn.Module] = {}
    for llm in ours:  # our speculative LLMs, one per arm
        spec = llm.spec
        if spec.method == "ngram":
            k = spec.num_speculative_tokens
            arms.append(HFArm(f"HF prompt lookup K={k}", model, base.tokenizer, eos, prompt_lookup_num_tokens=k))
        elif spec.method == "draft" and spec.draft:
            if spec.draft not in drafts:
                drafts[spec.draft] = hf_model(spec.draft, dtype).to(a.device).eval()
            arms.append(
                HFArm(
                    f"HF assisted [{draft_name(spec.draft)}] K={spec.num_speculative_tokens}",
                    model,
                    base.tokenizer,
                    eos,
                    assistant_model=drafts[spec.draft],
                    num_assistant_tokens=spec.num_speculative_tokens,
                    num_assistant_tokens_schedule="constant",
                )
            )
    return _unique(arms)


def hf_model(spec: str, dtype: torch.dtype):
    """transformers' model of `spec` as its users load it: a GGUF-backed spec (a built-in name, a .gguf path)
    through transformers' own GGUF loader (it dequantizes to `dtype`), anything else from its directory."""
    from transformers import AutoModelForCausalLM

    from specdecode.models.gguf_quantized import gguf_file
    from specdecode.models.loader import resolve_model_dir

    path = gguf_file(spec)
    if path is not None:
        return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype)
    return AutoModelForCausalLM.from_pretrained(resolve_model_dir(spec), dtype=dtype)


def _unique(arms: list[Arm]) -> list[Arm]:
    """Two of our arms with the same peer (e.g. K=5 fixed and goodput) time that peer once."""
    seen: set[str] = set()
    return [a for a in arms if not (a.name in seen or seen.add(a.name))]


def render(results: dict[str, ArmResult], console: Console, notes: dict[str, str] | None = None) -> str:
    """Print one table per arm and return the same as Markdown; `notes` (arm name -> line) become footnotes."""
    base = results["ours K=0"].table()
    md = []
    for name, res in results.items():
        rows = res.table()
        rate = "node_acceptance_rate" if "node_acceptance_rate" in rows["overall"] else "acceptance_rate"
        cols = ("category", "tok/s", "speedup vs K=0", rate.removesuffix("_rate").replace("_", " "), "tau")
        table = Table(title=name)
        for col in cols:
            table.add_column(col, justify="right")
        md += [f"### {name}", "", "| " + " | ".join(cols) + " |", "|---|---|---|---|---|"]
        for cat, r in sorted(rows.items(), key=lambda kv: (kv[0] == "overall", kv[0])):
            speed = r["tokens_per_s"] / base[cat]["tokens_per_s"]
            cells = (
                cat,
                f"{r['tokens_per_s']:.1f}",
                f"{speed:.2f}x",
                f"{r.get(rate, 0.0):.2f}",
                f"{r['mean_accepted_tokens']:.2f}",
            )
            table.add_row(*cells)
            md.append("| " + " | ".join(cells) + " |")
        console.print(table)
        if "decode_tokens_per_s" in rows["overall"]:
            line = f"decoding alone (prompt evaluation excluded): {rows['overall']['decode_tokens_per_s']:.1f} tok/s"
            console.print(f"{name}: {line}", style="dim", markup=False)
            md += ["", f"_{name}: {line}_"]
        if notes and name in notes:
            console.print(f"{name}: {notes[name]}", style="dim", markup=False)
            md += ["", f"_{name}: {notes[name]}_"]
        md.append("")
    return "\n".join(md)


def arm_notes(arms: list[Arm]) -> dict[str, str]:
    """Arm name -> what its figures are not (e.g. llama.cpp's quantized arithmetic), for arms that say."""
    return {arm.name: arm.note for arm in arms if getattr(arm, "note", None)}


def run_from_args(a: argparse.Namespace) -> None:
    prompts = select_prompts(load_prompts(a.prompts, a.split), a.per_category, a.categories)
    arms = build_arms(a)
    chat_tok = arms[0].llm if isinstance(arms[0], EngineArm) else None
    texts = [
        (p.category, chat_tok.apply_chat_template([{"role": "user", "content": p.text}]) if a.chat else p.text)
        for p in prompts
    ]
    results = run_arms(arms, texts, a.max_tokens, a.warmup, a.rounds)
    console = Console(file=sys.stdout)
    notes = arm_notes(arms)
    md = render(results, console, notes)
    costs = step_costs(arms)
    tables = {name: r.table() for name, r in results.items()}
    md += "\n" + render_tradeoff(tables, costs, console)
    if a.json:
        payload = {
            **provenance(model=chat_tok.target if chat_tok is not None else None),
            "num_prompts": len(prompts),
            "max_tokens": a.max_tokens,
            "arms": tables,
            "arm_notes": notes,
            "step_costs": costs,
            "samples": {
                name: {c: [asdict(s) for s in ss] for c, ss in r.samples.items()} for name, r in results.items()
            },
        }
        out = write_result(a.output, payload, indent=1)
        out.with_suffix(".md").write_text(md + "\n")
        if costs:
            plot_tradeoff(tables, costs, out.with_name(out.stem + "_tradeoff.png"))
        console.print(f"wrote {out} and {out.with_suffix('.md')}")
