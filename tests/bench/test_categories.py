"""`bench specbench --categories`: only the categories asked for, and a category the prompts file lacks is one
line before any model loads."""

from __future__ import annotations

import json

import pytest

from specdecode.bench.specbench import select_prompts
from specdecode.cli import main
from specdecode.config import ConfigError
from specdecode.prompts import Prompt
from tests.bench.conftest import ModelsLoaded, one_line_error

PROMPTS = [Prompt(f"{c} {i}", c) for c in ("writing", "coding", "math") for i in range(3)]


def test_categories_keep_only_theirs_per_category_each():
    picked = select_prompts(PROMPTS, 2, ["coding", "writing"])
    assert [p.text for p in picked] == ["writing 0", "writing 1", "coding 0", "coding 1"]
    assert select_prompts(PROMPTS, 0, ["math"]) == PROMPTS[6:]
    assert select_prompts(PROMPTS, 1) == [PROMPTS[0], PROMPTS[3], PROMPTS[6]]


def test_a_category_the_file_lacks_is_refused():
    with pytest.raises(ConfigError, match="no prompts of category poetry"):
        select_prompts(PROMPTS, 2, ["writing", "poetry"])


def test_the_command_refuses_it_before_loading(bench_argv, capsys):
    assert main([*bench_argv, "--categories", "qa,poetry"]) == 2
    assert one_line_error(capsys) == "specdecode: error: no prompts of category poetry"


def test_the_command_passes_them_on(bench_argv, tmp_path):
    prompts = tmp_path / "two.jsonl"
    prompts.write_text("".join(json.dumps({"category": c, "turns": ["hi"]}) + "\n" for c in ("qa", "coding")))
    argv = [*bench_argv, "--prompts", str(prompts), "--categories", "coding"]
    with pytest.raises(ModelsLoaded):  # the checks passed: it goes on to load the model
        main(argv)
