"""llama.cpp as a specbench peer (`bench specbench --llama-cpp`): the user errors of the real command line, and the
arm's request loop against a stand-in Llama. llama-cpp-python itself is optional and never needed here."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest
from rich.console import Console

from specdecode.bench.lib import Sample
from specdecode.bench.llama_cpp_peer import CountingLookup, LlamaCppArm, arithmetic_note
from specdecode.bench.specbench import ArmResult, render
from specdecode.cli import main
from specdecode.models.loader import BUILTIN_MODELS
from tests.bench.conftest import ModelsLoaded, one_line_error

TARGET = "smollm2-135m-instruct"


PEER = "--llama-cpp"


def test_missing_extra_is_one_line_before_any_model_loads(bench_argv, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # `import llama_cpp` now raises ImportError
    assert main([*bench_argv, PEER, "--target", TARGET]) == 2
    assert "install the peers extra: pip install -e .[peers]" in one_line_error(capsys)


def test_with_llama_cpp_importable_the_bench_goes_on_to_load_models(bench_argv, monkeypatch):
    # The control of the test above: the same command with an importable llama_cpp passes the check.
    monkeypatch.setitem(sys.modules, "llama_cpp", types.ModuleType("llama_cpp"))
    with pytest.raises(ModelsLoaded):
        main([*bench_argv, PEER, "--target", TARGET])


def test_target_without_gguf_is_one_line(bench_argv, monkeypatch, tiny_target, capsys):
    monkeypatch.setitem(sys.modules, "llama_cpp", types.ModuleType("llama_cpp"))
    assert main([*bench_argv, PEER, "--target", str(tiny_target)]) == 2  # a Hugging Face directory
    assert "needs a GGUF-backed target" in one_line_error(capsys)
    gguf = BUILTIN_MODELS[TARGET].gguf_path(TARGET)  # control: a .gguf path is GGUF-backed
    with pytest.raises(ModelsLoaded):
        main([*bench_argv, PEER, "--target", str(gguf)])


def test_arithmetic_note_reads_the_gguf():
    note = arithmetic_note(BUILTIN_MODELS[TARGET].gguf_path(TARGET))
    assert note.startswith("Q4_1 weights (token_embd Q8_0), 8-bit activations, f16 KV cache")
    assert note.endswith("not the exact fp32 target")


class FakeLlama:
    """llama_cpp.Llama's generate() in outline: it reuses the cached prefix unless reset() emptied the cache, and
    with a drafter it yields `forwards` groups of tokens, asking the drafter before every forward but the first."""

    def __init__(self, forwards: list[list[int]], draft_model=None) -> None:
        self.forwards, self.draft_model = forwards, draft_model
        self.n_tokens = 0
        self.prompts: list[list[int]] = []
        self.reused: list[bool] = []

    def reset(self) -> None:
        self.n_tokens = 0

    def generate(self, tokens, temp: float, top_k: int, reset: bool):
        assert temp == 0.0 and top_k == 1 and reset
        self.prompts.append(list(tokens))
        self.reused.append(self.n_tokens > 0)
        self.n_tokens = len(tokens)
        for i, group in enumerate(self.forwards):
            if i and self.draft_model is not None:
                self.draft_model(np.arange(self.n_tokens, dtype=np.intc))
            for token in group:
                self.n_tokens += 1
                yield token


def _encode(text: str) -> list[int]:
    return [ord(c) for c in text]


def test_each_request_starts_from_an_empty_cache_with_our_prompt_ids():
    llama = FakeLlama([[5], [6], [7], [8]])
    arm = LlamaCppArm("llama.cpp", llama, _encode, {2}, "note")
    arm.run("ab", 3)
    arm.run("ab", 3)
    assert llama.prompts == [[97, 98], [97, 98]] and llama.reused == [False, False]
    list(llama.generate([97, 98], temp=0.0, top_k=1, reset=True))
    assert llama.reused[-1]  # control: without the arm's reset() the stand-in reuses the previous K/V


@pytest.mark.parametrize(
    ("forwards", "eos", "max_tokens", "expected"),
    [
        ([[5], [6], [7], [8]], {2}, 3, (3, 3)),  # stops at max_tokens
        ([[5], [2], [7]], {2}, 8, (2, 2)),  # stops at (and counts) EOS
    ],
)
def test_plain_arm_counts_tokens_and_forwards(forwards, eos, max_tokens, expected):
    sample = LlamaCppArm("llama.cpp", FakeLlama(forwards), _encode, eos, "note").run("ab", max_tokens)
    assert (sample.tokens, sample.forwards) == expected and sample.drafted == sample.accepted == 0


def test_lookup_arm_counts_drafts_and_accepted_tokens():
    lookup = CountingLookup(lambda ids: ids[-3:])  # always drafts 3 tokens
    forwards = [[5], [6, 7, 8], [9], [10, 11]]  # 4 forwards; 2 + 0 + 1 drafts accepted
    arm = LlamaCppArm("llama.cpp lookup K=3", FakeLlama(forwards, lookup), _encode, {2}, "note", lookup)
    for _ in range(2):  # per-request counts: the second request does not add to the first
        sample = arm.run("ab", 16)
        assert (sample.tokens, sample.forwards, sample.accepted, sample.drafted) == (7, 4, 3, 9)
    assert ArmResult.summarise([sample])["mean_accepted_tokens"] == 7 / 4


def test_render_footnotes_the_arms_that_carry_a_note():
    results = {"ours K=0": ArmResult(), "llama.cpp": ArmResult()}
    for r in results.values():
        r.samples["qa"] = [Sample(10, 1.0)]
    note = "Q4_1 weights, 8-bit activations"
    md = render(results, Console(quiet=True), {"llama.cpp": note})
    assert md.split("### ")[2].count(f"_llama.cpp: {note}_") == 1 and note not in md.split("### ")[1]
    assert note not in render(results, Console(quiet=True))
