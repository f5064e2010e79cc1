"""Calibration on the tiny model: it times real forwards, fits positive predictions, and its profile is what
the goodput controller loads for that target (and only for that target)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specdecode.control import make_controller
from specdecode.control.calibrate import calibrate, load_profile, model_fingerprint, profile_path
from specdecode.control.cost import default_cost_model
from specdecode.models.llama import load_llama


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path))
    return tmp_path


def test_calibrate_tiny_model_and_load_its_profile(tiny_target, cache_dir):
    model = load_llama(tiny_target)
    cost = calibrate(model, "cpu", batch_sizes=(1, 2), token_counts=(1, 4), context_lengths=(8, 32), repeats=1)
    assert all(cost.predict(b, k, c) > 0 for b in (1, 4) for k in (0, 3) for c in (8, 100))
    assert cost.fingerprint == model_fingerprint(model)
    path = cost.save(profile_path(model))
    assert path.parent == cache_dir / "calibration"
    np.testing.assert_allclose(load_profile(model).verify_coef, cost.verify_coef)
    np.testing.assert_allclose(make_controller("goodput", model).cost.verify_coef, cost.verify_coef)


def test_no_profile_means_the_prior(tiny_target, cache_dir, recwarn):
    model = load_llama(tiny_target)
    np.testing.assert_array_equal(load_profile(model).verify_coef, default_cost_model().verify_coef)
    assert not recwarn.list


def test_no_profile_means_a_probe_at_load(tiny_target, cache_dir):
    """The goodput controller of a model without a saved profile is priced by a probe of that model, not by
    the fixed prior (which would fail this check: it has no fingerprint and other coefficients)."""
    model = load_llama(tiny_target)
    cost = make_controller("goodput", model).cost
    assert cost.fingerprint == model_fingerprint(model)
    assert not np.allclose(cost.verify_coef, default_cost_model().verify_coef)


def test_a_probe_is_saved_for_the_next_start(tiny_target, cache_dir, monkeypatch):
    """The second start loads the first one's probe instead of probing again (the 1.5B's probe took 112 s)."""
    from specdecode.control import calibrate as calibrate_module

    model = load_llama(tiny_target)
    first = make_controller("goodput", model).cost
    assert profile_path(model).is_file()
    probes = []
    monkeypatch.setattr(calibrate_module, "calibrate", lambda *a, **k: probes.append(1) or first)
    again = make_controller("goodput", load_llama(tiny_target)).cost
    assert probes == []
    np.testing.assert_allclose(again.verify_coef, first.verify_coef)


def test_profile_of_another_model_is_not_used(tiny_target, tiny_draft, cache_dir):
    target, draft = load_llama(tiny_target), load_llama(tiny_draft)
    cost = calibrate(draft, None, batch_sizes=(1,), token_counts=(1, 2, 4, 8), context_lengths=(8,), repeats=1)
    cost.save(profile_path(target))  # a profile for the draft, filed under the target's name
    with pytest.warns(UserWarning, match="another setup"):
        loaded = load_profile(target)
    np.testing.assert_array_equal(loaded.verify_coef, default_cost_model().verify_coef)


def probes_at_start(tiny_target, monkeypatch, method: str, **kwargs) -> int:
    """Step-time probes taken while an LLM with the goodput controller starts on a model with no profile."""
    from specdecode.control import calibrate as calibrate_module
    from specdecode.llm import LLM

    probes = []
    real = calibrate_module.calibrate
    monkeypatch.setattr(calibrate_module, "calibrate", lambda *a, **k: probes.append(1) or real(*a, **k))
    LLM(str(tiny_target), method=method, controller="goodput", num_speculative_tokens=2, enforce_eager=True, **kwargs)
    return len(probes)


def test_plain_decoding_takes_no_probe(tiny_target, cache_dir, monkeypatch):
    """K = 0 never reads a cost model, so a new machine does not time the model first (minutes on the 1.5B)."""
    assert probes_at_start(tiny_target, monkeypatch, "none") == 0


def test_control_speculation_takes_its_probe(tiny_target, cache_dir, monkeypatch):
    assert probes_at_start(tiny_target, monkeypatch, "ngram") == 1


def test_a_profile_names_the_kernel_it_timed(tiny_target, tmp_path, monkeypatch):
    """Quantized linears (fast here): the fingerprint carries the int8 kernel's source hash, so a profile timed on
    an older kernel is not loaded for a newer one. Control: the same source gives the same fingerprint."""
    from gguf import GGMLQuantizationType as Q

    from specdecode.models import quant_int8
    from specdecode.models.quant_int8 import Int8QuantLinear
    from specdecode.models.quant_rows import QuantLinear

    model = load_llama(tiny_target)
    blocks = np.zeros((4, 34), dtype=np.uint8)  # 4 rows of one Q8_0 block
    model.extra = Int8QuantLinear(QuantLinear(torch.from_numpy(blocks), Q.Q8_0, 32))
    before = model_fingerprint(model)
    assert before["arithmetic"] == "fast" and before == model_fingerprint(model)
    changed = tmp_path / "quant_int8.cpp"
    changed.write_text(quant_int8.SOURCE.read_text() + "\n// another kernel\n")
    monkeypatch.setattr(quant_int8, "SOURCE", changed)
    assert model_fingerprint(model) != before


def test_the_calibrate_command_times_the_target_the_engine_serves(smollm2_tokenizer, tmp_path, cache_dir, monkeypatch):
    """`specdecode calibrate` with a flag that changes the step (the cache dtype here; the arithmetic likewise) writes
    the profile `goodput` looks up for an LLM with the same flag, which then takes no probe at load. The command once
    loaded the target with a few flags of its own (the exact arithmetic, an fp32 cache whatever was asked), and
    `goodput` under the fast arithmetic never found what it wrote. Control: the same LLM with the cache dtype the
    command did not time probes at load. A model of 32-dimension heads: the bf16 cache's kernel takes 32, 64, 128."""
    from specdecode.cli import main
    from specdecode.models.kv_dtype import bf16_serves
    from tests.tiny import write_tiny_model

    target = write_tiny_model(tmp_path / "heads32", num_attention_heads=2, num_key_value_heads=1)
    smollm2_tokenizer.save_pretrained(target)
    if not bf16_serves(load_llama(target)):
        pytest.skip("this CPU has no few-queries kernel for a bf16 cache")
    assert main(["calibrate", "--target", str(target), "--kv-cache-dtype", "bf16", "--enforce-eager"]) == 0
    assert len(list((cache_dir / "calibration").glob("*.json"))) == 1
    assert probes_at_start(target, monkeypatch, "ngram", kv_cache_dtype="bf16") == 0
    assert probes_at_start(target, monkeypatch, "ngram", kv_cache_dtype="fp32") == 1
