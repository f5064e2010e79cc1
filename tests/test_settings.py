"""Each speculation and engine setting lives in one dataclass field: its LLM keyword, its command-line flag (help,
choices) and the keyword arguments the flags describe all come from the field by name (config.py, llm_args.py)."""

from __future__ import annotations

import argparse
from dataclasses import fields

import pytest

from specdecode.config import (
    ARITHMETIC_ENV,
    WEIGHTS_ENV,
    ConfigError,
    EngineConfig,
    SpeculativeConfig,
    cli_fields,
    split_settings,
)
from specdecode.llm_args import add_model_args, llm_kwargs


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_model_args(p)
    return p


def configs(argv: list[str]) -> tuple[SpeculativeConfig, EngineConfig]:
    kwargs = llm_kwargs(parser().parse_args(argv))
    assert kwargs.pop("target") == "smollm2-135m-instruct"
    spec, engine = split_settings(kwargs, SpeculativeConfig, EngineConfig)
    engine["enforce_eager"] = bool(engine["enforce_eager"])  # LLM reads the environment for None
    return SpeculativeConfig(**spec), EngineConfig(**engine)


def test_every_setting_is_a_flag():
    names = {f.name for f in cli_fields(SpeculativeConfig, EngineConfig)}
    every = {f.name for c in (SpeculativeConfig, EngineConfig) for f in fields(c)}
    assert every == names


def test_no_flags_give_the_defaults():
    assert configs([]) == (SpeculativeConfig(), EngineConfig())


def test_each_flag_reaches_its_field(tmp_path):
    """Table-driven: every flag set to a value other than its default arrives in its field."""
    corpus = tmp_path / "corpus.npz"
    corpus.write_bytes(b"")
    values = {
        "method": "suffix", "num_speculative_tokens": 3, "draft": "some-draft", "draft_vocab": "full",
        "draft_stop_below": 0.4, "draft_lookup": 3, "draft_window": 64, "draft_arithmetic": "exact",
        "draft_weights": "file",
        "ngram_min": 1, "ngram_max": 3,
        "controller": "fixed", "suffix_corpus": (str(corpus),), "suffix_cache_max_tokens": 7,
        "suffix_max_depth": 5, "suffix_spec_factor": 2.0, "suffix_min_prob": 0.3, "suffix_request_spec_factor": 3.0,
        "max_num_seqs": 3, "max_model_len": 99, "device": "cuda", "dtype": "bfloat16", "enforce_eager": True,
        "tensor_parallel_size": 2, "weights": "fp32", "arithmetic": "fast", "max_num_batched_tokens": 64,
        "fused_prefill": False, "kv_cache_dtype": "bf16",
    }  # fmt: skip
    assert set(values) == {f.name for f in cli_fields(SpeculativeConfig, EngineConfig)}
    argv = []
    for name, value in values.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is False:  # a default-on switch: its --no- form
            argv.append("--no-" + name.replace("_", "-"))
        elif isinstance(value, tuple):
            argv += [a for v in value for a in (flag, v)]
        else:
            argv += [flag, str(value)]
    spec, engine = split_settings(values, SpeculativeConfig, EngineConfig)
    assert configs(argv) == (SpeculativeConfig(**spec), EngineConfig(**engine))


def test_an_unknown_setting_is_a_type_error():
    with pytest.raises(TypeError, match="num_speculative_token"):
        split_settings({"num_speculative_token": 3}, SpeculativeConfig, EngineConfig)


def test_weights_and_arithmetic_resolve_once_at_the_config(monkeypatch):
    """Left out (None), weights and arithmetic take their environment variable, else their default, in
    EngineConfig itself: what the loaders get is the value. A flag or keyword wins; a bad value is refused."""
    monkeypatch.delenv(WEIGHTS_ENV, raising=False)
    monkeypatch.delenv(ARITHMETIC_ENV, raising=False)
    assert (EngineConfig().weights, EngineConfig().arithmetic) == ("quantized", "exact")
    monkeypatch.setenv(WEIGHTS_ENV, "fp32")
    monkeypatch.setenv(ARITHMETIC_ENV, "fast")
    _, engine = configs([])
    assert (engine.weights, engine.arithmetic) == ("fp32", "fast")
    _, engine = configs(["--weights", "quantized", "--arithmetic", "exact"])
    assert (engine.weights, engine.arithmetic) == ("quantized", "exact")
    with pytest.raises(ConfigError, match="weights='int4': expected 'quantized' or 'fp32'"):
        EngineConfig(weights="int4")
    monkeypatch.setenv(ARITHMETIC_ENV, "int8")
    with pytest.raises(ConfigError, match="SPECDECODE_ARITHMETIC='int8': expected 'exact' or 'fast'"):
        EngineConfig()
