"""A built-in target's default arm (arms.py): `LLM(target=...)` and a command without --method take its method and
K; a method given, or a target without an arm, keeps the config's defaults and what was given."""

from __future__ import annotations

import pytest

from specdecode import arms, cli
from specdecode.arms import DefaultArm, with_default_arm
from specdecode.llm_args import fill_default_arm


@pytest.fixture
def arm(monkeypatch):
    monkeypatch.setitem(arms.DEFAULT_ARMS, "some-target", DefaultArm("suffix", 8, "results/x.json"))


def test_settings(arm):
    assert with_default_arm("some-target", {}) == {"method": "suffix", "num_speculative_tokens": 8}
    assert with_default_arm("some-target", {"num_speculative_tokens": 3}) == {
        "method": "suffix",
        "num_speculative_tokens": 3,
    }
    assert with_default_arm("some-target", {"method": "ngram"}) == {"method": "ngram"}
    assert with_default_arm("other-target", {}) == {}


def parsed(argv: list[str]):
    a = cli.build_parser().parse_args(cli.route_subcommands(argv))
    fill_default_arm(a)
    return a.method, a.num_speculative_tokens


def test_command_line(arm):
    assert parsed(["generate", "--target", "some-target", "hi"]) == ("suffix", 8)
    assert parsed(["generate", "--target", "some-target", "--num-speculative-tokens", "2", "hi"]) == ("suffix", 2)
    assert parsed(["generate", "--target", "some-target", "--method", "draft", "hi"]) == ("draft", 5)
    assert parsed(["generate", "--target", "other-target", "hi"]) == ("ngram", 5)


def test_the_fast_arithmetic_takes_its_own_arm(arm, monkeypatch):
    monkeypatch.setitem(arms.FAST_ARMS, "some-target", DefaultArm("draft", 3, "results/dev.json"))
    monkeypatch.delenv("SPECDECODE_ARITHMETIC", raising=False)
    assert with_default_arm("some-target", {"arithmetic": "fast"})["method"] == "draft"
    assert with_default_arm("some-target", {"arithmetic": "exact"})["method"] == "suffix"
    assert with_default_arm("some-target", {})["method"] == "suffix"  # exact is the default
    monkeypatch.setenv("SPECDECODE_ARITHMETIC", "fast")
    assert with_default_arm("some-target", {})["method"] == "draft"
    assert parsed(["generate", "--target", "some-target", "--arithmetic", "exact", "hi"]) == ("suffix", 8)


def test_every_arm_names_a_method_and_its_dev_run():
    from specdecode.config import METHODS

    for target, a in [*arms.DEFAULT_ARMS.items(), *arms.FAST_ARMS.items()]:
        assert a.method in METHODS and a.num_speculative_tokens > 0, target
        assert "dev" in a.measured, f"{target}: an arm is chosen on dev prompts"


def test_llm_takes_the_targets_arm(monkeypatch):
    from specdecode import LLM

    monkeypatch.setitem(arms.DEFAULT_ARMS, "smollm2-135m-instruct", DefaultArm("suffix", 7, "results/dev.json"))
    llm = LLM(target="smollm2-135m-instruct", max_num_seqs=1)
    assert (llm.spec.method, llm.spec.num_speculative_tokens) == ("suffix", 7)
    assert LLM(target="smollm2-135m-instruct", method="ngram", max_num_seqs=1).spec.num_speculative_tokens == 5


def test_a_draft_arm_brings_its_stop_unless_the_user_gives_one(monkeypatch):
    monkeypatch.setitem(arms.FAST_ARMS, "some-target", DefaultArm("draft", 4, "results/dev.json", draft_stop_below=0.7))
    monkeypatch.delenv("SPECDECODE_ARITHMETIC", raising=False)
    fast = {"arithmetic": "fast"}
    assert with_default_arm("some-target", fast)["draft_stop_below"] == 0.7
    assert with_default_arm("some-target", fast | {"draft_stop_below": 0.5})["draft_stop_below"] == 0.5
    assert "draft_stop_below" not in with_default_arm("some-target", fast | {"method": "draft"})
    assert "draft_stop_below" not in with_default_arm("some-target", {"arithmetic": "exact"})


def test_a_draft_arm_brings_its_lookup_unless_the_user_gives_one(monkeypatch):
    arm = DefaultArm("draft", 4, "results/dev.json", draft_stop_below=0.7, draft_lookup=3)
    monkeypatch.setitem(arms.FAST_ARMS, "some-target", arm)
    monkeypatch.delenv("SPECDECODE_ARITHMETIC", raising=False)
    fast = {"arithmetic": "fast"}
    assert with_default_arm("some-target", fast)["draft_lookup"] == 3
    assert with_default_arm("some-target", fast | {"draft_lookup": 0})["draft_lookup"] == 0  # off, as the user said
    assert "draft_lookup" not in with_default_arm("some-target", fast | {"method": "draft"})
    a = cli.build_parser().parse_args(cli.route_subcommands(["generate", "--target", "some-target", "hi"]))
    a.arithmetic = "fast"
    fill_default_arm(a)
    assert (a.method, a.draft_lookup, a.draft_stop_below) == ("draft", 3, 0.7)
