"""The load sweep on a tiny random model: closed loop holds the load, K traces obey the arm, files are written."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from itertools import cycle

import pytest
import torch
from rich.console import Console

from specdecode.bench.sweep import (
    ArmSpec,
    NullBar,
    RecordingController,
    SweepConfig,
    build_engine,
    closed_loop,
    parse_arms,
    run_sweep,
)
from specdecode.bench.sweep_config import LevelRun
from specdecode.bench.sweep_report import figures, paired_ratio, ratios, report
from specdecode.cli import build_parser
from specdecode.config import ConfigError, SamplingParams
from specdecode.control import make_controller
from specdecode.llm import LLM
from specdecode.step.proposal import Proposal
from specdecode.step.sequence import Sequence

# Token ids (the tiny vocabulary has 96); the repeats give the n-gram drafter suffixes to match.
PROMPTS = [[5, 6, 7, 5, 6, 7, 5, 6, 7], [10, 11, 12, 13, 10, 11, 12, 13, 10, 11, 12], [20, 21, 20, 21, 20, 21]]
LEVELS = [1, 2]


@pytest.fixture(scope="module")
def swept(tiny_target, tmp_path_factory):
    base = LLM(str(tiny_target), method="ngram", num_speculative_tokens=2, max_num_seqs=1, max_model_len=64)
    arms = parse_arms(["none", "fixed:2", "heuristic"], k_max=2, defaults=())
    cfg = SweepConfig(LEVELS, max_tokens=4)
    runs = run_sweep(base, arms, PROMPTS, cfg)
    out = tmp_path_factory.mktemp("sweep") / "sweep.json"
    payload = report(out, {"command": "test", "machine": "test", "date": "today"}, arms, cfg, runs, {}, quiet())
    return runs, payload, out


def quiet() -> Console:
    return Console(file=io.StringIO())


def test_files_written(swept):
    _, _, out = swept
    data = json.loads(out.read_text())
    assert data.keys() >= {"command", "machine", "date", "concurrency", "results", "k_traces", "sum_tokens_per_s"}
    assert data["concurrency"] == LEVELS
    assert set(data["results"]) == {"none", "fixed:2", "heuristic"}
    assert data["ratios"]["heuristic"]["2"].keys() == {
        "best_fixed",
        "vs_best_fixed",
        "best_counting_none",
        "vs_best_counting_none",
        "paired_vs_best_counting_none",
        "vs_none",
    }
    for levels in data["results"].values():
        assert set(levels) == {"1", "2"}
        for fig in levels.values():
            assert fig.keys() >= {"tokens_per_s", "tpot_p50_ms", "tpot_p99_ms", "mean_accepted_tokens", "mean_k"}
    assert "| none |" in out.with_suffix(".md").read_text()
    for png in ("sweep_tps.png", "sweep_k.png"):
        assert (out.parent / png).stat().st_size > 1000


def test_every_request_decoded(swept):
    runs, _, _ = swept
    for levels in runs.values():
        for run in levels.values():
            assert run.requests == 4  # max(4, 2C) for C <= 2
            assert 0 < run.tokens <= 4 * 4
            assert run.summary()["tokens_per_s"] > 0
            assert len(run.tpot_s) == run.requests  # every request made more than one token


def test_closed_loop_holds_the_load(swept):
    runs, _, _ = swept
    assert max(runs["none"][1].rows) == 1
    assert max(runs["none"][2].rows) == 2  # a finished request is replaced at once
    assert max(runs["fixed:2"][2].rows) <= 2


def test_k_trace_obeys_the_arm(swept):
    runs, payload, _ = swept
    for c in LEVELS:
        assert set(runs["none"][c].k_max) == {0}
        assert max(runs["fixed:2"][c].k_max) == 2  # the repeated prompts give drafts: the trace is not vacuous
        assert payload["k_traces"]["fixed:2"][c]["max"] == runs["fixed:2"][c].k_max
        # The controller's own choice is recorded apart from what the drafter managed to propose.
        assert set(runs["none"][c].k_chosen) == {0} and set(runs["fixed:2"][c].k_chosen) == {2}


@pytest.mark.parametrize(
    ("text", "name", "controller", "k"),
    [
        ("none", "none", "fixed", 0),
        ("fixed:3", "fixed:3", "fixed", 3),
        ("fixed", "fixed:5", "fixed", 5),
        ("heuristic", "heuristic", "heuristic", 5),
        ("heuristic:8", "heuristic:8", "heuristic", 8),
    ],
)
def test_arm_names(text, name, controller, k):
    assert ArmSpec.parse(text, k_max=5) == ArmSpec(name, controller, k)


@pytest.mark.parametrize("text", ["nonexistent", "fixed:x", "fixed:-1"])
def test_bad_arm(text):
    with pytest.raises(ConfigError):
        ArmSpec.parse(text, k_max=5)


def test_recorder_forwards_truncate():
    """The engine calls its controller's `truncate` between propose and verify: the recording wrapper hands it to
    the arm's controller, whose cut (confidence) or default keep-every-draft (fixed, control.base) it returns."""
    seqs = [Sequence("a", [1, 2, 3], SamplingParams(), max_len=64)]
    proposal = Proposal(torch.tensor([[5, 6, 7]]), torch.tensor([3]), None, torch.tensor([[0.9, 0.1, 0.9]]))
    assert RecordingController(make_controller("fixed")).truncate(seqs, proposal) is proposal
    cut = RecordingController(make_controller("confidence")).truncate(seqs, proposal)
    assert cut.num_tokens.tolist() == [1]


def test_default_arms_skip_unregistered_controllers():
    arms = parse_arms(None, k_max=5, defaults=("none", "fixed:2", "not_a_controller"))
    assert [a.name for a in arms] == ["none", "fixed:2"]


def test_bench_mode_defaults_to_specbench():
    assert build_parser().parse_args(["bench", "--prompts", "q.jsonl"]).mode == "specbench"
    a = build_parser().parse_args(["bench", "sweep", "--prompts", "q.jsonl", "--concurrency", "4,1"])
    assert (a.mode, a.concurrency) == ("sweep", [1, 4])


def test_draft_peers_include_dynamic_assisted(tiny_target, tiny_draft):
    from argparse import Namespace

    from specdecode.bench.sweep_peers import run_peers

    base = LLM(str(tiny_target), draft=str(tiny_draft), method="draft", num_speculative_tokens=2, max_num_seqs=1)
    a = Namespace(target=str(tiny_target), draft=str(tiny_draft), method="draft", num_speculative_tokens=2)
    a.device, a.dtype = "cpu", "float32"
    text = base.tokenizer.decode(PROMPTS[0])
    runs = run_peers(a, base, [text, text], SweepConfig([1], max_tokens=4, warmup=0))
    assert list(runs) == ["HF generate", f"HF assisted [{tiny_draft.name}] K=2", "HF assisted dynamic"]
    assert all(r.tokens > 0 and r.summary()["tokens_per_s"] > 0 for r in runs.values())


def test_levels_draw_prompts_from_every_category_alike():
    """Spec-Bench lists prompts by category; a level runs the first max(4, 2C) of them."""
    from specdecode.bench.sweep import interleave
    from specdecode.prompts import Prompt

    prompts = [Prompt(f"{c}{i}", c) for c, n in (("writing", 5), ("rag", 2), ("math", 3)) for i in range(n)]
    out = interleave(prompts)
    assert sorted(p.text for p in out) == sorted(p.text for p in prompts)
    assert [p.category for p in out[:3]] == ["writing", "rag", "math"]
    assert [p.text for p in out if p.category == "writing"] == [f"writing{i}" for i in range(5)]  # file order kept
    assert [p.category for p in out[6:]] == ["writing", "math", "writing", "writing"]


def test_steady_state_starts_after_the_first_request_finishes(swept):
    """The start-up burst (every prompt of the level prefilled, no token out yet) is not steady state: at C = 1
    the whole first request is left out, though one request was in flight all along."""
    runs, _, _ = swept
    run = runs["none"][1]
    assert run.steady_tokens <= run.tokens - 2  # the first request made 2 tokens or more (tpot is defined)
    assert run.steady_seconds < run.seconds


def test_levels_run_in_rounds_the_arms_taking_turns(tiny_target, monkeypatch):
    import specdecode.bench.sweep as sweep

    built = []
    real = sweep.build_engine

    def recording(base, arm, num_seqs, max_len):
        built.append(arm.name)
        return real(base, arm, num_seqs, max_len)

    monkeypatch.setattr(sweep, "build_engine", recording)
    base = LLM(str(tiny_target), method="ngram", num_speculative_tokens=2, max_num_seqs=1, max_model_len=64)
    arms = parse_arms(["none", "fixed:2"], k_max=2, defaults=())
    cfg = SweepConfig([1], max_tokens=2, warmup=0, min_requests=10)
    runs = run_sweep(base, arms, PROMPTS, cfg)
    assert cfg.rounds(1) == 3
    assert built == ["none", "fixed:2", "fixed:2", "none", "none", "fixed:2"]
    # Three rounds of four requests, each round on the next prompts of the cycle: twelve in all, each prompt 4x.
    assert runs["none"][1].requests == runs["fixed:2"][1].requests == 12
    assert runs["none"][1].prompt_tokens == 4 * sum(len(p) for p in PROMPTS)
    # Each round's own tok/s is kept, in order, for the paired ratio (sweep_report.paired_ratio).
    assert len(runs["none"][1].round_tps) == len(runs["fixed:2"][1].round_tps) == 3
    assert all(t > 0 for t in runs["none"][1].round_tps)


def test_on_step_sees_every_step_and_the_steady_window(tiny_target):
    """closed_loop's on_step (experiments/sweep_steady_window.py logs through it) is called once per step, with the
    steady flag and seconds that the run's own steady figures sum."""
    base = LLM(str(tiny_target), method="ngram", num_speculative_tokens=2, max_num_seqs=1, max_model_len=64)
    engine = build_engine(base, ArmSpec("fixed:2", "fixed", 2), 2, 64)
    log = []
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    run = closed_loop(engine, cycle(PROMPTS), 2, 6, params, NullBar(), True, lambda *step: log.append(step))
    assert len(log) == len(run.step_s)
    assert sum(seconds for steady, seconds, _, _ in log if steady) == pytest.approx(run.steady_seconds)
    assert sum(len(u.new_token_ids) for steady, _, ups, _ in log if steady for u in ups) == run.steady_tokens
    assert any(steady for steady, *_ in log) and any(stats is not None for *_, stats in log)


def rounds_of(tps: list[float]) -> LevelRun:
    """A level's run with only the figures the ratios read: each round 100 tokens at tps tokens/s."""
    run = LevelRun(0.0, 0, 0, [], [])
    for t in tps:
        one = LevelRun(100 / t, 100, 1, [], [], steady_tokens=100, steady_seconds=100 / t)
        run = run.merge(replace(one, round_tps=[t]))
    return run


def test_paired_rounds_keep_a_change_of_machine_speed_from_setting_the_ratio():
    """Two arms doing the same work, a round each in turn, on a machine that ran 1.5x faster for a while: the rounds
    in which goodput ran fast are not the ones in which K = 0 did, except where both did. The paired median reads
    1.00x; pooled over the rounds (the figure before), the same data read 1.07x, through the same check."""
    goodput = [40.0, 60.0, 60.0, 60.0, 40.0, 40.0]  # the fast stretch began before goodput's second round
    plain = [40.0, 40.0, 60.0, 60.0, 40.0, 40.0]  # ... and after K = 0's second round
    arms = [ArmSpec("none", "fixed", 0), ArmSpec("goodput", "goodput", 4)]
    runs = {"none": {8: rounds_of(plain)}, "goodput": {8: rounds_of(goodput)}}
    figs = figures(runs)
    row = ratios(arms, figs, [8], runs)["goodput"][8]
    assert row["best_counting_none"] == "none"
    assert row["paired_vs_best_counting_none"] == pytest.approx(1.0)
    # The control: the pooled ratio of the same rounds, through the same check, is off by 7%.
    with pytest.raises(AssertionError):
        assert row["vs_best_counting_none"] == pytest.approx(1.0, abs=0.05)
    assert paired_ratio(runs, "goodput", "none", 8) == pytest.approx(1.0)
    assert paired_ratio({"a": {1: rounds_of([1.0])}, "b": {1: rounds_of([1.0, 2.0])}}, "a", "b", 1) is None


def finishes_per_step(tiny_target, stagger: bool) -> tuple[list[int], int]:
    """Plain decoding at C = 4, eight requests of 8 tokens: how many finish at each step, and the tokens made."""
    base = LLM(str(tiny_target), method="ngram", num_speculative_tokens=2, max_num_seqs=1, max_model_len=64)
    engine = build_engine(base, ArmSpec("none", "fixed", 0), 4, 64)
    finished: list[int] = []
    step = engine.step

    def counting():
        updates = step()
        finished.append(sum(u.finished for u in updates))
        return updates

    engine.step = counting
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    run = closed_loop(engine, cycle(PROMPTS), 4, 8, params, NullBar(), stagger)
    return finished, run.tokens


@pytest.mark.parametrize("stagger", [True, False])
def test_staggered_rounds_finish_a_few_at_a_time(tiny_target, stagger):
    """Staggered, the first four ask for 2, 4, 6 and 8 tokens: requests finish (and their replacements prefill)
    one at a time, as under continuous traffic. The control starts them alike: plain decoding keeps them in
    lockstep, four finishes on one step, and the steady stretch would be one wave's prefills and decoding."""
    finished, tokens = finishes_per_step(tiny_target, stagger)
    assert sum(finished) == 8
    if stagger:
        assert tokens == 2 + 4 + 6 + 8 + 4 * 8
        assert max(finished) == 1
    else:
        assert tokens == 8 * 8
        assert max(finished) == 4
