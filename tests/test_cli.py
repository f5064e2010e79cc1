"""The command line: bad input gives one line on stderr and a non-zero exit, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from specdecode.cli import main

BAD_ARGS = [
    (["generate", "hi", "--temperature", "-1"], "temperature"),
    (["generate", "hi", "--top-p", "0"], "top_p"),
    (["generate", "hi", "--top-p", "1.5"], "top_p"),
    (["generate", "hi", "--top-k", "-1"], "top_k"),
    (["generate", "hi", "--num-speculative-tokens", "65"], "num_speculative_tokens"),
    (["generate", "hi", "--num-speculative-tokens", "-1"], "num_speculative_tokens"),
    (["generate", "hi", "--max-tokens", "0"], "max_tokens"),
    (["generate", "hi", "--method", "suffix", "--suffix-corpus", "/nonexistent.npz"], "suffix corpus"),
    (["generate", "hi", "--method", "suffix_tree", "--suffix-min-prob", "1.5"], "suffix_min_prob"),
    (["generate", "   "], "empty prompt"),
    (["generate", "hi", "--target", "/nonexistent/model"], "model not found"),
    (["generate", "--prompts-file", "/nonexistent.jsonl"], "prompts file not found"),
    (["generate", "hi", "--tensor-parallel-size", "0"], "tensor_parallel_size must be >= 1"),
    (["generate", "hi", "--tensor-parallel-size", "2", "--device", "cuda:1"], "device type only"),
    (["bench", "sweep", "--prompts", "missing.jsonl"], "prompts file not found"),
    (["distill", "generate", "--prompts", "missing.jsonl", "--out", "x.npz"], "prompts file not found"),
    (["distill-generate", "--prompts", "specbench_question.jsonl", "--out", "x.npz"], "evaluation only"),
]


@pytest.mark.parametrize(("argv", "words"), BAD_ARGS)
def test_bad_input_is_one_line(argv, words, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err
    assert "Traceback" not in err


def test_prompt_longer_than_context(tiny_target, capsys):
    argv = ["generate", " ".join(["word"] * 80), "--target", str(tiny_target), "--max-model-len", "32", "--no-chat"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "context is 32" in err and len(err.splitlines()) == 1


def test_corrupt_gguf_is_one_line(tmp_path, capsys):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 100)
    assert main(["generate", "hi", "--target", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "GGUF" in err


def test_generate_json_end_to_end(smollm2_dir):
    """A real process: two prompts, JSON lines with text, token ids and the metrics keys."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "specdecode.cli",
            "generate",
            "What is 2+2?",
            "Name a color.",
            "--target",
            str(smollm2_dir),
            "--max-tokens",
            "12",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(lines) == 2
    for obj in lines:
        assert obj["text"] and obj["token_ids"]
        assert set(obj["metrics"]) >= {
            "num_drafted",
            "num_accepted",
            "acceptance_rate",
            "mean_accepted_tokens",
            "num_target_forwards",
            "num_generated",
            "elapsed_s",
            "tokens_per_s",
        }
