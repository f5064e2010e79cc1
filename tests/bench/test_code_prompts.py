"""The packaged code prompt set (`bench specbench --prompts code --split dev|eval`): its shape, and that a split
keeps exactly its own lines."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from specdecode.bench.code_prompts import CODE_PROMPTS, load_prompts
from specdecode.prompts import PromptError

LINES = [json.loads(line) for line in CODE_PROMPTS.read_text().splitlines()]


def test_the_set_has_forty_or_more_prompts_of_four_kinds_in_many_languages():
    assert len(LINES) >= 40
    assert len({obj["question_id"] for obj in LINES}) == len(LINES)
    assert Counter(obj["category"] for obj in LINES).keys() == {"write", "fix", "explain", "translate"}
    languages = {lang for obj in LINES for lang in obj["language"].split("->")}
    assert {"python", "javascript", "c", "rust", "sql"} <= languages
    assert all(len(obj["turns"]) == 1 and obj["turns"][0].strip() for obj in LINES)


def test_every_category_has_dev_and_eval_prompts():
    by_split = {split: Counter(o["category"] for o in LINES if o["split"] == split) for split in ("dev", "eval")}
    assert set(by_split["dev"]) == set(by_split["eval"]) == {"write", "fix", "explain", "translate"}
    assert sum(by_split["dev"].values()) + sum(by_split["eval"].values()) == len(LINES)


@pytest.mark.parametrize("split", ["dev", "eval"])
def test_a_split_keeps_exactly_its_lines(split):
    want = [(o["turns"][0], str(o["question_id"])) for o in LINES if o["split"] == split]
    got = [(p.text, p.question_id) for p in load_prompts("code", split)]
    assert got == want
    other = {p.question_id for p in load_prompts("code", "eval" if split == "dev" else "dev")}
    assert not other & {qid for _, qid in got}  # no prompt in both
    assert len(load_prompts("code", "all")) == len(LINES)


def test_a_file_without_splits_is_taken_whole(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text("".join(json.dumps({"category": c, "turns": [f"q {c}"]}) + "\n" for c in ("a", "b")))
    assert [p.category for p in load_prompts(str(path), "eval")] == ["a", "b"]


def test_an_unknown_split_value_names_the_line(tmp_path):
    path = tmp_path / "q.jsonl"
    lines = [{"turns": ["x"], "split": "dev"}, {"turns": ["y"], "split": "test"}]
    path.write_text("".join(json.dumps(o) + "\n" for o in lines))
    with pytest.raises(PromptError, match=r"q\.jsonl:2: 'split' must be one of dev, eval"):
        load_prompts(str(path), "dev")
