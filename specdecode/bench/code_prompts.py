"""The bench's prompt sets: Spec-Bench's question file (or any prompts jsonl), or the packaged code set.

`--prompts code` is data/code_prompts.jsonl: 48 coding requests written for this project (12 each of `write` a
function from its docstring, `fix` a bug, `explain` code, `translate` between languages; Python, JavaScript,
TypeScript, C, Rust, Go, SQL, bash), in Spec-Bench's format (`question_id`, `category`, `turns`) plus
`language` and `split`. Every third request of a category is `dev` (16: for tuning and choosing defaults), the
others `eval` (32: the reported figures), so a default chosen on dev is never judged on the prompts that chose it.
"""

from __future__ import annotations

from pathlib import Path

from specdecode.prompts import Prompt, PromptError, parse_prompt, read_jsonl_objects

CODE_PROMPTS = Path(__file__).with_name("data") / "code_prompts.jsonl"
SPLITS = ("dev", "eval")


def load_prompts(spec: str, split: str = "all") -> list[Prompt]:
    """The prompts of `spec` ('code' or a jsonl path). `split` ('dev', 'eval' or 'all') keeps the lines whose
    `split` field says so; a file without the field (Spec-Bench's) is taken whole."""
    path = CODE_PROMPTS if spec == "code" else Path(spec)
    objects = read_jsonl_objects(path)
    if split != "all" and any("split" in obj for obj, _ in objects):
        bad = [where for obj, where in objects if obj.get("split") not in SPLITS]
        if bad:
            raise PromptError(f"{bad[0]}: 'split' must be one of {', '.join(SPLITS)}")
        objects = [(obj, where) for obj, where in objects if obj["split"] == split]
    prompts = [parse_prompt(obj, where) for obj, where in objects]
    if not prompts:
        raise PromptError(f"{path}: no prompts" + (f" in split {split}" if split != "all" else ""))
    return prompts
