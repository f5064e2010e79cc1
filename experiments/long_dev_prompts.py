"""Dev prompts with long inputs (retrieval QA, extraction, summarization over ~3,000 characters), from our own docs.

    python -m experiments.long_dev_prompts [--out data/dev_long_prompts.jsonl] [--per-category 4] [--rev e754da5]

`data/dev_chat_prompts.jsonl` has the Spec-Bench categories, but its RAG, extraction and summarization prompts are
~100-170 tokens where Spec-Bench's are ~250-900: a long input changes what speculation pays (the draft model reads
it first; lookups find much to copy), so tuning for those categories needs inputs as long, and never the evaluation
prompts. The passages are prose paragraphs of docs/*.md (tables, code and headings left out), cut at paragraph ends
into passages of PASSAGE_CHARS characters or more; each category takes its own passages, in file order. The docs
are read as they stood at `--rev` (git), by default DOCS_REV, the commit the committed file was cut from: the docs
have changed since, and the dev set should not move with them.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PASSAGE_CHARS = 2800
DOCS_REV = "e754da5"  # the docs data/dev_long_prompts.jsonl was cut from
TEMPLATES = {
    "rag": (
        "Answer the question using only the passage below.\n\nPassage:\n{text}\n\n"
        "Question: According to the passage, what was measured, and what did the measurement show?"
    ),
    "extraction": "Extract every number from the text below, each with what it measures, as a list.\n\n{text}",
    "summarization": "Summarize the following text in a short paragraph.\n\n{text}",
}


def paragraphs(markdown: str) -> list[str]:
    """Prose paragraphs of a markdown file: no tables, code blocks, headings or lists' markup."""
    out, code = [], False  # code: inside a fenced block, which blank lines may split into several
    for block in re.split(r"\n\s*\n", markdown):
        if code or block.lstrip().startswith("```"):
            code = code != bool(block.count("```") % 2)  # an odd number of fences opens or closes one
            continue
        if block.lstrip().startswith(("#", "|", "    ", "<", "!")):
            continue
        text = " ".join(line.strip().lstrip("-* ") for line in block.splitlines())
        text = re.sub(r"[`*]", "", re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text))
        if len(text) > 200:
            out.append(text)
    return out


def passages(texts: list[str], size: int = PASSAGE_CHARS) -> list[str]:
    """Consecutive paragraphs joined until each passage has at least `size` characters."""
    out, current = [], []
    for p in texts:
        current.append(p)
        if sum(map(len, current)) >= size:
            out.append("\n\n".join(current))
            current = []
    return out


def docs_at(rev: str) -> list[str]:
    """The text of each docs/*.md file at git revision `rev`, in name order."""
    git = ["git", "-C", str(ROOT)]
    names = subprocess.run([*git, "ls-tree", "--name-only", rev, "docs/"], capture_output=True, text=True, check=True)
    md = sorted(n for n in names.stdout.split() if n.endswith(".md"))
    return [subprocess.run([*git, "show", f"{rev}:{n}"], capture_output=True, text=True, check=True).stdout for n in md]


def build(per_category: int, rev: str = DOCS_REV) -> list[dict]:
    texts = [p for doc in docs_at(rev) for p in paragraphs(doc)]
    pool = passages(texts)
    if len(pool) < per_category * len(TEMPLATES):
        raise SystemExit(f"only {len(pool)} passages for {per_category * len(TEMPLATES)} prompts")
    rows = []
    for c, (category, template) in enumerate(TEMPLATES.items()):
        for i in range(per_category):
            text = pool[c * per_category + i]
            rows.append(
                {"question_id": f"dev-long-{category}-{i}", "category": category, "prompt": template.format(text=text)}
            )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "data" / "dev_long_prompts.jsonl"))
    ap.add_argument("--per-category", type=int, default=4)
    ap.add_argument("--rev", default=DOCS_REV, help="the git revision whose docs/ to cut")
    a = ap.parse_args()
    rows = build(a.per_category, a.rev)
    with open(a.out, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    print(f"wrote {len(rows)} prompts to {a.out}: {', '.join(str(len(r['prompt'])) for r in rows)} characters")


if __name__ == "__main__":
    main()
