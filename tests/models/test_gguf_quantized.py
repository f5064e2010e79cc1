"""A model whose GGUF linears stay quantized (models/gguf_quantized.py) gives the dequantized model's logits up to
fp32 summation order: SmolLM2's real Q4_1 file against the loader's fp32 conversion, and tiny GGUFs of mixed
types (q/k/v of three types, a dense F16 and an unsupported Q5_1 linear, tied and untied heads).

The fp32 reference is always the loader's own path (models/loader.py dequantizes, then load_llama), so the
mapping here (rope row order, fusing, the tied head) is checked against code it does not share.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from safetensors.torch import save_file
from torch import nn

from specdecode.config import WEIGHTS_ENV, EngineConfig, SamplingParams
from specdecode.llm import LLM
from specdecode.models import aot_package, few_rows, gguf_quantized, quant_rows
from specdecode.models.compiled import load_target
from specdecode.models.gguf_quantized import (
    ConcatLinear,
    gguf_file,
    load_gguf_quantized,
    quantized_source,
)
from specdecode.models.llama import AttentionMetadata, LlamaModel, load_llama
from specdecode.models.loader import _hf_config, _hf_tensors, resolve_model_dir
from specdecode.models.quant_rows import QuantEmbedding, QuantLinear
from tests.models.test_quant_rows import random_blocks

SMOLLM2 = "smollm2-135m-instruct"
TOLERANCE = 1e-5  # max |logit difference| over the largest |logit|: fp32 summation order only
CHAT = [{"role": "user", "content": "Name two rivers in Europe."}]


pytestmark = pytest.mark.usefixtures("quant_rows_kernel")  # conftest: skips only without a C++ compiler


def logits(model: LlamaModel, prompt: list[int], steps: tuple[int, ...]) -> torch.Tensor:
    """Logits of a prefill of `prompt` minus its last sum(steps) tokens, then forwards of `steps` tokens each
    (rows of one and of several tokens, on the cache the earlier ones filled): [len(prompt), vocab]."""
    cache = model.new_cache(1, len(prompt) + 8)
    sizes = [len(prompt) - sum(steps), *steps]
    out, start = [], 0
    with torch.inference_mode():
        for size in sizes:
            meta = AttentionMetadata.build([0], [start], size, "cpu")
            out.append(model(torch.tensor([prompt[start : start + size]]), meta, cache)[0])  # [size, vocab]
            start += size
    return torch.cat(out)


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want.double()).abs().max() / want.double().abs().max()).item()


def model_bytes(model: nn.Module) -> int:
    tensors = {t.data_ptr(): t for t in [*model.parameters(), *model.buffers()]}  # a tied tensor counts once
    return sum(t.numel() * t.element_size() for t in tensors.values())


# --- SmolLM2's real Q4_1 file ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2_gguf() -> Path:
    return gguf_file(SMOLLM2)


@pytest.fixture(scope="module")
def quantized(smollm2_gguf) -> LlamaModel:
    return load_gguf_quantized(smollm2_gguf)


@pytest.fixture(scope="module")
def dequantized(smollm2_dir) -> LlamaModel:
    return load_llama(smollm2_dir, inference=False)


@pytest.fixture(scope="module")
def prompt(smollm2_tokenizer) -> list[int]:
    text = smollm2_tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    ids = smollm2_tokenizer.encode(text, add_special_tokens=False)
    assert 25 <= len(ids) <= 45  # a chat prompt of ~30 tokens (the template adds a system turn)
    return ids


@pytest.fixture(scope="module")
def reference(dequantized, prompt) -> torch.Tensor:
    return logits(dequantized, prompt, (1, 5, 1))  # [len(prompt), vocab]


def test_smollm2_logits_equal_the_dequantized_models(quantized, prompt, reference):
    """Prefill, then one-token and five-token forwards: every row's logits within fp32 summation error."""
    assert isinstance(quantized.layers[0].attn.wqkv, QuantLinear) and quantized.layers[0].attn.wqkv.qtype == Q.Q4_1
    assert isinstance(quantized.lm_head, QuantLinear) and quantized.lm_head.qtype == Q.Q8_0  # the tied embedding
    assert relative_error(logits(quantized, prompt, (1, 5, 1)), reference) < TOLERANCE


def test_control_rope_rows_left_in_llamacpp_order_fail(smollm2_gguf, prompt, reference, monkeypatch):
    """Negative control: Q and K rows not un-permuted fail the same check by orders of magnitude."""
    monkeypatch.setattr(gguf_quantized, "_unpermute_rope_rows", lambda rows, heads: rows)
    assert relative_error(logits(load_gguf_quantized(smollm2_gguf), prompt, (1, 5, 1)), reference) > 1000 * TOLERANCE


def test_control_one_layers_blocks_swapped_fail(quantized, prompt, reference):
    """Negative control: layer 5's down projection multiplying by layer 6's blocks fails the same check."""
    a, b = quantized.layers[5].mlp.w2, quantized.layers[6].mlp.w2
    a.blocks, b.blocks = b.blocks, a.blocks
    try:
        error = relative_error(logits(quantized, prompt, (1, 5, 1)), reference)
    finally:
        a.blocks, b.blocks = b.blocks, a.blocks
    assert error > 1000 * TOLERANCE


def test_smollm2_dense_head_and_bytes(quantized, dequantized, smollm2_gguf):
    """lm_head_weight() is the fp32 model's head exactly, the embedding's whole table the fp32 model's; the model
    holds the file's bytes and no fp32 copy: the Q8_0 table's blocks (kept, not a 113 MB fp32 table) are the tied
    head's too, and everything is within 1.1x of the file."""
    assert torch.equal(quantized.lm_head_weight(), dequantized.lm_head_weight())
    assert isinstance(quantized.embed, QuantEmbedding) and quantized.embed.qtype == Q.Q8_0
    assert quantized.lm_head.blocks is quantized.embed.blocks  # one copy of the tied table
    assert torch.equal(quantized.embed.dequantized(), dequantized.embed.weight)
    size = smollm2_gguf.stat().st_size
    assert model_bytes(quantized) < 1.1 * size < 0.25 * model_bytes(dequantized)  # fp32: ~5.5x


def greedy(model: LlamaModel, prompt: list[int], n: int) -> list[int]:
    """n greedy tokens by a plain loop: prefill, then one token per forward."""
    cache, out = model.new_cache(1, len(prompt) + n), []
    tokens, start = prompt, 0
    with torch.inference_mode():
        for _ in range(n):
            meta = AttentionMetadata.build([0], [start], len(tokens), "cpu")
            out.append(int(model(torch.tensor([tokens]), meta, cache)[0, -1].argmax()))
            start, tokens = start + len(tokens), out[-1:]
    return out


def test_greedy_decoding_through_llm_equals_the_dequantized_models(dequantized, prompt, monkeypatch):
    """SPECDECODE_WEIGHTS=quantized makes LLM's eager target the quantized model; its 24 greedy tokens are the
    fp32 dequantized model's."""
    monkeypatch.setenv(WEIGHTS_ENV, "quantized")
    llm = LLM(target=SMOLLM2, method="none", controller="fixed", max_num_seqs=1, enforce_eager=True)  # no calibration
    assert isinstance(llm.target.lm_head, QuantLinear)
    got = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True))[0].token_ids
    assert got == greedy(dequantized, prompt, 24)


# --- tiny GGUFs of mixed types ---------------------------------------------------------------------------

HIDDEN, FFN, HEADS, KV_HEADS, VOCAB, LAYERS = 256, 512, 4, 2, 96, 2
# Per tensor: its type (a pair: layer 0's, layer 1's). q/k/v differ (one ConcatLinear of three), gate/up match (one
# QuantLinear), down is F16 in layer 0 and Q5_1 (no kernel path) in layer 1: both dense fp32.
TYPES = {
    "attn_q": Q.Q4_K,
    "attn_k": Q.Q6_K,
    "attn_v": Q.Q8_0,
    "attn_output": (Q.Q5_0, Q.Q4_0),
    "ffn_gate": Q.Q4_1,
    "ffn_up": Q.Q4_1,
    "ffn_down": (Q.F16, Q.Q5_1),
}


def add_matrix(writer: gguf.GGUFWriter, name: str, qtype: Q, out: int, k: int, gen: np.random.Generator) -> None:
    if qtype in (Q.Q4_K, Q.Q6_K):  # gguf-py cannot quantize K-quants: valid random blocks instead
        writer.add_tensor(name, random_blocks(qtype, out, k, gen).numpy(), raw_dtype=qtype)
        return
    w = gen.standard_normal((out, k), dtype=np.float32) * 0.05
    if qtype == Q.F16:
        writer.add_tensor(name, w.astype(np.float16))
    else:
        writer.add_tensor(name, gguf.quants.quantize(w, qtype), raw_dtype=qtype)


def write_tiny_gguf(path: Path, tie: bool, arch: str = "llama", seed: int = 7) -> Path:
    """A tiny GGUF of the mixed TYPES; qwen2 adds random q/k/v biases (F32) and is stored in HF's rope order."""
    gen = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(LAYERS)
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(VOCAB)
    add_matrix(writer, "token_embd.weight", Q.Q8_0, VOCAB, HIDDEN, gen)
    if not tie:
        add_matrix(writer, "output.weight", Q.Q6_K, VOCAB, HIDDEN, gen)
    writer.add_tensor("output_norm.weight", 1 + 0.1 * gen.standard_normal(HIDDEN, dtype=np.float32))
    head_dim = HIDDEN // HEADS
    outs = {"attn_q": HIDDEN, "attn_k": KV_HEADS * head_dim, "attn_v": KV_HEADS * head_dim, "attn_output": HIDDEN}
    outs |= {"ffn_gate": FFN, "ffn_up": FFN, "ffn_down": HIDDEN}
    for i in range(LAYERS):
        for role, qtype in TYPES.items():
            k = FFN if role == "ffn_down" else HIDDEN
            add_matrix(
                writer, f"blk.{i}.{role}.weight", qtype[i] if isinstance(qtype, tuple) else qtype, outs[role], k, gen
            )
        for norm in ("attn_norm", "ffn_norm"):
            writer.add_tensor(f"blk.{i}.{norm}.weight", 1 + 0.1 * gen.standard_normal(HIDDEN, dtype=np.float32))
        if arch == "qwen2":
            for role in ("attn_q", "attn_k", "attn_v"):
                writer.add_tensor(f"blk.{i}.{role}.bias", gen.standard_normal(outs[role], dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def loader_fp32_model(gguf_path: Path, out_dir: Path) -> LlamaModel:
    """The loader's dequantized conversion (without its tokenizer), loaded as the fp32 path loads it."""
    reader = gguf.GGUFReader(gguf_path)
    config = _hf_config(reader, gguf_path)
    out_dir.mkdir()
    save_file(_hf_tensors(reader, config, gguf_path, progress=False), out_dir / "model.safetensors")
    (out_dir / "config.json").write_text(json.dumps(config))
    return load_llama(out_dir, inference=False)


@pytest.mark.parametrize(
    ("tie", "arch"), [(True, "llama"), (False, "llama"), (False, "qwen2")], ids=["tied", "untied", "qwen2"]
)
def test_tiny_mixed_types_equal_the_dequantized_model(tmp_path, tie, arch):
    """qwen2: the q/k/v biases are kept (split over the ConcatLinear's parts) and its rows are not reordered."""
    path = write_tiny_gguf(tmp_path / "tiny.gguf", tie, arch)
    with pytest.warns(UserWarning, match=r"blk\.0\.ffn_down\.weight \(F16\), blk\.1\.ffn_down\.weight \(Q5_1\)"):
        model = load_gguf_quantized(path)
    want = loader_fp32_model(path, tmp_path / "fp32")
    wqkv = model.layers[0].attn.wqkv
    assert isinstance(wqkv, ConcatLinear) and [p.qtype for p in wqkv.parts] == [Q.Q4_K, Q.Q6_K, Q.Q8_0]
    w13 = model.layers[1].mlp.w13
    assert isinstance(w13, QuantLinear) and w13.qtype == Q.Q4_1 and w13.out_features == 2 * FFN
    assert all(type(b.mlp.w2) is nn.Linear for b in model.layers)
    assert model.lm_head.qtype == (Q.Q8_0 if tie else Q.Q6_K)
    assert torch.equal(model.lm_head_weight(), want.lm_head_weight())
    assert torch.equal(wqkv.dequantized(), want.layers[0].attn.wqkv.weight)  # rows in the fp32 model's order
    prompt = np.random.default_rng(8).integers(0, VOCAB, 20).tolist()
    assert relative_error(logits(model, prompt, (1, 4)), logits(want, prompt, (1, 4))) < TOLERANCE


def test_tiny_control_concat_order_swapped_fails(tmp_path, monkeypatch):
    """Negative control: q/k/v parts concatenated in the wrong order (k before q) fail the same check."""
    path = write_tiny_gguf(tmp_path / "tiny.gguf", tie=True)
    want = loader_fp32_model(path, tmp_path / "fp32")
    real = gguf_quantized.ConcatLinear
    monkeypatch.setattr(gguf_quantized, "ConcatLinear", lambda parts: real([parts[1], parts[0], *parts[2:]]))
    with pytest.warns(UserWarning):
        model = load_gguf_quantized(path)
    prompt = np.random.default_rng(8).integers(0, VOCAB, 20).tolist()
    assert relative_error(logits(model, prompt, (1, 4)), logits(want, prompt, (1, 4))) > 1000 * TOLERANCE


def test_refuses_a_gpu_device(smollm2_gguf):
    with pytest.raises(ValueError, match="CPU kernel only"):
        load_gguf_quantized(smollm2_gguf, device="cuda")


def test_weights_setting(tmp_path, monkeypatch):
    """A GGUF on the CPU in float32 keeps its blocks by default; fp32 (argument or environment), another device,
    another dtype or a Hugging Face directory load fp32 tensors; unknown values are refused. The setting is
    resolved once, by EngineConfig (the environment where it is left at None); the loaders get its value."""
    path = write_tiny_gguf(tmp_path / "tiny.gguf", tie=True)
    monkeypatch.delenv(WEIGHTS_ENV, raising=False)
    weights = EngineConfig().weights
    assert quantized_source(str(path), "cpu", "float32", weights) == path
    assert quantized_source(str(path), "cpu", "float32", "fp32") is None
    assert quantized_source(str(path), "cuda", "float32", weights) is None
    assert quantized_source(str(path), "cpu", "bfloat16", weights) is None
    assert quantized_source(str(tmp_path), "cpu", "float32", weights) is None  # a directory: nothing kept quantized
    monkeypatch.setenv(WEIGHTS_ENV, "fp32")
    assert quantized_source(str(path), "cpu", "float32", EngineConfig().weights) is None
    assert quantized_source(str(path), "cpu", "float32", EngineConfig(weights="quantized").weights) == path  # wins
    monkeypatch.setenv(WEIGHTS_ENV, "int4")
    with pytest.raises(ValueError, match="expected 'quantized' or 'fp32'"):
        EngineConfig()


def test_files_only_directory_has_no_weights(tmp_path):
    """weights=False: SmolLM2's directory holds its config and tokenizer, no fp32 safetensors."""
    files = resolve_model_dir(SMOLLM2, cache_dir=tmp_path, progress=False, weights=False)
    assert (files / "config.json").is_file() and (files / "tokenizer.json").is_file()
    assert not list(files.glob("*.safetensors"))
    assert not list(tmp_path.glob("smollm2-135m-instruct-" + "?" * 12))  # no fp32 conversion beside it


@pytest.fixture(scope="module")
def compiled_tiny(tmp_path_factory) -> tuple[LlamaModel, LlamaModel]:
    """(compiled, eager) quantized models of one tiny untied GGUF, the compiled one through load_target's AOT
    package, in the user's cache: a quantized package's key holds the tensors' names, shapes and types, not their
    values, so later runs load it (a compile of the tiny model takes ~30 s on two cores)."""
    root = tmp_path_factory.mktemp("quantized")
    path = write_tiny_gguf(root / "tiny.gguf", tie=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tiny file's dense linears
        compiled = load_target(root, "cpu", torch.float32, enforce_eager=False, progress=False, gguf=path)
        eager = load_gguf_quantized(path)
    return compiled, eager


def test_compiled_quantized_step_equals_eager(compiled_tiny):
    compiled, eager = compiled_tiny
    assert compiled.step.compiled and isinstance(compiled.lm_head, QuantLinear)
    prompt = np.random.default_rng(8).integers(0, VOCAB, 20).tolist()
    assert relative_error(logits(compiled, prompt, (1, 4)), logits(eager, prompt, (1, 4))) < TOLERANCE


def test_compiled_quantized_step_without_the_few_rows_gemm(tmp_path):
    """Where the few-rows GEMM does not serve (a CPU without AVX-512, or $SPECDECODE_FEW_ROWS_GEMM=0) the quantized
    step compiles too, through torch.compile here, and equals the eager model: tracing it once entered the
    kernels' library() and its build checks (os.stat), which dynamo refused (CI on such a CPU, 2026-12-06)."""
    path = write_tiny_gguf(tmp_path / "tiny.gguf", tie=False)
    with pytest.MonkeyPatch.context() as mp, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tiny file's dense linears
        mp.setattr(few_rows, "available", lambda device, dtype: False)
        compiled = load_target(
            tmp_path, "cpu", torch.float32, enforce_eager=False, progress=False, ahead_of_time=False, gguf=path
        )
        eager = load_gguf_quantized(path)
        assert compiled.step.compiled and not any(isinstance(m, few_rows.FewRowsLinear) for m in compiled.modules())
        prompt = np.random.default_rng(9).integers(0, VOCAB, 20).tolist()
        assert relative_error(logits(compiled, prompt, (1, 4)), logits(eager, prompt, (1, 4))) < TOLERANCE


def edit_changes_then_restores(compiled: LlamaModel, seed: int, edit: Callable[[], None], undo: Callable[[], None]):
    """`edit` changes the compiled step's logits on a random prompt far past the tolerance, and `undo` restores
    them bitwise."""
    prompt = np.random.default_rng(seed).integers(0, VOCAB, 12).tolist()
    before = logits(compiled, prompt, (1,))
    edit()
    try:
        changed = logits(compiled, prompt, (1,))
    finally:
        undo()
    assert relative_error(changed, before) > 1000 * TOLERANCE
    assert torch.equal(logits(compiled, prompt, (1,)), before)


def test_compiled_quantized_step_reads_the_models_own_blocks(compiled_tiny):
    """The package holds no copy of the weights: blocks edited in the model change the compiled step's logits
    (one layer's gate/up blocks swapped with another's), and putting them back restores them bitwise."""
    compiled, _ = compiled_tiny
    a, b = compiled.layers[0].mlp.w13.blocks, compiled.layers[1].mlp.w13.blocks
    saved = a.clone()
    edit_changes_then_restores(compiled, 9, lambda: a.copy_(b), lambda: a.copy_(saved))


def test_compiled_quantized_step_calls_the_loaded_kernel(compiled_tiny):
    """The package calls quant_rows_linear by name: a fault set in the library this process loaded (one sub-block
    scale misread) changes its logits, and clearing it restores them bitwise. What lets a package's key hold the
    kernels' op schemas and not their code (models/aot_package.py)."""
    compiled, _ = compiled_tiny
    edit_changes_then_restores(compiled, 10, lambda: quant_rows.set_fault(True), lambda: quant_rows.set_fault(False))


def test_compiled_quantized_step_reads_the_models_own_embedding_blocks(compiled_tiny):
    """The compiled step looks tokens up in the model's QuantEmbedding blocks (handed over by pointer, as the
    linears'): two rows swapped in them change its logits, and swapping them back restores them bitwise."""
    compiled, _ = compiled_tiny
    assert isinstance(compiled.embed, QuantEmbedding) and compiled.embed.qtype == Q.Q8_0
    prompt = np.random.default_rng(9).integers(0, VOCAB, 12).tolist()
    rows, blocks = prompt[-1:] + prompt[:1], compiled.embed.blocks  # the last token's row and the first one's
    assert rows[0] != rows[1]

    def swap() -> None:
        blocks[rows] = blocks[rows[::-1]]

    edit_changes_then_restores(compiled, 9, swap, swap)


def test_greedy_decoding_on_the_compiled_step_equals_the_dequantized_models(dequantized, prompt, monkeypatch):
    """LLM's compiled quantized SmolLM2 (the default on a CPU: blocks kept for the linears and the embedding)
    decodes the fp32 dequantized model's 24 greedy tokens."""
    monkeypatch.setenv(WEIGHTS_ENV, "quantized")
    with warnings.catch_warnings():  # the AOTInductor package, not torch.compile's fallback
        warnings.filterwarnings("error", message="AOTInductor could not package")
        llm = LLM(target=SMOLLM2, method="none", controller="fixed", max_num_seqs=1, enforce_eager=False)
    assert llm.target.step.compiled and isinstance(llm.target.embed, QuantEmbedding)
    got = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True))[0].token_ids
    assert got == greedy(dequantized, prompt, 24)


def test_quantized_and_fp32_models_never_share_a_package(tmp_path, compiled_tiny):
    """The key of a quantized model says so and covers its modules; the fp32 model of the same file differs."""
    _, eager = compiled_tiny
    path = write_tiny_gguf(tmp_path / "tiny.gguf", tie=False)
    fp32 = loader_fp32_model(path, tmp_path / "fp32")
    assert aot_package.is_quantized(eager) and not aot_package.is_quantized(fp32)
    assert aot_package.package_key(eager) != aot_package.package_key(fp32)
