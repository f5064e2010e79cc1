"""`bench specbench --rounds N`: every arm runs each prompt N times, the arms' order reversed every other turn, so a
drift of the machine's speed over a run favours no arm; every run is a sample."""

from __future__ import annotations

from specdecode.bench.lib import Sample
from specdecode.bench.specbench import run_arms

TEXTS = [("coding", "p0"), ("writing", "p1")]


class Recorder:
    """An arm that records the order of its runs in a log shared with the other arms."""

    def __init__(self, name: str, log: list[tuple[str, str]]) -> None:
        self.name, self.log = name, log

    def run(self, text: str, max_tokens: int) -> Sample:
        self.log.append((self.name, text))
        return Sample(max_tokens, 1.0)


def test_turns_alternate_the_arms_order_and_every_run_counts():
    log: list[tuple[str, str]] = []
    results = run_arms([Recorder("a", log), Recorder("b", log)], TEXTS, 8, warmup=0, rounds=3)
    assert log == [(arm, text) for text in ("p0", "p1") for arm in ("a", "b", "b", "a", "a", "b")]
    assert all(len(results[arm].samples[cat]) == 3 for arm in "ab" for cat in ("coding", "writing"))


def test_one_round_runs_each_prompt_once_in_the_arms_order():
    log: list[tuple[str, str]] = []
    run_arms([Recorder("a", log), Recorder("b", log)], TEXTS, 8, warmup=0)
    assert log == [("a", "p0"), ("b", "p0"), ("a", "p1"), ("b", "p1")]
