"""Native llama.cpp as a bench peer (`bench specbench|cost --llama-cpp-native`): the parsers on output the real
tools printed on this machine (tests/bench/data/llama_cpp/), the one-line error when the tools are not built,
and, where `make peers` built them, the real tools on SmolLM2 (skipped, and shown as skipped, where not)."""

from __future__ import annotations

from pathlib import Path

import pytest

from specdecode.bench import llama_cpp_native
from specdecode.bench.llama_cpp_build import TOOLS, bin_dir
from specdecode.bench.llama_cpp_cost import parse_llama_bench_json
from specdecode.bench.llama_cpp_native import NativeArm, parse_completion, parse_speculative
from specdecode.bench.specbench import ArmResult
from specdecode.cli import main
from specdecode.models.loader import BUILTIN_MODELS
from tests.bench.conftest import ModelsLoaded, one_line_error

FIXTURES = Path(__file__).with_name("data") / "llama_cpp"
TARGET = "smollm2-135m-instruct"
BUILT = all((bin_dir() / t).is_file() for t in TOOLS)


NATIVE = ["--llama-cpp-native", "--target", TARGET]


def test_tools_not_built_is_one_line_naming_make_peers(bench_argv, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(llama_cpp_native, "bin_dir", lambda: tmp_path / "bin")
    assert main([*bench_argv, *NATIVE]) == 2
    err = one_line_error(capsys)
    assert "native llama.cpp tool llama-bench is not built" in err and "run make peers" in err
    # Control: with every tool present the same command passes the check and goes on to load models.
    (tmp_path / "bin").mkdir()
    for name in TOOLS:
        (tmp_path / "bin" / name).write_text("")
    with pytest.raises(ModelsLoaded):
        main([*bench_argv, *NATIVE])


def test_completion_parser_on_real_output():
    t = parse_completion((FIXTURES / "completion_smollm2.txt").read_text())
    # Captured with -n 16 on a chat prompt of 22 tokens that does not stop early.
    assert (t.prompt_tokens, t.tokens, t.decode_tokens) == (22, 16, 15)
    assert (t.prompt_ms, t.decode_ms) == (1204.24, pytest.approx(26981.39 + 1.77))
    assert t.prompt_ms > 0 and t.decode_ms > 0 and t.drafted == t.accepted == 0
    s = t.sample()
    assert s.seconds == pytest.approx((t.prompt_ms + t.decode_ms) / 1e3)
    assert s.forwards == 16  # one token per forward: tau 1


@pytest.mark.parametrize("name", ["lookup_smollm2.txt", "speculative_qwen.txt"])
def test_speculative_parser_on_real_output(name):
    text = (FIXTURES / name).read_text()
    t = parse_speculative(text)
    assert t.tokens == t.decode_tokens > 0 and t.prompt_tokens > 0
    assert 0 <= t.accepted <= t.drafted
    assert f"n_drafted = {t.drafted}" in " ".join(text.split())  # the numbers are the tool's own
    s = t.sample()
    assert s.forwards == t.tokens - t.accepted and s.accepted == t.accepted


def test_parser_refuses_output_without_timings():
    with pytest.raises(ValueError, match="no prompt eval time line"):
        parse_completion("main: error: unable to load model\n")
    with pytest.raises(ValueError, match="no encoded line"):
        parse_speculative("main: error: unable to load model\n")


def test_llama_bench_json_parser_on_real_output():
    ms = parse_llama_bench_json((FIXTURES / "llama_bench_smollm2.json").read_text())
    assert set(ms) == {(1, 64), (5, 64)}  # captured: -p 1,5 -n 0 -d 64 -r 3
    assert all(v > 0 for v in ms.values())


def test_decode_rate_counts_only_the_decoding_part():
    t = parse_completion((FIXTURES / "completion_smollm2.txt").read_text())
    row = ArmResult.summarise([t.sample(), t.sample()])
    assert row["decode_tokens_per_s"] == pytest.approx(15 / (t.decode_ms / 1e3))
    assert row["tokens_per_s"] == pytest.approx(16 / ((t.prompt_ms + t.decode_ms) / 1e3))


needs_tools = pytest.mark.skipif(not BUILT, reason=f"native llama.cpp tools not built in {bin_dir()} (make peers)")
COUNTING = "<|im_start|>user\nCount from 1 to 100, separated by commas.<|im_end|>\n<|im_start|>assistant\n"


@needs_tools
def test_real_tools_on_smollm2_for_8_tokens(smollm2_tokenizer):
    gguf = BUILTIN_MODELS[TARGET].gguf_path(TARGET)
    plain = NativeArm("plain", llama_cpp_native.tool("llama-completion"), gguf, ["-no-cnv"], "", 512)
    t = plain.timing(COUNTING, 8)
    assert (t.tokens, t.decode_tokens, t.drafted) == (8, 7, 0) and t.prompt_ms > 0 and t.decode_ms > 0
    # The tool evaluated exactly our prompt's tokens: no second chat template, no BOS of its own, and the
    # newline that ends the assistant header kept (`-f` drops a file's last newline).
    assert t.prompt_tokens == len(smollm2_tokenizer(COUNTING, add_special_tokens=False).input_ids)
    # The target as its own draft: greedy, so (nearly) every drafted token is accepted; a parser that read the
    # wrong line, or flags the tool ignored, would not show it.
    extra = ["-md", str(gguf), "--spec-type", "draft-simple", "--spec-draft-n-max", "4"]
    spec = NativeArm("self-draft", llama_cpp_native.tool("llama-speculative-simple"), gguf, extra, "", 512)
    s = spec.run(COUNTING, 8)
    assert s.tokens >= 8 and s.drafted > 0 and s.accepted >= 0.75 * s.drafted


def test_target_without_gguf_is_one_line(bench_argv, monkeypatch, tiny_target, tmp_path, capsys):
    monkeypatch.setattr(llama_cpp_native, "bin_dir", lambda: tmp_path)
    for name in TOOLS:
        (tmp_path / name).write_text("")
    assert main([*bench_argv, *NATIVE, "--target", str(tiny_target)]) == 2  # a Hugging Face directory: no GGUF
    assert "--llama-cpp-native needs a GGUF-backed target" in one_line_error(capsys)


def test_draft_arms_take_the_targets_default_draft_when_it_has_a_gguf():
    from argparse import Namespace

    from specdecode.bench.llama_cpp_native import draft_ggufs

    pair = "qwen2.5-coder-1.5b-instruct"
    assert draft_ggufs(Namespace(target=pair, draft=None), []) == ["qwen2.5-coder-0.5b-instruct"]
    # SmolLM2's shipped draft has no GGUF of its own: no native draft arm, and no error.
    assert draft_ggufs(Namespace(target=TARGET, draft=None), []) == []
    assert draft_ggufs(Namespace(target=TARGET, draft=pair), []) == [pair]


def fake_tool(path: Path, body: str) -> Path:
    """An executable standing in for a llama.cpp tool: `body` is its shell script."""
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


# Dies of SIGSEGV, as this llama.cpp's AMX matmul does on some Xeons, unless weight repacking is off; then prints
# the real tool's output captured in the fixture.
CRASHES_WITH_REPACK = f"""
for a in "$@"; do [ "$a" = "--no-repack" ] && exec cat "{FIXTURES / "completion_smollm2.txt"}"; done
kill -SEGV $$
"""


def test_a_tool_killed_by_a_signal_is_rerun_with_repacking_off(tmp_path, capsys):
    arm = NativeArm("plain", fake_tool(tmp_path / "llama-completion", CRASHES_WITH_REPACK), tmp_path, [], "n", 512)
    assert arm.timing("hi", 16).tokens == 16  # the fixture's figures, from the rerun
    assert "died of signal 11" in capsys.readouterr().err
    assert arm.extra == ["--no-repack"] and "--no-repack" in arm.note  # later requests run so, and say so
    assert arm.timing("hi", 16).tokens == 16 and capsys.readouterr().err == ""  # no second crash, no second line


@pytest.mark.parametrize("body", ["kill -SEGV $$", "echo failed >&2; exit 1"])
def test_a_tool_that_still_fails_raises_with_its_status(tmp_path, body):
    # Control: a tool that dies with repacking off too, or fails without a signal (no rerun), is an error.
    arm = NativeArm("plain", fake_tool(tmp_path / "llama-completion", body), tmp_path, [], "n", 512)
    with pytest.raises(RuntimeError, match="exited (-11|1)"):
        arm.timing("hi", 16)
    assert arm.extra == (["--no-repack"] if "SEGV" in body else [])


def test_llama_bench_killed_by_a_signal_is_rerun_with_repacking_off(tmp_path, monkeypatch, capsys):
    from specdecode.bench import llama_cpp_cost

    monkeypatch.setattr(llama_cpp_native, "bin_dir", lambda: tmp_path)
    monkeypatch.setattr(llama_cpp_cost, "_repack_died", [])
    body = f"""
prev=""
for a in "$@"; do
  [ "$prev" = "--repack" ] && [ "$a" = "0" ] && exec cat "{FIXTURES / "llama_bench_smollm2.json"}"
  prev="$a"
done
kill -SEGV $$
"""
    fake_tool(tmp_path / "llama-bench", body)
    ms = llama_cpp_cost.llama_bench_ms(tmp_path / "model.gguf", 5, 64, 3)
    assert ms == parse_llama_bench_json((FIXTURES / "llama_bench_smollm2.json").read_text())[(5, 64)]
    assert "died of signal 11" in capsys.readouterr().err and llama_cpp_cost._repack_died == [11]
    # Control: a llama-bench that dies with repacking off too is an error.
    fake_tool(tmp_path / "llama-bench", "kill -SEGV $$")
    with pytest.raises(RuntimeError, match="llama-bench exited -11"):
        llama_cpp_cost.llama_bench_ms(tmp_path / "model.gguf", 5, 64, 3)
