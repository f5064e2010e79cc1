"""JSON output under speculation: how often it parses and validates, what the grammar mask costs, and the speed
against the same requests without a grammar.

Usage:
    python -m experiments.structured [--target smollm2-135m-instruct] [--subjects 50] [--max-tokens 200]
        [--method ngram_tree] [--k 8] [--batch 8] [--enforce-eager] [--output results/structured.json]

50 subjects x 3 schemas (bounded strings and arrays, so a document always ends within max_tokens), greedy chat
requests through `LLM.chat`, three arms interleaved chunk by chunk: the grammar with speculation, the grammar with
plain decoding (K = 0), and speculation without a grammar (the same prompts, free text: how often a small model
writes valid JSON unaided). The mask's cost is the time inside the request's GrammarMatcher (masks for the
verify positions and the drafter's, and advancing), per generated token. Prints a table, writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from contextlib import contextmanager
from datetime import date

import jsonschema
from rich.console import Console
from rich.table import Table

from specdecode import LLM, SamplingParams
from specdecode.bench.lib import write_result
from specdecode.config import StructuredOutputs
from specdecode.grammar import GrammarMatcher
from specdecode.hardware import cpu_model

SCHEMAS = {
    "person": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 30},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "occupation": {"type": "string", "maxLength": 30},
            "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 3},
        },
        "required": ["name", "age", "occupation", "hobbies"],
    },
    "product": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 40},
            "price": {"type": "number"},
            "in_stock": {"type": "boolean"},
            "category": {"enum": ["food", "tools", "clothing", "electronics", "books"]},
        },
        "required": ["name", "price", "in_stock", "category"],
    },
    "event": {
        "type": "object",
        "properties": {
            "title": {"type": "string", "maxLength": 40},
            "year": {"type": "integer"},
            "city": {"type": "string", "maxLength": 30},
            "attendees": {"type": "integer", "minimum": 0},
        },
        "required": ["title", "year", "city", "attendees"],
    },
}
SUBJECTS = [
    "a retired schoolteacher",
    "a jazz festival",
    "a cordless drill",
    "a marathon runner",
    "a science fair",
    "a paperback mystery novel",
    "a beekeeper",
    "a winter coat",
    "a chess tournament",
    "a bakery owner",
    "a pair of hiking boots",
    "a software engineer",
    "a book signing",
    "a smartphone",
    "a lighthouse keeper",
    "a farmers market",
    "a cookbook",
    "a ship captain",
    "a robotics competition",
    "a box of organic apples",
    "a violinist",
    "a wool sweater",
    "a film premiere",
    "a nurse",
    "a hammer",
    "a poetry reading",
    "a mountain guide",
    "an electric kettle",
    "a charity gala",
    "a librarian",
    "a rain jacket",
    "a coding workshop",
    "an astronaut",
    "a jar of honey",
    "a street parade",
    "a carpenter",
    "a history textbook",
    "a pair of headphones",
    "a wedding",
    "a firefighter",
    "a garden spade",
    "an art exhibition",
    "a chef",
    "a laptop",
    "a football final",
    "a photographer",
    "a bag of coffee beans",
    "a tech conference",
    "a pilot",
    "a children's picture book",
]


def prompt(subject: str, schema: dict) -> list[dict]:
    fields = ", ".join(schema["properties"])
    return [{"role": "user", "content": f"Reply with JSON only. Describe {subject} with the fields: {fields}."}]


class GrammarClock:
    """Seconds spent inside GrammarMatcher's calls (masks and advancing), summed over every request."""

    def __init__(self) -> None:
        self.seconds = 0.0

    @contextmanager
    def installed(self):
        originals = {name: getattr(GrammarMatcher, name) for name in ("allowed", "advance")}

        def timed(fn):
            def wrapper(*args, **kwargs):
                t0 = time.perf_counter()
                try:
                    return fn(*args, **kwargs)
                finally:
                    self.seconds += time.perf_counter() - t0

            return wrapper

        for name, fn in originals.items():
            setattr(GrammarMatcher, name, timed(fn))
        try:
            yield self
        finally:
            for name, fn in originals.items():
                setattr(GrammarMatcher, name, fn)


def valid(text: str, schema: dict) -> tuple[bool, bool]:
    """(parses, validates against the schema)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        return False, False
    try:
        jsonschema.validate(doc, schema)
    except jsonschema.ValidationError:
        return True, False
    return True, True


def run_arm(llm: LLM, cases: list[tuple[str, str]], max_tokens: int, grammar: bool) -> dict:
    clock = GrammarClock()
    convs = [prompt(subject, SCHEMAS[name]) for subject, name in cases]
    params = [
        SamplingParams(
            max_tokens=max_tokens, structured_outputs=StructuredOutputs(json=SCHEMAS[name]) if grammar else None
        )
        for _, name in cases
    ]
    t0 = time.perf_counter()
    with clock.installed():
        outs = llm.chat(convs, params)
    wall = time.perf_counter() - t0
    checks = [valid(o.text, SCHEMAS[name]) for o, (_, name) in zip(outs, cases, strict=True)]
    return {
        "requests": len(outs),
        "tokens": sum(len(o.token_ids) for o in outs),
        "seconds": wall,
        "grammar_seconds": clock.seconds,
        "parsed": sum(p for p, _ in checks),
        "valid": sum(v for _, v in checks),
        "stopped": sum(o.finish_reason == "stop" for o in outs),
        "accepted": sum(o.metrics["num_accepted"] for o in outs),
        "forwards": sum(o.metrics["num_target_forwards"] for o in outs),
    }


def merge(total: dict, part: dict) -> dict:
    return {k: total.get(k, 0) + v for k, v in part.items()}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="smollm2-135m-instruct")
    p.add_argument("--method", default="ngram_tree")
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--subjects", type=int, default=len(SUBJECTS))
    p.add_argument("--max-tokens", type=int, default=200)
    p.add_argument("--chunk", type=int, default=16, help="requests per arm before the next arm runs")
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--output", default="results/structured.json")
    a = p.parse_args(argv)
    common = dict(target=a.target, max_num_seqs=a.batch, enforce_eager=a.enforce_eager)
    spec = LLM(method=a.method, num_speculative_tokens=a.k, **common)
    plain = LLM(method="none", **common)
    arms = {
        "grammar + speculation": (spec, True),
        "grammar, K = 0": (plain, True),
        "speculation, no grammar": (spec, False),
    }
    for llm, _ in arms.values():  # warm-up: compile the grammars once, and the first forwards
        llm.chat([prompt("a cat", SCHEMAS["person"])], SamplingParams(max_tokens=8))
    cases = [(s, name) for s in SUBJECTS[: a.subjects] for name in SCHEMAS]
    totals: dict[str, dict] = {name: {} for name in arms}
    for i in range(0, len(cases), a.chunk):  # arms interleaved: the machine's drift hits them alike
        for name, (llm, grammar) in arms.items():
            totals[name] = merge(totals[name], run_arm(llm, cases[i : i + a.chunk], a.max_tokens, grammar))
    report(totals, a)


def report(totals: dict[str, dict], a: argparse.Namespace) -> None:
    base = totals["grammar, K = 0"]
    base_rate = base["tokens"] / base["seconds"]
    table = Table(title=f"JSON output, {len(SCHEMAS)} schemas x {a.subjects} subjects, greedy, batch {a.batch}")
    for col in ("arm", "valid", "parsed", "tok/s", "vs grammar K=0", "tau", "mask us/token"):
        table.add_column(col)
    rows = {}
    for name, t in totals.items():
        rate = t["tokens"] / t["seconds"]
        row = {
            **t,
            "tokens_per_s": rate,
            "speedup_vs_grammar_k0": rate / base_rate,
            "tau": (t["accepted"] + t["forwards"]) / max(t["forwards"], 1),
            "mask_us_per_token": 1e6 * t["grammar_seconds"] / max(t["tokens"], 1),
        }
        rows[name] = row
        n = t["requests"]
        table.add_row(
            name,
            f"{t['valid']}/{n}",
            f"{t['parsed']}/{n}",
            f"{rate:.1f}",
            f"{row['speedup_vs_grammar_k0']:.2f}x",
            f"{row['tau']:.2f}",
            f"{row['mask_us_per_token']:.0f}" if t["grammar_seconds"] else "-",
        )
    Console().print(table)
    out = {
        "command": "python -m experiments.structured " + " ".join(sys.argv[1:]),
        "machine": f"{cpu_model()} ({os.cpu_count()} cores)",
        "date": date.today().isoformat(),
        "method": a.method,
        "k": a.k,
        "arms": rows,
    }
    write_result(a.output, out)


if __name__ == "__main__":
    main()
