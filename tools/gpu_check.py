"""The GPU check: exactness on CUDA, the compiled step with CUDA graphs, and the step-cost curve of a
Llama-3-8B-shaped model, in one command that fits a short loan of a GPU machine.

Usage:
    python -m tools.gpu_check                      # on a GPU: every section, results/gpu_check.{json,png}
    python -m tools.gpu_check --device cpu --quick # tiny shapes on this CPU (make test runs this)

It runs from the source tree on whatever torch the machine has (the GPU machine brings its own, with no network),
and needs only the pure-Python packages the engine imports. Sections run in order, each inside a try: a section
that raises is recorded with its error and the others still run, and the JSON is rewritten after each, so a run
cut short still leaves what it measured. Sections:

- env: the device, torch and CUDA versions, and the device's copy bandwidth (bytes read + written per second).
- exactness: greedy output of every drafter equals plain decoding, on tiny random models of each family, eager
  and compiled (on CUDA: torch.compile and CUDA graphs per bucket of batch x new tokens).
- distribution: the first two sampled tokens follow the target's exact joint (chi-square), through a chain
  (draft model, rejection sampling) and a tree (Medusa heads), each with a negative control that must fail.
- cost: the step-cost curve of random weights of a real shape (batch x new tokens at a fixed context), eager and
  compiled, against the bandwidth roofline (weight and KV bytes over the measured copy bandwidth).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from specdecode import LLM, SamplingParams
from specdecode.config import METHODS
from specdecode.drafters.layer_select import LayerSkipChoice
from specdecode.models.compiled import compile_step
from specdecode.models.cuda_graphs import GraphedBody
from specdecode.models.llama import AttentionMetadata, LlamaConfig, LlamaModel, StepFunctions, rope_inv_freq
from specdecode.step.runner import prefill
from specdecode.verify.sampling import SamplingTensors, process_logits
from tests.engine.test_distribution import recovered_from_p, target_sample_one_position_late
from tests.engine.test_head_drafters import write_heads
from tests.stats import assert_follows
from tests.tiny import FAMILIES, write_tiny_model

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
PROMPTS = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [11, 12, 13], [20, 21, 22, 23, 24, 20, 21, 22, 40, 41, 20, 21, 22], [3, 4]]
HEAD_METHODS = ("eagle", "medusa", "mtp")

# The shape of Llama-3-8B (bf16: 16 GB of weights) and of a toy model for the CPU run.
SHAPES = {
    "llama3-8b": dict(hidden=4096, inter=14336, layers=32, heads=32, kv_heads=8, vocab=128256),
    "tiny": dict(hidden=64, inter=128, layers=2, heads=4, kv_heads=2, vocab=96),
}
BATCHES = (1, 8, 32)
TOKENS = (1, 2, 5, 9, 17)
DEADLINE = [math.inf]  # perf_counter() past which a section stops starting new families (set by run)


# ---- models and tokenizers ------------------------------------------------------------------------------


def write_tokenizer(path: Path, vocab_size: int) -> None:
    """A word-level tokenizer over `vocab_size` made-up words: the engine needs one, no hub or model ships it."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2} | {f"w{i}": i for i in range(3, vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    fast.save_pretrained(path)


def tiny_model(path: Path, family: str, vocab: int = 96, **kwargs) -> str:
    write_tiny_model(path, family, vocab_size=vocab, **kwargs)
    write_tokenizer(path, vocab)
    return str(path)


@dataclass
class Family:
    """A tiny target of one family and every drafter's assets for it."""

    target: str
    assets: dict[str, str]  # method -> its draft model, heads or layer choice

    @classmethod
    def write(cls, root: Path, family: str) -> Family:
        target = tiny_model(root / "target", family, seed=0)
        assets = {"draft": tiny_model(root / "draft", family, seed=1, num_hidden_layers=1)}
        for kind in HEAD_METHODS:
            assets[kind] = str(write_heads(root / kind, target, kind, 3))
        LayerSkipChoice([0], 0.5, 1.1).save(root / "skip.json")
        assets["layer_skip"] = str(root / "skip.json")
        return cls(target, assets)


def llm(target: str, method: str, device: str, eager: bool, share: LLM | None = None, **kwargs) -> LLM:
    return LLM(
        target=target,
        method=method,
        device=device,
        enforce_eager=eager,
        share_target=share,
        controller="fixed",
        **kwargs,
    )


# ---- exactness ------------------------------------------------------------------------------------------


def exactness(device: str, families: tuple[str, ...], steps: tuple[str, ...], root: Path) -> dict:
    """Greedy tokens of every drafter against plain decoding, per family and step: {family/step/method: ok}."""
    out: dict[str, dict] = {}
    for family in families:
        if time.perf_counter() > DEADLINE[0]:
            out[family] = {"skipped": "time budget spent"}
            continue
        fam = Family.write(root / family, family)
        for step in steps:
            eager = step == "eager"
            t0 = time.perf_counter()
            ref_llm = llm(fam.target, "none", device, eager, max_num_seqs=4)
            reference = [o.token_ids for o in ref_llm.generate(PROMPTS, GREEDY)]
            cell: dict[str, object] = {"load_s": round(time.perf_counter() - t0, 2)}
            for method in METHODS:
                if method == "none":
                    continue
                try:
                    arm = llm(
                        fam.target,
                        method,
                        device,
                        eager,
                        ref_llm,
                        draft=fam.assets.get(method),
                        num_speculative_tokens=4,
                        max_num_seqs=4,
                    )
                    outs = arm.generate(PROMPTS, GREEDY)
                    same = [o.token_ids for o in outs] == reference
                    drafted = sum(o.metrics["num_drafted"] for o in outs)
                    cell[method] = {"equal": same, "drafted": drafted}
                except Exception as e:  # recorded, and the other drafters still run
                    cell[method] = {"equal": False, "error": f"{type(e).__name__}: {e}"}
            cell["seconds"] = round(time.perf_counter() - t0, 2)
            out[f"{family}/{step}"] = cell
            print(
                f"exactness {family}/{step}: "
                + " ".join(f"{m}={'ok' if v['equal'] else 'FAIL'}" for m, v in cell.items() if isinstance(v, dict)),
                flush=True,
            )
    return out


# ---- distribution ---------------------------------------------------------------------------------------

DIST_VOCAB = 8
DIST_N = 2000
DIST_PARAMS = SamplingParams(temperature=1.0, top_k=6, top_p=0.95, max_tokens=5, ignore_eos=True)
# path -> (method, prompt, the fault its negative control injects)
DIST_PATHS = {
    "chain": ("draft", [3], recovered_from_p),
    "tree": ("medusa", [3, 7, 1, 5], target_sample_one_position_late),
}


def exact_joint(model: LlamaModel, prompt: list[int], device: str) -> torch.Tensor:
    """[vocab, vocab] P(x1, x2 | prompt) under the processed target distribution, on `device`."""
    st = SamplingTensors.from_params([DIST_PARAMS], device)
    cache = model.new_cache(1, 32)
    with torch.inference_mode():
        p1 = process_logits(prefill(model, cache, 0, prompt, 64), st)[0, 0]  # [vocab]
        rows = []
        for x1 in range(DIST_VOCAB):
            cache.set_length(0, len(prompt))
            rows.append(process_logits(prefill(model, cache, 0, [x1], 64), st)[0, 0])
    return (p1[:, None] * torch.stack(rows)).double().cpu()  # [vocab, vocab]


def sampled_joint(arm: LLM, prompt: list[int], n: int) -> tuple[torch.Tensor, int]:
    """[vocab, vocab] counts of (x1, x2) over n requests (every other one seeded), and the drafts verified."""
    outs = arm.generate([prompt] * n, [replace(DIST_PARAMS, seed=i if i % 2 else None) for i in range(n)])
    counts = torch.zeros(DIST_VOCAB, DIST_VOCAB)
    for o in outs:
        counts[o.token_ids[0], o.token_ids[1]] += 1
    return counts, sum(o.metrics["num_drafted"] for o in outs)


def distribution(device: str, steps: tuple[str, ...], root: Path, n: int = DIST_N) -> dict:
    """Chi-square / critical for each path, intact (< 1 passes) and with its fault (must reach 3x)."""
    target = tiny_model(root / "target", "llama", DIST_VOCAB, seed=0, embed_scale=8.0, num_hidden_layers=3)
    assets = {
        "draft": tiny_model(root / "draft", "llama", DIST_VOCAB, seed=5, embed_scale=8.0, num_hidden_layers=1),
        "medusa": str(write_heads(root / "medusa", target, "medusa", 3)),
    }
    out = {}
    for step in steps:
        for path, (method, prompt, fault) in DIST_PATHS.items():
            for faulty in (False, True):
                arm = llm(
                    target,
                    method,
                    device,
                    step == "eager",
                    draft=assets[method],
                    num_speculative_tokens=4,
                    max_num_seqs=1024,
                    max_model_len=32,
                    max_num_batched_tokens=16384,
                )
                with pytest_monkeypatch() as mp:
                    if faulty:
                        fault(mp, arm)
                    counts, drafted = sampled_joint(arm, prompt, n)
                exact = exact_joint(arm.target, prompt, device)
                name = f"{step}/{path}/{'fault' if faulty else 'intact'}"
                try:
                    ratio = assert_follows(counts, exact, fault.__name__ if faulty else None)
                    ok = drafted >= n
                except AssertionError as e:
                    ratio, ok = float("nan"), False
                    print(f"distribution {name}: {e}", flush=True)
                out[name] = {"chi2_over_critical": round(ratio, 3), "drafted": drafted, "pass": ok}
                print(f"distribution {name}: {out[name]}", flush=True)
    return out


def pytest_monkeypatch():
    import pytest

    return pytest.MonkeyPatch.context()


# ---- the step-cost curve --------------------------------------------------------------------------------


def random_model(shape: str, device: str, dtype: torch.dtype) -> LlamaModel:
    """Random weights of a real shape (a step's cost does not depend on the values), built on the device."""
    s = SHAPES[shape]
    cfg = LlamaConfig(
        model_type="llama",
        vocab_size=s["vocab"],
        hidden_size=s["hidden"],
        intermediate_size=s["inter"],
        num_layers=s["layers"],
        num_heads=s["heads"],
        num_kv_heads=s["kv_heads"],
        head_dim=s["hidden"] // s["heads"],
        rope_theta=500000.0,
        rms_eps=1e-5,
        max_position=8192,
        tie_embeddings=False,
        qkv_bias=False,
        o_bias=False,
        qk_norm=False,
    )
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaModel(cfg)
    finally:
        torch.set_default_dtype(default)
    with torch.no_grad():  # small weights: activations stay finite through 32 layers in bf16
        for p in model.parameters():
            p.normal_(0.0, 0.02)
    model.inv_freq = rope_inv_freq(cfg).to(device)  # fp32 whatever the weights' dtype
    return model.eval().requires_grad_(False)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def copy_bandwidth(device: str, nbytes: int) -> float:
    """Bytes read plus written per second by a device-to-device copy (median of 10)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(10):
        sync(device)
        t0 = time.perf_counter()
        dst.copy_(src)
        sync(device)
        times.append(time.perf_counter() - t0)
    return 2 * nbytes / statistics.median(times)


def step_bytes(model: LlamaModel, batch: int, context: int) -> int:
    """What one step must read: every weight but the embedding table (it reads one row a token) and each row's
    cached keys and values."""
    cfg = model.cfg
    weights = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if not n.startswith("embed."))
    kv = batch * context * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 2 * model.embed.weight.element_size()
    return weights + kv


def time_step(model: LlamaModel, cache, batch: int, tokens: int, context: int, device: str, reps: int) -> float:
    """Median seconds of one [batch, tokens] forward (logits at every position) after `context` cached tokens."""
    ids = torch.randint(0, model.cfg.vocab_size, (batch, tokens), device=device)  # [B, T]
    meta = AttentionMetadata.build(list(range(batch)), [context] * batch, tokens, device, max_len=cache.max_len)
    with torch.inference_mode():
        for _ in range(3):  # the first call at a shape compiles, captures or picks kernels
            model(ids, meta, cache)
        times = []
        for _ in range(reps):
            sync(device)
            t0 = time.perf_counter()
            model(ids, meta, cache)
            sync(device)
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def cost_curve(
    model: LlamaModel, device: str, context: int, bandwidth: float, reps: int, batches=BATCHES, tokens=TOKENS
) -> list[dict]:
    cache = model.new_cache(max(batches), context + max(tokens) + 16)
    # One discarded pass at the first shape: the H200's first row measured (eager 1 x 1) had read 29.0 ms against
    # 17.7-19.9 for the rows after it, its 3 warm-up calls not enough for the host and the card to settle.
    time_step(model, cache, batches[0], tokens[0], context, device, reps)
    rows = []
    for b in batches:
        for t in tokens:
            s = time_step(model, cache, b, t, context, device, reps)
            roof = step_bytes(model, b, context) / bandwidth
            rows.append({"batch": b, "tokens": t, "ms": round(s * 1e3, 3), "roofline_ms": round(roof * 1e3, 3)})
    return rows


def with_step(model: LlamaModel, mode: str, device: str) -> float:
    """Put the model on one of the step modes; returns seconds spent compiling."""
    eager = StepFunctions(model.body, model.head)
    if mode == "eager":
        model.step = eager
        return 0.0
    if mode == "eager+graphs":
        model.step = replace(eager, body=GraphedBody(model.body, capture=device == "cuda"))
        return 0.0
    return compile_step(model, progress=False, ahead_of_time=False)  # on CUDA: compiled, then graphed


def cost(
    device: str, shape: str, dtype: torch.dtype, context: int, modes: tuple[str, ...], reps: int, env: dict
) -> dict:
    model = random_model(shape, device, dtype)
    result: dict = {"shape": shape, "dtype": str(dtype).removeprefix("torch."), "context": context, "curves": {}}
    for mode in modes:
        t0 = time.perf_counter()
        try:
            compile_s = with_step(model, mode, device)
            result["curves"][mode] = {
                "rows": cost_curve(model, device, context, env["copy_bandwidth"], reps),
                "compile_s": round(compile_s, 1),
                "seconds": round(time.perf_counter() - t0, 1),
            }
        except Exception as e:
            result["curves"][mode] = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-3000:]}
        print(f"cost {shape}/{mode}: {json.dumps(result['curves'][mode])[:600]}", flush=True)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return result


def targets(curves: dict) -> dict:
    """The issue's targets, computed from the curves (None where a curve is missing)."""

    def ms(mode: str, b: int, t: int) -> float | None:
        rows = curves.get(mode, {}).get("rows", [])
        return next((r["ms"] for r in rows if r["batch"] == b and r["tokens"] == t), None)

    def roof(b: int, t: int) -> float | None:
        rows = next((c["rows"] for c in curves.values() if "rows" in c), [])
        return next((r["roofline_ms"] for r in rows if r["batch"] == b and r["tokens"] == t), None)

    def ratio(a, b):
        return None if a is None or not b else round(a / b, 3)

    best = "compiled" if "compiled" in curves and "rows" in curves["compiled"] else "eager"
    return {
        "step_mode": best,
        "b1t1_over_roofline": ratio(ms(best, 1, 1), roof(1, 1)),
        "t9_over_t1": ratio(ms(best, 1, 9), ms(best, 1, 1)),
        "b32t5_over_b1t1": ratio(ms(best, 32, 5), ms(best, 1, 1)),
        "eager_over_compiled_b1t1": ratio(ms("eager", 1, 1), ms("compiled", 1, 1)),
    }


# ---- the run --------------------------------------------------------------------------------------------


def environment(device: str) -> dict:
    env = {
        "device": device,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "host": platform.node(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        env |= {
            "name": props.name,
            "cuda": torch.version.cuda,
            "capability": f"{props.major}.{props.minor}",
            "memory_gib": round(props.total_memory / 2**30, 1),
            "multiprocessors": props.multi_processor_count,
        }
    else:
        env["name"] = platform.processor() or platform.machine()
    env["copy_bandwidth"] = copy_bandwidth(device, 2**31 if device == "cuda" else 2**26)
    return env


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = result.get("cost", {}).get("curves", {})
    fig, axes = plt.subplots(1, len(BATCHES), figsize=(5 * len(BATCHES), 4), squeeze=False)
    for ax, b in zip(axes[0], BATCHES, strict=True):
        for mode, c in curves.items():
            rows = [r for r in c.get("rows", []) if r["batch"] == b]
            if rows:
                ax.plot([r["tokens"] for r in rows], [r["ms"] for r in rows], "o-", label=mode)
                roof = rows
        if any(c.get("rows") for c in curves.values()):
            ax.plot([r["tokens"] for r in roof], [r["roofline_ms"] for r in roof], "k--", label="bandwidth roofline")
        ax.set(title=f"batch {b}", xlabel="new tokens per row", ylabel="ms per step", ylim=(0, None))
        ax.legend()
    env = result["env"]
    fig.suptitle(f"{result.get('cost', {}).get('shape', '')} step cost, {env.get('name')}, torch {env['torch']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def run(args: argparse.Namespace) -> dict:
    device = args.device
    quick = args.quick
    families = ("llama",) if quick else FAMILIES
    steps = ("eager",) if quick else ("eager", "compiled")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result: dict = {"command": "python -m tools.gpu_check " + " ".join(args.argv), "sections": {}}
    t_start = time.perf_counter()
    DEADLINE[0] = t_start + args.budget_s

    def save() -> None:
        result["seconds"] = round(time.perf_counter() - t_start, 1)
        out.with_suffix(".json").write_text(json.dumps(result, indent=1, default=str) + "\n")

    def section(name: str, fn: Callable[[], object]) -> None:
        left = args.budget_s - (time.perf_counter() - t_start)
        if args.sections and name != "env" and name not in args.sections:
            return
        if left < 0:
            result["sections"][name] = {"skipped": "time budget spent"}
            print(f"{name}: skipped, time budget spent", flush=True)
            return save()
        t0 = time.perf_counter()
        try:
            result[name] = fn()
            result["sections"][name] = {"ok": True, "seconds": round(time.perf_counter() - t0, 1)}
        except Exception as e:
            result["sections"][name] = {
                "ok": False,
                "error": f"{type(e).__name__}: {e}",
                "trace": traceback.format_exc()[-4000:],
            }
            print(f"{name}: FAILED {type(e).__name__}: {e}\n{traceback.format_exc()}", flush=True)
        save()

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        section("env", lambda: environment(device))
        if "env" not in result:
            return result
        shape = "tiny" if quick else "llama3-8b"
        dtype = torch.float32 if device == "cpu" else torch.bfloat16
        modes = ("eager", "eager+graphs") if quick else ("eager", "eager+graphs", "compiled")
        context, reps = (64, 3) if quick else (1024, 20)
        n = 400 if quick else DIST_N
        # Cheap and most telling first: a run cut short by its budget still has exactness on the eager step.
        for step in steps[:1]:
            section(f"exactness_{step}", lambda s=step: exactness(device, families, (s,), root / f"exact_{s}"))
            section(f"distribution_{step}", lambda s=step: distribution(device, (s,), root / f"dist_{s}", n))
        section("cost", lambda: cost(device, shape, dtype, context, modes, reps, result["env"]))
        if not quick:  # the tiny families' step, compiled against eager, as the exactness runs use it
            section("cost_tiny", lambda: cost(device, "tiny", dtype, 64, modes, reps, result["env"]))
        for step in steps[1:]:
            section(f"exactness_{step}", lambda s=step: exactness(device, families, (s,), root / f"exact_{s}"))
            section(f"distribution_{step}", lambda s=step: distribution(device, (s,), root / f"dist_{s}", n))
    result["targets"] = targets(result.get("cost", {}).get("curves", {}))
    result["targets"]["tiny_eager_over_compiled_b1t1"] = targets(result.get("cost_tiny", {}).get("curves", {}))[
        "eager_over_compiled_b1t1"
    ]
    result["passed"] = all(s.get("ok") for s in result["sections"].values()) and passed(result)
    save()
    plot(result, out.with_suffix(".png"))
    return result


def passed(result: dict) -> bool:
    exact = [
        v.get("equal")
        for k in result
        if k.startswith("exactness_")
        for cell in result[k].values()
        for v in cell.values()
        if isinstance(v, dict)
    ]
    dist = [v["pass"] for k in result if k.startswith("distribution_") for v in result[k].values()]
    return all(exact) and all(dist)


def print_summary(result: dict) -> None:
    env = result.get("env", {})
    print(
        f"\n== gpu check: {env.get('name')} torch {env.get('torch')} cuda {env.get('cuda')}; "
        f"copy {env.get('copy_bandwidth', 0) / 1e9:.0f} GB/s; {result.get('seconds')} s"
    )
    for name, s in result["sections"].items():
        print(f"  {name}: {'ok' if s.get('ok') else s}")
    for mode, c in result.get("cost", {}).get("curves", {}).items():
        rows = c.get("rows", [])
        line = " ".join(f"{r['batch']}x{r['tokens']}:{r['ms']:.2f}" for r in rows)
        print(f"  cost {mode} (compile {c.get('compile_s')} s): {line or c.get('error')}")
    if rows := result.get("cost", {}).get("curves", {}).get("eager", {}).get("rows"):
        print("  roofline ms: " + " ".join(f"{r['batch']}x{r['tokens']}:{r['roofline_ms']:.2f}" for r in rows))
    print(f"  targets: {result.get('targets')}")
    print(f"  passed: {result.get('passed')}")


def main(argv: list[str] | None = None) -> int:
    import sys

    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--quick", action="store_true", help="tiny shapes, one family, eager only (CPU runs)")
    parser.add_argument("--out", default="results/gpu_check", help="path stem of the JSON and PNG written")
    parser.add_argument("--sections", nargs="*", help="run only these sections (env always runs)")
    parser.add_argument("--budget-s", type=float, default=420.0, help="sections not started by then are skipped")
    args = parser.parse_args(argv)
    args.argv = argv
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; use --device cpu", file=sys.stderr)
        return 2
    result = run(args)
    print_summary(result)
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
