"""The real Qwen2.5-Coder pair (qwen2 GGUFs assembled from PyPI chunk packages) against transformers, and the
loader on hand-made GGUFs of every Llama-family architecture, good and bad.

The real-pair tests need `make models` (CI runs it before `make test`); without it they are skipped with the
reason, never passed. Memory: one big model at a time (module-scoped, freed after use): the 1.5B is 7.1 GB in
fp32 (28 layers + an untied 151,936 x 1,536 head), so transformers' copy is made, used and freed before ours
is loaded.
"""

from __future__ import annotations

import gc
import hashlib
import re
import subprocess
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import transformers
from gguf import GGMLQuantizationType as Q
from safetensors.torch import load_file, save_file

import specdecode.llm
from specdecode import LLM, SamplingParams
from specdecode.cli import main
from specdecode.drafters.subset_head import SubsetLMHead
from specdecode.models import kv_dtype, loader
from specdecode.models.disk_cache import build_once, cache_root
from specdecode.models.gguf_quantized import gguf_file, load_gguf_quantized
from specdecode.models.llama import AttentionMetadata, load_llama
from specdecode.models.loader import BUILTIN_MODELS, ModelLoadError, resolve_model_dir
from specdecode.models.quant_int8 import Int8QuantLinear
from specdecode.models.quant_rows import QuantLinear
from tests.models.conftest import SMOLLM2
from tests.models.conftest import pair_missing as _pair_missing
from tests.models.gguf_files import tiny_with_biases, write_gguf

REFERENCE_FILE = "logits.safetensors"
TARGET, DRAFT = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"
PROMPT = "Write a Python function that returns the n-th Fibonacci number."


needs_pair = pytest.mark.skipif(bool(_pair_missing()), reason=f"run `make models`: {_pair_missing()}")


# --- the real pair -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def qwen_tokenizer():
    return transformers.AutoTokenizer.from_pretrained(resolve_model_dir(DRAFT))


@pytest.fixture(scope="module")
def chat_ids(qwen_tokenizer) -> list[int]:
    return qwen_tokenizer.apply_chat_template(
        [{"role": "user", "content": PROMPT}], add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]


def transformers_logits(name: str, ids: list[int]) -> torch.Tensor:
    """[T, vocab] transformers' fp32 logits, its own dequantization of the GGUF, kept in the user's cache: loading
    the GGUF into transformers (its Python dequantization of every block) took 38-55 s a model on each run of the
    suite. The entry is keyed by the file (its directory is named by its sha256), the prompt's ids and the
    transformers and torch versions, so it is transformers' answer to the same question; it is written as the
    cache's other entries are (`build_once`: complete or absent, this user's alone)."""
    path = BUILTIN_MODELS[name].gguf_path(name)
    key = hashlib.sha256(repr((str(path), ids, transformers.__version__, torch.__version__)).encode()).hexdigest()

    def build(tmp: Path) -> None:
        save_file({"logits": _transformers_logits(path, ids).contiguous()}, tmp / REFERENCE_FILE)

    entry = build_once(cache_root() / "test_references" / f"{name}-{key[:24]}", build)
    return load_file(entry / REFERENCE_FILE)["logits"]


def _transformers_logits(path: Path, ids: list[int]) -> torch.Tensor:
    model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    with torch.inference_mode():
        logits = model.eval()(torch.tensor([ids])).logits[0]
    del model
    gc.collect()
    return logits


def our_logits(model, ids: list[int]) -> torch.Tensor:
    """[T, vocab] logits of our eager fp32 step over the whole prompt."""
    cache = model.new_cache(1, len(ids) + 1)
    with torch.inference_mode():
        return model(torch.tensor([ids]), AttentionMetadata.build([0], [0], len(ids), "cpu"), cache)[0]


@pytest.fixture(scope="module")
def reference_logits(chat_ids) -> Callable[[str], torch.Tensor]:
    """name -> transformers' [T, vocab] logits on the chat prompt, each computed once per module."""
    cached: dict[str, torch.Tensor] = {}

    def get(name: str) -> torch.Tensor:
        if name not in cached:
            cached[name] = transformers_logits(name, chat_ids)
        return cached[name]

    return get


@needs_pair
@pytest.mark.parametrize("name", [DRAFT])
def test_logits_match_transformers_on_the_gguf(name, chat_ids, reference_logits):
    """The dequantized fp32 reference path (--weights fp32) on the 0.5B, whose file holds every block type the 1.5B's
    does (Q4_K, Q6_K) and more (Q5_0, Q8_0). The 1.5B is checked as it serves, blocks kept, just below: its fp32
    conversion (7.1 GB written, then read) served this one comparison alone."""
    want = reference_logits(name)
    model = load_llama(resolve_model_dir(name), inference=False)  # packed linears would double the 7.1 GB
    assert model.cfg.model_type == "qwen2" and model.cfg.qkv_bias and not model.cfg.tie_embeddings
    assert (our_logits(model, chat_ids) - want).abs().max() < 1e-3
    del model
    gc.collect()


@needs_pair
def test_negative_control_llama_rope_order_on_qwen2_fails(chat_ids, reference_logits):
    """The llama.cpp q/k row order that llama GGUFs need undone, wrongly undone on the 0.5B too: the same
    comparison fails (so it does see the permutation)."""
    model = load_llama(resolve_model_dir(DRAFT), inference=False)  # plain linears, so weights edit in place
    cfg = model.cfg
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    with torch.no_grad():
        for layer in model.layers:
            for p in (layer.attn.wqkv.weight, layer.attn.wqkv.bias):  # [q + 2 kv, hidden] and [q + 2 kv]
                p[:q] = loader._unpermute_rope_rows(p[:q].clone(), cfg.num_heads)
                p[q : q + kv] = loader._unpermute_rope_rows(p[q : q + kv].clone(), cfg.num_kv_heads)
    assert (our_logits(model, chat_ids) - reference_logits(DRAFT)).abs().max() > 1e-3
    del model
    gc.collect()


@needs_pair
@pytest.mark.parametrize("name", [DRAFT, TARGET])
def test_quantized_logits_match_transformers_on_the_gguf(name, chat_ids, reference_logits):
    """The model as it loads by default, its blocks kept (eager here: the compiled step is checked against the
    eager one in test_gguf_quantized), against transformers' fp32 dequantization of the same file."""
    model = load_gguf_quantized(gguf_file(name))
    assert isinstance(model.lm_head, QuantLinear) and model.cfg.qkv_bias
    assert (our_logits(model, chat_ids) - reference_logits(name)).abs().max() < 1e-3
    del model
    gc.collect()


@pytest.fixture(scope="module")
def plain_15b() -> LLM:
    """K = 0 on the 1.5B as it serves by default: blocks kept, compiled step (shared by the drafters' LLMs)."""
    llm = LLM(target=TARGET, method="none", controller="fixed", max_num_seqs=1, max_model_len=1024, enforce_eager=False)
    assert isinstance(llm.target.lm_head, QuantLinear) and llm.target.step.compiled
    yield llm
    del llm
    gc.collect()


GREEDY_20 = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
CHAT = [[{"role": "user", "content": PROMPT}]]


@pytest.fixture(scope="module")
def plain_15b_output(plain_15b):
    """K = 0's 20 greedy tokens on the chat prompt, decoded once for the three drafters (~3 s of the 1.5B each)."""
    return plain_15b.chat(CHAT, GREEDY_20)[0]


@needs_pair
@pytest.mark.parametrize(
    ("method", "draft_arithmetic", "draft_weights"),
    [("draft", "fast", "q4_0"), ("draft", "exact", "file"), ("ngram", "fast", "q4_0"), ("suffix", "fast", "q4_0")],
)
def test_drafters_greedy_equal_plain_decoding_on_the_quantized_15b(
    method, draft_arithmetic, draft_weights, plain_15b, plain_15b_output
):
    """20 greedy tokens of each drafter (K = 4 at every step) are K = 0's; the 0.5B draft loads as it does by
    default (fast arithmetic, linears requantized to Q4_0: drafts need not be exact) or as the file defines it
    (exact arithmetic, the file's blocks), under the exact target."""
    defaults = draft_arithmetic == "fast" and draft_weights == "q4_0"
    spec = LLM(
        target=TARGET,
        method=method,
        num_speculative_tokens=4,
        controller="fixed",  # K = 4 at every step: drafts are really verified, whatever a cost model says
        max_num_seqs=1,
        max_model_len=1024,
        enforce_eager=False,  # the suite's default is eager (tests/conftest.py): this is the serving step
        share_target=plain_15b,
        **({} if defaults else {"draft_arithmetic": draft_arithmetic, "draft_weights": draft_weights}),
    )
    if method == "draft":
        assert spec.spec.draft == DRAFT  # the 1.5B's default draft
        assert spec.draft_model.step.compiled
        # the fast draft's cache is bf16 (models/kv_dtype.py) where the exact target's stays fp32
        fast = draft_arithmetic == "fast" and kv_dtype.bf16_serves(spec.draft_model)
        assert spec.draft_model.new_cache(1, 8).k.dtype == (torch.bfloat16 if fast else torch.float32)
        assert spec.engine.cache.k.dtype == torch.float32
        head = spec.draft_model.lm_head  # its shipped drafting vocabulary, over the file's Q8_0 head or its Q4_0
        kind = Int8QuantLinear if draft_arithmetic == "fast" else QuantLinear
        assert isinstance(head, SubsetLMHead) and type(head.head.linear) is kind
        assert head.head.linear.qtype == (Q.Q4_0 if draft_weights == "q4_0" else Q.Q8_0)
        assert head.head.linear.out_features == 32768
        assert type(spec.target.lm_head) is QuantLinear  # the target stays exact
    got = spec.chat(CHAT, GREEDY_20)[0]
    assert "def" in plain_15b_output.text
    assert got.token_ids == plain_15b_output.token_ids
    if method == "draft":
        assert got.metrics["num_accepted"] > 0  # the 0.5B really drafted (same tokenizer, same family)
    del spec
    gc.collect()


@pytest.fixture(scope="module")
def fast_15b_output() -> tuple[LLM, list[int]]:
    """K = 0 on the 1.5B in the fast arithmetic (eager: the grouped K-quant kernel without a package to compile)
    and its 20 greedy tokens."""
    llm = LLM(target=TARGET, method="none", controller="fixed", max_num_seqs=1, max_model_len=1024, arithmetic="fast")
    yield llm, llm.chat(CHAT, GREEDY_20)[0].token_ids
    del llm
    gc.collect()


@needs_pair
@pytest.mark.parametrize("method", ["draft", "ngram"])
def test_drafters_greedy_equal_fast_plain_decoding_on_the_15b(method, fast_15b_output):
    """Under the fast arithmetic (most of the 1.5B's bytes are Q4_K and Q6_K: the grouped kernel) a verify of
    K + 1 rows gives each row the logits it has alone, so K = 4 at every step keeps K = 0's tokens."""
    plain, want = fast_15b_output
    spec = LLM(
        target=TARGET,
        method=method,
        num_speculative_tokens=4,
        controller="fixed",
        max_num_seqs=1,
        max_model_len=1024,
        arithmetic="fast",
        share_target=plain,
    )
    got = spec.chat(CHAT, GREEDY_20)[0]
    assert got.token_ids == want
    if method == "draft":  # (the chat prompt gives n-grams little to copy: they may not draft at all)
        assert got.metrics["num_accepted"] > 0
    del spec
    gc.collect()


@needs_pair
def test_cli_generate_accepts_the_builtin_names():
    """The command from the issue: once it failed with "unsupported GGUF architecture 'qwen2'". The fixed
    controller: K = 0 never reads a cost model, and the default one probes the 0.5B's step times first on a
    machine without its profile (a fresh CI cache: most of this test's ~25 s)."""
    command = "generate --method none --controller fixed --max-tokens 4 --chat".split()
    out = run_cli(*command, "--target", DRAFT, "Say hi")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip()


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "specdecode.cli", *args], capture_output=True, text=True, timeout=600, check=False
    )


def cli_in_process(capsys, *args: str) -> tuple[int, str]:
    """(exit status, stderr) of the command line run in this process: `python -m specdecode.cli` is
    `sys.exit(main())`, so main's return value is the process's status, and an exception that escaped it (the
    traceback a user would see) fails the test. A subprocess adds ~4 s of imports to each error case."""
    capsys.readouterr()  # only what the command writes
    returncode = main(list(args))
    return returncode, capsys.readouterr().err


# --- hand-made GGUFs: every architecture round-trips exactly -------------------------------------------


@pytest.fixture
def no_tokenizer(monkeypatch):
    """Tiny GGUFs carry no vocabulary; the tokenizer path is covered by the real models."""
    monkeypatch.setattr(loader, "_save_tokenizer", lambda gguf_path, out_dir: None)


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3"])
def test_every_architecture_round_trips_exactly(family, tmp_path, no_tokenizer):
    """HF -> GGUF (as llama.cpp lays each out) -> our converter gives back every tensor bit for bit, and
    the converted model's logits equal transformers' on the original checkpoint."""
    overrides = {"attention_bias": True} if family == "llama" else {}
    hf_dir = tiny_with_biases(tmp_path / "hf", family, **overrides)
    path = write_gguf(hf_dir, tmp_path / f"{family}.gguf", family)
    out = resolve_model_dir(str(path), cache_dir=tmp_path / "cache", progress=False)
    want, got = load_file(hf_dir / "model.safetensors"), load_file(out / "model.safetensors")
    assert got.keys() == want.keys()
    assert any(k.endswith("bias") for k in want) == (family in ("llama", "qwen2"))
    for k in want:
        assert torch.equal(got[k], want[k]), k
    ids = [[3, 17, 42, 5, 9, 11]]
    ref = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    assert our_logits(load_llama(out), ids[0]).sub(ref(torch.tensor(ids)).logits[0]).abs().max() < 1e-4


def test_negative_control_qwen2_stored_with_the_llama_permutation_fails(tmp_path, no_tokenizer):
    """A qwen2 file written as if llama.cpp permuted it (it does not) comes back with other q/k rows."""
    hf_dir = tiny_with_biases(tmp_path / "hf", "qwen2")
    path = write_gguf(hf_dir, tmp_path / "q.gguf", "llama")  # permuted like llama ...
    reader = gguf.GGUFReader(path)
    assert reader.fields["general.architecture"].contents() == "llama"
    patched = path.read_bytes().replace(b"llama", b"qwen2")  # ... but labelled qwen2 (keys and arch alike)
    (tmp_path / "p.gguf").write_bytes(patched)
    out = resolve_model_dir(str(tmp_path / "p.gguf"), cache_dir=tmp_path / "cache", progress=False)
    want, got = load_file(hf_dir / "model.safetensors"), load_file(out / "model.safetensors")
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(got[q], want[q])


# --- hand-made GGUFs: bad files give one line, and the CLI exits 2 -------------------------------------


def _tiny_qwen2(tmp: Path, **kw) -> Path:
    return write_gguf(tiny_with_biases(tmp / "hf", "qwen2", **kw), tmp / "t.gguf", "qwen2")


def _truncated(tmp: Path) -> str:
    path = _tiny_qwen2(tmp)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return str(path)


def _wrong_magic(tmp: Path) -> str:
    path = _tiny_qwen2(tmp)
    path.write_bytes(b"GGML" + path.read_bytes()[4:])
    return str(path)


def _unknown_arch(tmp: Path) -> str:
    return str(write_gguf(tiny_with_biases(tmp / "hf", "llama"), tmp / "t.gguf", "phi3"))


def _unknown_quant(tmp: Path) -> str:
    hf_dir = tiny_with_biases(tmp / "hf", "qwen2", intermediate_size=256)  # Q8_K packs rows of 256
    types = {"blk.1.ffn_down.weight": gguf.GGMLQuantizationType.Q8_K}
    return str(write_gguf(hf_dir, tmp / "t.gguf", "qwen2", types))


def _odd_biases(tmp: Path) -> str:  # an output bias, which qwen2 never has
    hf_dir = tiny_with_biases(tmp / "hf", "llama", attention_bias=True)
    return str(write_gguf(hf_dir, tmp / "t.gguf", "qwen2"))


BAD_FILES = [
    (_truncated, "corrupt GGUF file"),
    (_wrong_magic, "corrupt GGUF file"),
    (_unknown_arch, "unsupported GGUF architecture 'phi3'; expected one of llama, mistral, qwen2, qwen3"),
    (_unknown_quant, "unsupported GGUF tensor type Q8_K"),
    (_odd_biases, "unsupported attention biases for qwen2"),
]


@pytest.mark.parametrize(("make", "expected"), BAD_FILES, ids=[f.__name__.strip("_") for f, _ in BAD_FILES])
def test_bad_gguf_is_one_line_and_cli_exit_2(make, expected, tmp_path, monkeypatch, capsys):
    spec = make(tmp_path)
    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ModelLoadError) as err:
        resolve_model_dir(spec, progress=False)
    assert expected in str(err.value) and "\n" not in str(err.value)
    returncode, stderr = cli_in_process(
        capsys, "generate", "--target", spec, "--method", "none", "--max-tokens", "1", "hi"
    )
    assert returncode == 2
    assert stderr.strip().splitlines()[-1].startswith("specdecode: error: ")
    assert expected in stderr and "Traceback" not in stderr


# --- a draft whose vocabulary is not the target's, and a vocabulary that is broken ---------------------


@cache
def smollm2_vocabulary() -> dict[str, list]:
    """SmolLM2's tokenizer fields as its GGUF holds them (read once: ~3 s of GGUFReader a test)."""
    src = gguf.GGUFReader(BUILTIN_MODELS[SMOLLM2].gguf_path(SMOLLM2))
    keys = ("tokens", "merges", "token_type", "model", "pre")
    fields = {k: src.fields[f"tokenizer.ggml.{k}"].contents() for k in keys}
    return {**fields, "chat_template": src.fields["tokenizer.chat_template"].contents()}


def write_with_tokenizer(tmp: Path, change, keep_merges: bool = True) -> Path:
    """A tiny llama GGUF carrying SmolLM2's tokenizer with `change(tokens)` applied (the model's vocabulary
    sized to match); keep_merges=False keeps merges whose tokens `change` removed, as a broken file would."""
    src = smollm2_vocabulary()
    tokens = change(list(src["tokens"]))
    merges = list(src["merges"])
    if keep_merges:
        vocab = set(tokens)
        merges = [m for m in merges if (pair := m.split(" ")) and {pair[0], pair[1], "".join(pair)} <= vocab]
    plain = write_gguf(tiny_with_biases(tmp / "hf", "llama", vocab_size=len(tokens)), tmp / "plain.gguf", "llama")
    raw = gguf.GGUFReader(plain)
    writer = gguf.GGUFWriter(str(tmp / "draft.gguf"), "llama")
    for key, field in raw.fields.items():
        if not key.startswith(("GGUF.", "general.architecture")):
            writer.add_key_value(key, field.contents(), field.types[0], sub_type=field.types[-1])
    writer.add_string("tokenizer.ggml.model", src["model"])
    writer.add_string("tokenizer.ggml.pre", src["pre"])
    writer.add_string("tokenizer.chat_template", src["chat_template"])
    writer.add_token_list(tokens)
    writer.add_token_types(list(src["token_type"])[: len(tokens)])
    writer.add_token_merges(merges)
    for t in raw.tensors:
        writer.add_tensor(t.name, np.array(t.data))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return tmp / "draft.gguf"


@pytest.fixture
def cache_with_smollm2(tmp_path, monkeypatch) -> Path:
    """A model cache of the test's own (what it converts stays out of the user's), already holding SmolLM2's
    converted files as any machine that has run SmolLM2 does: converting them again from the GGUF took ~8 s of
    each test, and the checks here are about the other file."""
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    files = resolve_model_dir(SMOLLM2, progress=False, weights=False)
    (cache / files.name).symlink_to(files, target_is_directory=True)
    monkeypatch.setenv("SPECDECODE_CACHE", str(cache))
    return cache


def _fewer(tokens: list[str]) -> list[str]:
    return tokens[:-8]


def _renamed(tokens: list[str]) -> list[str]:
    return [*tokens[:-1], "<|not_smollm|>"]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (_fewer, "draft vocabulary (49144 tokens) differs from the target's (49152)"),
        (_renamed, "draft tokenizer differs from the target's: speculation needs a shared vocabulary"),
    ],
    ids=["fewer-tokens", "renamed-token"],
)
def test_draft_with_another_vocabulary_is_refused(change, expected, tmp_path, cache_with_smollm2, capsys, monkeypatch):
    """Refused from the two models' files before either one's weights load (loading them first had made a user
    wait 76 s, and 3.8 GB, to hear that SmolLM2 cannot draft for the 1.5B)."""
    draft = write_with_tokenizer(tmp_path, change)

    def no_weights(*args, **kwargs):
        raise AssertionError("weights loaded before the vocabularies were compared")

    monkeypatch.setattr(specdecode.llm, "load_target", no_weights)
    monkeypatch.setattr(specdecode.llm, "load_draft", no_weights)
    returncode, stderr = cli_in_process(
        capsys, "generate", "--target", SMOLLM2, "--draft", str(draft), "--method", "draft", "--max-tokens", "1", "hi"
    )
    assert returncode == 2, stderr
    assert stderr.strip().splitlines()[-1] == f"specdecode: error: {expected}"
    assert "Traceback" not in stderr


def test_vocabulary_with_dangling_merges_is_one_line(tmp_path, monkeypatch, capsys):
    """Merges that name tokens the file does not have: tokenizers raises a bare Exception, which once
    escaped as a traceback with exit status 1."""
    path = write_with_tokenizer(tmp_path, _fewer, keep_merges=False)
    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path / "cache"))
    returncode, stderr = cli_in_process(
        capsys, "generate", "--target", str(path), "--method", "none", "--max-tokens", "1", "hi"
    )
    assert returncode == 2 and "Traceback" not in stderr
    assert re.fullmatch(
        r"specdecode: error: cannot build a tokenizer from .*: Error while initializing BPE.*",
        stderr.strip().splitlines()[-1],
    )
