"""`bench long-context` on SmolLM2 at tiny contexts: the prompts are exactly N tokens, a rewound arm decodes what a
fresh engine decodes (with a negative control: a rewind one token short), the verdict reads the
numbers right (a goodput below 0.97x the best fixed arm is a miss), and the command writes its files."""

from __future__ import annotations

import json

import numpy as np
import pytest

import specdecode.bench.long_context as lc
import specdecode.engine.engine as engine_module
from specdecode.bench.long_context import (
    CellPlan,
    context_prompts,
    frame,
    lossless,
    run_cell,
    run_texts,
    text_ids,
    verdict,
)
from specdecode.bench.sweep import NullBar
from specdecode.bench.sweep_config import parse_arms
from specdecode.cli import main
from specdecode.config import ConfigError, SamplingParams
from specdecode.llm import LLM
from specdecode.step.sequence import SeqMetrics
from tests.bench.conftest import eager_smollm2_ngram, one_line_error

ARMS = ["none", "fixed:2", "goodput"]
MAX_TOKENS = 4


class Bar(NullBar):
    def set_postfix_str(self, text: str) -> None:
        pass


@pytest.fixture(scope="module")
def smollm2() -> LLM:
    return eager_smollm2_ngram(max_num_seqs=1, max_model_len=64, max_num_batched_tokens=256)


@pytest.fixture(scope="module")
def text(smollm2) -> list[int]:
    return text_ids(smollm2, [128], rows=3, prompts=None)


def test_the_code_sets_text_is_cut_from_the_split_asked_for(smollm2):
    """--split dev reads only the dev prompts (tuning never sees the eval ones) and eval only the eval ones: each
    split's first prompt opens its text and the other's never appears. Control: 'all' has both."""
    from specdecode.bench.code_prompts import load_prompts

    firsts = {s: smollm2.tokenizer.encode(load_prompts("code", s)[0].text[:200]) for s in ("dev", "eval")}
    texts = {s: text_ids(smollm2, [4096], rows=1, prompts="code", split=s) for s in ("dev", "eval", "all")}

    def holds(ids: list[int], part: list[int]) -> bool:
        core = part[1:-1]  # token boundaries at the cut may differ
        return any(ids[i : i + len(core)] == core for i in range(len(ids) - len(core)))

    assert texts["dev"][: len(firsts["dev"]) - 1] == firsts["dev"][:-1]
    assert texts["eval"][: len(firsts["eval"]) - 1] == firsts["eval"][:-1]
    assert not holds(texts["dev"], firsts["eval"]) and not holds(texts["eval"], firsts["dev"])
    assert holds(texts["all"], firsts["dev"]) and holds(texts["all"], firsts["eval"])


def test_a_gzipped_prompts_file_gives_the_text_of_all_its_prompts(smollm2, tmp_path, monkeypatch):
    """A .jsonl.gz prompts file (the distillation prompts) reads as its plain twin, and its first n tokens are those
    of all its prompts joined, though only the prompts n tokens need are encoded. Control: reading a character a
    token asked, the text runs out and repeats."""
    import gzip

    from specdecode.bench import long_prompt

    lines = [
        json.dumps({"prompt": f"Question {i}: why would sample {i} differ from sample {i + 1}?"}) for i in range(400)
    ]
    plain, packed = tmp_path / "p.jsonl", tmp_path / "p.jsonl.gz"
    plain.write_text("\n".join(lines) + "\n")
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    whole = smollm2.tokenizer.encode("\n\n".join(json.loads(line)["prompt"] for line in lines))
    assert len(whole) > 4 * 256
    assert long_prompt.long_prompt_ids(smollm2, 256, str(packed)) == long_prompt.long_prompt_ids(
        smollm2, 256, str(plain)
    )
    assert long_prompt.long_prompt_ids(smollm2, 256, str(packed)) == whole[:256]
    monkeypatch.setattr(long_prompt, "CHARS_A_TOKEN", 1)
    assert long_prompt.long_prompt_ids(smollm2, 256, str(packed)) != whole[:256]


@pytest.mark.parametrize("chat", [True, False])
@pytest.mark.parametrize("n", [48, 64, 128])
def test_prompts_have_exactly_n_tokens_and_differ_by_row(smollm2, text, n, chat):
    head, tail = frame(smollm2, chat)
    prompts = context_prompts(smollm2, text, n, rows=3, chat=chat)
    assert [len(p) for p in prompts] == [n] * 3
    assert all(p[: len(head)] == head and p[-len(tail) :] == tail for p in prompts)  # ends with the question
    assert len({tuple(p) for p in prompts}) == 3  # each row from its own offset into the text
    assert "What is the text above about?" in smollm2.tokenizer.decode(prompts[0][-len(tail) :])


def test_a_context_too_short_for_the_question_is_refused(smollm2, text):
    with pytest.raises(ConfigError, match="no room for text"):
        context_prompts(smollm2, text, 8, rows=1, chat=True)


def fresh_outputs(llm: LLM, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Each prompt decoded alone, greedily, by a new engine on the same weights."""
    fresh = LLM(
        "smollm2-135m-instruct",
        share_target=llm,
        method="none",
        max_num_seqs=1,
        max_model_len=256,
        enforce_eager=True,
    )
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return [fresh.generate([p], params)[0].token_ids for p in prompts]


def assert_decodes_fresh(runs: dict, prompts: list[list[int]], expected: list[list[int]]) -> None:
    """Every arm and repeat emitted, per row, the tokens a fresh engine emits for that prompt."""
    for name, repeats in runs.items():
        for r, run in enumerate(repeats):
            for row, (out, want) in enumerate(zip(run.outputs, expected, strict=True)):
                assert out[: len(want)] == want, f"{name} repeat {r} row {row}"


def cell(smollm2, text, batch: int, repeats: int = 2):
    arms = parse_arms(ARMS, 2, ())
    prompts = context_prompts(smollm2, text, 64, rows=batch, chat=True)
    runs = run_cell(smollm2, arms, prompts, CellPlan(64, batch, MAX_TOKENS, repeats), turn=0, bar=Bar())
    return runs, prompts


@pytest.mark.parametrize("batch", [1, 2])
def test_every_arm_after_a_rewind_decodes_what_a_fresh_engine_does(smollm2, text, batch):
    runs, prompts = cell(smollm2, text, batch)
    assert set(runs) == set(ARMS) and all(len(r) == 2 for r in runs.values())
    for repeats in runs.values():
        for run in repeats:
            assert run.tokens >= batch * MAX_TOKENS and len(run.k_chosen) == len(run.k_verified) > 0
    assert [run.k_chosen for run in runs["fixed:2"]] == [[2.0] * len(run.k_chosen) for run in runs["fixed:2"]]
    assert lossless(runs)
    assert_decodes_fresh(runs, prompts, fresh_outputs(smollm2, prompts, MAX_TOKENS))


def test_negative_control_a_rewind_one_token_short_is_caught(smollm2, text, monkeypatch):
    def short_rewind(engine, seqs):  # the real rewind, then one token too many cut: the pending prompt token lost
        real_rewind(engine, seqs)
        for s in seqs:
            del s.token_ids[-1]

    real_rewind = lc.rewind
    monkeypatch.setattr(lc, "rewind", short_rewind)
    runs, prompts = cell(smollm2, text, batch=1, repeats=1)
    with pytest.raises(AssertionError):
        assert_decodes_fresh(runs, prompts, fresh_outputs(smollm2, prompts, MAX_TOKENS))


def texts_cell(smollm2, text) -> tuple[dict, list[list[int]]]:
    """Two texts of one row each, decoded in turn and joined per arm and repeat."""
    arms = parse_arms(ARMS, 2, ())
    sets = [context_prompts(smollm2, text, 64, rows=1, chat=True, first=t) for t in range(2)]
    runs = run_texts(smollm2, arms, sets, CellPlan(64, 1, MAX_TOKENS, 2), turn=0, bar=Bar())
    return runs, [p for prompts in sets for p in prompts]


def assert_both_texts(runs: dict, prompts: list[list[int]], expected: list[list[int]]) -> None:
    """Each arm's repeat is one run over both texts: both rows, in order, as a fresh engine decodes them."""
    assert len({tuple(p) for p in prompts}) == 2  # the second text is cut further along
    for repeats in runs.values():
        assert len(repeats) == 2 and all(run.tokens >= 2 * MAX_TOKENS for run in repeats)
    assert_decodes_fresh(runs, prompts, expected)


def test_a_cells_texts_are_decoded_in_turn_and_joined(smollm2, text):
    runs, prompts = texts_cell(smollm2, text)
    assert_both_texts(runs, prompts, fresh_outputs(smollm2, prompts, MAX_TOKENS))
    assert lossless(runs)


def test_negative_control_a_join_that_keeps_one_text_is_caught(smollm2, text, monkeypatch):
    real_joined = lc.joined
    monkeypatch.setattr(lc, "joined", lambda runs: real_joined(runs[:1]))
    runs, prompts = texts_cell(smollm2, text)
    with pytest.raises(AssertionError):
        assert_both_texts(runs, prompts, fresh_outputs(smollm2, prompts, MAX_TOKENS))


def summaries(**tps: float) -> dict[str, dict]:
    return {name.replace("_", ":"): {"tokens_per_s": v} for name, v in tps.items()}


@pytest.mark.parametrize(
    ("figures", "best", "met"),
    [
        (summaries(none=100.0, fixed_2=90.0, goodput=98.0), "none", True),  # K = 0 is the best fixed arm
        (summaries(none=100.0, fixed_2=90.0, goodput=96.0), "none", False),  # negative control: 0.96x is a miss
        (summaries(none=80.0, fixed_2=100.0, goodput=96.9), "fixed:2", False),  # just under 0.97x
        (summaries(none=80.0, fixed_2=100.0, goodput=97.0), "fixed:2", True),
        (summaries(none=80.0, fixed_2=100.0, goodput=130.0), "fixed:2", True),
    ],
)
def test_verdict_against_the_best_fixed_arm(figures, best, met):
    arms = parse_arms(["none", "fixed:2", "goodput", "heuristic"], 5, ())
    figures["heuristic"] = {"tokens_per_s": 1000.0}  # a dynamic arm: never the baseline goodput is held to
    v = verdict(figures, arms)
    assert v["best_fixed"] == best and v["met"] is met
    assert v["ratio"] == pytest.approx(figures["goodput"]["tokens_per_s"] / figures[best]["tokens_per_s"])


def repeated(**tps: list[float]) -> dict[str, dict]:
    return {
        k.replace("_", ":"): {"tokens_per_s": float(np.median(v)), "tokens_per_s_repeats": v} for k, v in tps.items()
    }


HELD_OUT = dict(none=[5.0, 5.0], fixed_1=[10.0, 10.0], fixed_2=[7.0, 14.0], goodput=[10.0, 10.0])


def test_held_out_scores_the_arm_chosen_on_the_other_repeats():
    """fixed:2's one lucky repeat makes it the best arm in-sample (10.5 against 10.0). Chosen on the other repeat,
    it is picked once (and scores 7 there) and fixed:1 once (10): goodput's 10 is 0.95x in-sample, 1.18x held out."""
    arms = parse_arms(["none", "fixed:1", "fixed:2", "goodput"], 5, ())
    v = verdict(repeated(**HELD_OUT), arms)
    assert v["best_fixed"] == "fixed:2" and v["ratio"] == pytest.approx(10 / 10.5) and not v["met"]
    assert v["held_out_chosen"] == ["fixed:2", "fixed:1"] and v["held_out_ratio"] == pytest.approx(10 / 8.5)
    assert v["held_out_met"]


def test_control_choosing_on_the_scored_repeat_too_is_the_in_sample_bias(monkeypatch):
    """Negative control: picking the arm on every repeat, the scored one included, gives the biased figure back."""
    arms = parse_arms(["none", "fixed:1", "fixed:2", "goodput"], 5, ())
    monkeypatch.setattr(lc, "held_out_best", lambda repeats, fixed, j: max(fixed, key=lambda n: sum(repeats[n])))
    v = verdict(repeated(**HELD_OUT), arms)
    assert v["held_out_ratio"] == pytest.approx(v["ratio"]) and not v["held_out_met"]


def test_the_command_writes_json_and_plot(tmp_path, capsys):
    out = tmp_path / "lc.json"
    argv = ["bench", "long-context", "--contexts", "64,128,100000", "--batches", "1,2", "--max-tokens", "4"]
    argv += ["--repeats", "1", "--arms", ",".join(ARMS), "--enforce-eager", "--output", str(out)]
    assert main(argv) == 0
    data = json.loads(out.read_text())
    assert data.keys() >= {"command", "machine", "date", "target", "method", "arms", "cells", "skipped", "all_met"}
    assert data["texts"] == 1
    assert [(c["context"], c["batch"]) for c in data["cells"]] == [(64, 1), (64, 2), (128, 1), (128, 2)]
    assert len(data["skipped"]) == 2 and all("100000" in note for note in data["skipped"])  # past SmolLM2's 8192
    for c in data["cells"]:
        assert set(c["arms"]) == set(ARMS) and c["lossless"]
        assert c["verdict"].keys() == {"best_fixed", "ratio", "met"}
        for fig in c["arms"].values():
            assert fig.keys() >= {"tokens_per_s", "mean_k_chosen", "mean_k_verified", "acceptance_rate"}
        assert c["arms"]["fixed:2"]["mean_k_chosen"] == 2.0 and c["arms"]["none"]["mean_k_chosen"] == 0.0
    assert out.with_suffix(".png").stat().st_size > 0
    assert "skipped" in capsys.readouterr().out


def test_a_drafter_it_cannot_rewind_is_a_one_line_error(capsys):
    assert main(["bench", "long-context", "--method", "suffix", "--contexts", "64"]) == 2
    assert "supports --method ngram or draft" in one_line_error(capsys)


@pytest.fixture(scope="module")
def tiny_pair(tiny_target, tiny_draft) -> LLM:
    return LLM(
        str(tiny_target),
        method="draft",
        draft=str(tiny_draft),
        num_speculative_tokens=2,
        max_num_seqs=1,
        max_model_len=64,
        max_num_batched_tokens=64,
        enforce_eager=True,
    )


class StepClock:
    """The engine's perf_counter, advancing 1 ms a reading: each step's timings are then a function of the code it
    ran, not of the machine's load. `goodput` prices K from the step times it observes, so on a busy machine its
    repeats chose differently (2026-12-07: (16, 8, 0) against (16, 14, 0) drafted and accepted) for no fault of the
    rewind these tests check."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        self.now += 1e-3
        return self.now


def draft_counts(llm: LLM, monkeypatch) -> dict[str, list[tuple[int, int, int]]]:
    """(tokens, drafted, accepted) of every arm's repeats, on token-id prompts (the tiny vocabulary has 96), the
    engine timed by a StepClock."""
    monkeypatch.setattr(engine_module, "time", StepClock())
    prompts = [[(7 * i + j) % 90 + 3 for j in range(40)] for i in range(2)]  # [2 rows, 40 tokens]
    arms = parse_arms(ARMS, 2, ())
    runs = run_cell(llm, arms, prompts, CellPlan(40, 2, 8, repeats=3), turn=0, bar=Bar())
    assert lossless(runs)
    return {name: [(r.tokens, r.drafted, r.accepted) for r in repeats] for name, repeats in runs.items()}


def test_a_draft_model_decodes_alike_after_every_rewind(tiny_pair, monkeypatch):
    # The arms' order rotates, so each repeat of an arm follows a different one: the draft's cache must be back
    # at the prompt, and the controller new, each time for the drafts, and so the counts, to repeat.
    assert_runs_fresh(draft_counts(tiny_pair, monkeypatch))


def assert_runs_fresh(counts: dict[str, list[tuple[int, int, int]]]) -> None:
    """Every arm's repeats alike, and the drafting arms drafting (a controller carried from an earlier run may
    have learned to draft nothing, alike in every repeat)."""
    assert counts["fixed:2"][0][1] > 0 and counts["goodput"][0][1] > 0, f"goodput, fixed:2 drafted nothing: {counts}"
    for name, repeats in counts.items():
        assert len(set(repeats)) == 1, f"{name}: {repeats}"


def test_negative_control_a_controller_kept_across_runs_is_caught(tiny_pair, monkeypatch):
    kept = {}

    def set_arm_once(engine, arm, base=None):  # the real set_arm, but each arm's controller built once and reused
        if arm.name not in kept:
            real_set_arm(engine, arm, base)
            kept[arm.name] = engine.controller
        engine.controller, engine.k_max = kept[arm.name], arm.k

    real_set_arm = lc.set_arm
    monkeypatch.setattr(lc, "set_arm", set_arm_once)
    counts = draft_counts(tiny_pair, monkeypatch)
    with pytest.raises(AssertionError, match="goodput"):  # its acceptance history carried into its next run
        assert_runs_fresh(counts)


def test_a_row_that_stops_decoding_is_an_error_not_a_hang(smollm2, text, monkeypatch):
    # Without a rewind the rows keep growing until one reaches its max_tokens and leaves the batch; the arm's loop
    # once waited for ever for tokens from an engine with no work left.
    monkeypatch.setattr(lc, "rewind", lambda engine, seqs: [setattr(s, "metrics", SeqMetrics()) for s in seqs])
    with pytest.raises(RuntimeError, match="stopped decoding"):
        cell(smollm2, text, batch=1, repeats=4)


# The machine ran repeat 2 at 1.2x and repeat 3 at 0.8x for every arm, and goodput lost repeat 1 (0.81x there)
DRIFT = dict(none=[5.0, 6.0, 4.0], fixed_1=[10.0, 12.0, 8.0], fixed_2=[9.0, 10.8, 7.2], goodput=[8.1, 11.8, 7.9])


def test_paired_ratio_compares_each_repeat_with_itself():
    """Each repeat against itself, goodput is 0.983x fixed:1 (the median of 0.81, 0.983, 0.988): met; the medians of
    its repeats and of fixed:1's, taken apart, put its one lost repeat against fixed:1's middle one (0.81x)."""
    arms = parse_arms(["none", "fixed:1", "fixed:2", "goodput"], 5, ())
    v = verdict(repeated(**DRIFT), arms)
    assert v["held_out_chosen"] == ["fixed:1"] * 3
    assert v["held_out_ratio"] == pytest.approx(8.1 / 10.0) and not v["held_out_met"]
    assert v["paired_ratio"] == pytest.approx(11.8 / 12.0) and v["paired_met"]


def test_control_repeats_out_of_step_lose_the_pairing():
    """Negative control: the fixed arms' repeats rotated by one (goodput's repeat j against their repeat j + 1), the
    same code's paired ratio is 0.79x: a miss."""
    arms = parse_arms(["none", "fixed:1", "fixed:2", "goodput"], 5, ())
    rotated = {k: (v[1:] + v[:1] if k != "goodput" else v) for k, v in DRIFT.items()}
    v = verdict(repeated(**rotated), arms)
    assert v["paired_ratio"] == pytest.approx(7.9 / 10.0) and not v["paired_met"]
