"""Dev prompts with long inputs (retrieval QA, extraction, summarization over ~3,000 characters), from our own docs.

    python -m experiments.long_dev_prompts [--out data/dev_long_prompts.jsonl] [--per-category 4]

`data/dev_chat_prompts.jsonl` has the Spec-Bench categories, but its RAG, extraction and summarization prompts are
~100-170 tokens where Spec-Bench's are ~250-900: a long input changes what speculation pays (the draft model reads
it first; lookups find much to copy), so tuning for those categories needs inputs as long, and never the evaluation
prompts. The passages are prose paragraphs of docs/*.md (tables, code and headings left out), cut at paragraph ends
into passages of PASSAGE_CHARS characters or more; each category takes its own passages, in file order.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PASSAGE_CHARS = 2800
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
    out, code = [], False
    for block in re.split(r"\n\s*\n", markdown):
        if block.lstrip().startswith("```"):
            code = not code if block.count("```") % 2 else code
            continue
        if code or block.lstrip().startswith(("#", "|", "    ", "<", "!")):
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


def build(per_category: int) -> list[dict]:
    texts = [p for f in sorted((ROOT / "docs").glob("*.md")) for p in paragraphs(f.read_text())]
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
    a = ap.parse_args()
    rows = build(a.per_category)
    with open(a.out, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    print(f"wrote {len(rows)} prompts to {a.out}: {', '.join(str(len(r['prompt'])) for r in rows)} characters")


if __name__ == "__main__":
    main()
