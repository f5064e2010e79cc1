"""Reading prompts: command-line arguments, a jsonl file (`prompt` or Spec-Bench `turns`; .gz too), or stdin."""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO


class PromptError(ValueError):
    """Prompts that can't be used; the message names the file and line."""


@dataclass(frozen=True)
class Prompt:
    text: str
    category: str = "default"
    question_id: str | None = None


def parse_prompt(obj: dict, where: str) -> Prompt:
    if isinstance(obj.get("prompt"), str):
        text = obj["prompt"]
    elif isinstance(obj.get("turns"), list) and obj["turns"] and isinstance(obj["turns"][0], str):
        text = obj["turns"][0]  # single-turn runs use the first turn, as Spec-Bench does
    else:
        raise PromptError(f"{where}: expected a 'prompt' string or a non-empty 'turns' list")
    if not text.strip():
        raise PromptError(f"{where}: empty prompt")
    qid = obj.get("question_id")
    return Prompt(text, str(obj.get("category", "default")), None if qid is None else str(qid))


def read_jsonl_objects(path: str | Path) -> list[tuple[dict, str]]:
    """Every non-blank line's JSON object with its `file:line` location; a `.gz` file is decompressed."""
    path = Path(path)
    if not path.is_file():
        raise PromptError(f"prompts file not found: {path}")
    raw = path.read_bytes()
    if path.suffix == ".gz":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as e:
            raise PromptError(f"{path}: not a readable gzip file ({e})") from None
    objects = []
    for n, line in enumerate(raw.decode("utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise PromptError(f"{path}:{n}: invalid JSON ({e.msg})") from None
        if not isinstance(obj, dict):
            raise PromptError(f"{path}:{n}: expected a JSON object")
        objects.append((obj, f"{path}:{n}"))
    return objects


def load_jsonl(path: str | Path) -> list[Prompt]:
    prompts = [parse_prompt(obj, where) for obj, where in read_jsonl_objects(path)]
    if not prompts:
        raise PromptError(f"{path}: no prompts")
    return prompts


def read_prompts(args: list[str], prompts_file: str | None, stdin: TextIO | None) -> list[str]:
    """Prompts from arguments, else the file, else stdin (one prompt: the whole input)."""
    if args:
        prompts = list(args)
    elif prompts_file:
        prompts = [p.text for p in load_jsonl(prompts_file)]
    elif stdin is not None and not stdin.isatty():
        prompts = [stdin.read()]
    else:
        raise PromptError("no prompt: give one as an argument, with --prompts-file, or on stdin")
    if any(not p.strip() for p in prompts):
        raise PromptError("empty prompt")
    return prompts
