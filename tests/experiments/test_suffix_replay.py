"""The suffix replay walks a greedy response as the engine decodes it: same drafts, same steps."""

from __future__ import annotations

import numpy as np
import pytest

from experiments import suffix_replay
from experiments.suffix_replay import Request, load_requests, replay
from tests.drafters.test_suffix_index import write_corpus
from tests.engine.test_suffix import GREEDY, PROMPTS, suffix_llm


def write_eval(path, records: list[tuple[list[int], list[int]]], sampled: list[int]) -> str:
    """A token file as `distill generate` writes it: prompts, responses, which were sampled, their prompt lines."""
    extra = {"sampled": np.array(sampled, dtype=np.uint8), "prompt_index": np.arange(len(records))}
    return str(write_corpus(path, records, **extra))


@pytest.fixture(scope="module")
def engine_run(tiny_target, corpus):
    """The last two prompts (not in the corpus) through the engine one at a time, finished outputs cached."""
    llm = suffix_llm(tiny_target, "suffix", 1, (corpus,), cache=4096)
    return llm.generate(PROMPTS[6:], GREEDY)


def replayed_forwards(corpus, engine_run, tmp_path) -> float:
    """Target forwards the replay implies for the engine's own responses: its steps plus one prefill each."""
    records = [(p, o.token_ids) for p, o in zip(PROMPTS[6:], engine_run, strict=True)]
    requests = load_requests(write_eval(tmp_path / "eval.npz", records, [0, 0]), None)
    result = replay(requests, (corpus,), {"cache_max_tokens": 4096}, 8, False, GREEDY.max_tokens)
    generated = sum(len(r) for _, r in records)
    return (generated - len(records)) / result["overall"]["tau"] + len(records)


def test_replay_takes_the_engines_steps(corpus, engine_run, tmp_path):
    forwards = sum(o.metrics["num_target_forwards"] for o in engine_run)
    generated = sum(o.metrics["num_generated"] for o in engine_run)
    assert generated / forwards > 1.5  # drafts were accepted: the comparison is not between two plain decodings
    assert replayed_forwards(corpus, engine_run, tmp_path) == pytest.approx(forwards)


def test_a_replay_that_miscounts_acceptance_is_caught(corpus, engine_run, tmp_path, monkeypatch):
    """Negative control through the same comparison: the walk checks drafts against the response one token off."""
    real = suffix_replay.accepted
    monkeypatch.setattr(suffix_replay, "accepted", lambda draft, truth: real(draft, truth[1:]))
    forwards = sum(o.metrics["num_target_forwards"] for o in engine_run)
    assert replayed_forwards(corpus, engine_run, tmp_path) > 2 * forwards


def test_sampled_records_are_left_out(tmp_path):
    path = write_eval(tmp_path / "e.npz", [([1, 2], [3, 4]), ([5], [6, 7, 8])], sampled=[1, 0])
    assert load_requests(path, None) == [Request("all", [5], [6, 7, 8])]


def test_grid_is_every_combination():
    grid = suffix_replay.parse_grid(["spec_factor=1,2.5", "min_prob=0.1"])
    assert grid == [{"spec_factor": 1, "min_prob": 0.1}, {"spec_factor": 2.5, "min_prob": 0.1}]
