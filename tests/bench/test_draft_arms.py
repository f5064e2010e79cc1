"""Draft arms of `specdecode bench --methods`: their own draft models, their HF assisted peers, and the
draft-size trade-off table (step costs measured on real models)."""

from __future__ import annotations

import argparse
import warnings

import pytest
from rich.console import Console

from specdecode.bench.args import MethodArm, method_arms
from specdecode.bench.draft_tradeoff import decode_step_ms, plot_tradeoff, render_tradeoff, weights_m
from specdecode.models.gguf_quantized import load_gguf_quantized
from specdecode.models.llama import load_llama
from specdecode.models.quant_int8 import use_int8
from tests.models.test_gguf_quantized import loader_fp32_model, write_tiny_gguf


def test_draft_arms_carry_their_own_draft():
    arms = method_arms("draft@drafts/d1:2,draft@smollm2-135m-instruct-draft:4:goodput,ngram:8:goodput,eagle@h/e3:8")
    assert arms == [
        MethodArm("draft", 2, "fixed", "drafts/d1"),
        MethodArm("draft", 4, "goodput", "smollm2-135m-instruct-draft"),
        MethodArm("ngram", 8, "goodput", None),
        MethodArm("eagle", 8, "fixed", "h/e3"),
    ]


def test_a_draft_arm_may_stop_when_unsure():
    assert method_arms("draft:6:fixed:0.8,draft@d:3:goodput:0.5") == [
        MethodArm("draft", 6, "fixed", None, 0.8),
        MethodArm("draft", 3, "goodput", "d", 0.5),
    ]


def test_a_draft_arm_may_look_up_its_own_text_first():
    assert method_arms("draft:4:goodput:0.7:3,draft@d:2:fixed:0.5:0") == [
        MethodArm("draft", 4, "goodput", None, 0.7, 3),
        MethodArm("draft", 2, "fixed", "d", 0.5, 0),
    ]


@pytest.mark.parametrize(
    "bad",
    ["ngram@x:2", "suffix@x:2", "draft@:2", "eagle@:2", "draft@d:2:fixed:9", "draft@d:two", "ngram:3:fixed:0.5"]
    + ["draft:3:fixed:x", "draft:3:fixed:0.5:x", "draft:3:fixed:0.5:1:2", "ngram:3:fixed:0.5:3"],
)
def test_bad_draft_arms_are_refused(bad):
    with pytest.raises(argparse.ArgumentTypeError):
        method_arms(bad)


def _row(tok_s: float, tau: float = 1.0) -> dict:
    return {"overall": {"tokens_per_s": tok_s, "mean_accepted_tokens": tau}}


def test_tradeoff_table_pairs_each_draft_with_its_own_hf_peer(tmp_path):
    tables = {
        "ours K=0": _row(20.0),
        "ours draft[d1] K=2 fixed": _row(18.0, 1.3),
        "ours draft[d4] K=2 fixed": _row(15.0, 1.5),
        "HF assisted [d1] K=2": _row(12.0),
        "HF assisted [d4] K=3": _row(10.0),  # another K: not d4's peer at K=2
    }
    cost = {"target_ms": 30.0, "draft_layers": 1, "draft_params_m": 3.5}
    costs = {
        "ours draft[d1] K=2 fixed": {**cost, "draft_ms": 3.0},
        "ours draft[d4] K=2 fixed": {**cost, "draft_ms": 9.0},
    }
    md = render_tradeoff(tables, costs, Console(quiet=True))
    rows = [line for line in md.splitlines() if line.startswith("| ours")]
    assert rows[0].endswith("| 0.100 | 1.30 | 18.0 | 0.90x | 1.50x |")  # c = 3/30; 18/20 vs K=0; 18/12 vs HF
    assert rows[1].endswith("| 0.300 | 1.50 | 15.0 | 0.75x | - |")
    plot_tradeoff(tables, costs, tmp_path / "tradeoff.png")
    assert (tmp_path / "tradeoff.png").stat().st_size > 1000


def test_decode_step_cost_runs_on_a_real_cache(tiny_target):
    # Only that it runs and yields a time: comparing timings in a unit test would be flaky by design.
    assert decode_step_ms(load_llama(tiny_target), context=32, iters=5) > 0.0


@pytest.mark.parametrize("fast", [False, True], ids=["exact", "fast"])
def test_a_quantized_drafts_weights_are_counted(tmp_path, fast):
    """The trade-off table's parameter count of a model whose linears keep GGUF blocks (buffers, not parameters)
    equals its fp32 conversion's: each linear's in x out, exact or int8 fast; the parameters alone (the former
    count) are a few norms and biases."""
    path = write_tiny_gguf(tmp_path / "tiny.gguf", tie=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tiny file's dense linears
        quantized = load_gguf_quantized(path)
    if fast:
        assert use_int8(quantized) > 0
    fp32 = weights_m(loader_fp32_model(path, tmp_path / "fp32"))
    assert weights_m(quantized) == pytest.approx(fp32, rel=1e-9)
    params = sum(p.numel() for n, p in quantized.named_parameters() if not n.startswith("embed")) / 1e6
    assert params < 0.5 * fp32
