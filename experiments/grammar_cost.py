"""Cost of JSON grammar masks per generated token: xgrammar (specdecode.grammar) against outlines-core.

Usage:
    python -m experiments.grammar_cost [--tokenizer DIR] [--repeats 5] [--output results/grammar_cost.json]

For each schema a valid document is tokenized (plus the stop token) and walked token by token. At each position
it times the three calls the engine makes: `allowed([[]])` (the next token's mask), `allowed` over the 9 chained
prefixes of the next 8 document tokens (verifying a K = 8 chain whose drafts are right), and `advance([token])`.
Both libraries do the same work behind the same calls and return the same bool mask [paths, vocab]. Compile time
is each schema's first compilation on a fresh compiler, plus "any JSON object" (json_object mode). The machine
may be shared, so each figure is the fastest of --repeats (per position, for the walks; then the median).

Settings as the engine uses them: xgrammar in strict mode with whitespace runs capped at MAX_WHITESPACE
(the cap costs it ~7 µs per mask); outlines-core with its default whitespace (one optional space), which keeps
its DFA smaller than an equivalent cap would. The documents are compact JSON, which both accept.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import date
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.table import Table
from transformers import AutoTokenizer

from specdecode.bench.lib import write_result
from specdecode.grammar import MAX_WHITESPACE, GrammarCompiler
from specdecode.hardware import cpu_model

CHAIN = 8  # drafts per chained `allowed` call: 9 paths, [] .. d_1..d_8

SCHEMAS: dict[str, tuple[dict, dict]] = {  # name -> (schema, a valid document)
    "profile": (
        {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "age": {"type": "integer"},
                "email": {"type": "string"},
                "is_active": {"type": "boolean"},
                "tags": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["name", "age", "email", "is_active", "tags"],
        },
        {
            "name": "Ada Lovelace",
            "age": 36,
            "email": "ada@analytical-engine.org",
            "is_active": True,
            "tags": ["mathematics", "poetry of science", "engines"],
        },
    ),
    "order": (
        {
            "type": "object",
            "properties": {
                "order_id": {"type": "string"},
                "customer": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string"},
                        "address": {
                            "type": "object",
                            "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
                            "required": ["street", "city"],
                        },
                    },
                    "required": ["name", "address"],
                },
                "items": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "sku": {"type": "string"},
                            "quantity": {"type": "integer", "minimum": 1},
                            "price": {"type": "number"},
                        },
                        "required": ["sku", "quantity", "price"],
                    },
                },
                "status": {"enum": ["pending", "shipped", "delivered"]},
            },
            "required": ["order_id", "customer", "items", "status"],
        },
        {
            "order_id": "A-10293",
            "customer": {"name": "Grace Hopper", "address": {"street": "12 Harbor Road", "city": "Arlington"}},
            "items": [
                {"sku": "COBOL-101", "quantity": 2, "price": 19.99},
                {"sku": "NANO-SEC", "quantity": 1, "price": 0.25},
            ],
            "status": "shipped",
        },
    ),
    "tool_call": (
        {
            "type": "object",
            "properties": {
                "name": {"enum": ["get_weather", "search_web", "send_email"]},
                "arguments": {
                    "type": "object",
                    "properties": {
                        "location": {"type": "string"},
                        "unit": {"enum": ["celsius", "fahrenheit"]},
                        "days": {"type": "integer"},
                    },
                    "required": ["location", "unit", "days"],
                    "additionalProperties": False,
                },
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        },
        {"name": "get_weather", "arguments": {"location": "San Francisco, CA", "unit": "celsius", "days": 3}},
    ),
}


class OutlinesCompiler:
    """The GrammarCompiler calls on outlines-core: a regex from the schema, compiled to a DFA over the vocabulary.

    Only for this comparison. outlines-core's Vocabulary takes token bytes, so byte-level BPE strings (GPT-2's
    printable stand-ins for bytes, e.g. "Ġ" for a space) are mapped back; special tokens are left out.
    """

    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: list[int]) -> None:
        import outlines_core
        from transformers.convert_slow_tokenizer import bytes_to_unicode

        byte_of = {ch: b for b, ch in bytes_to_unicode().items()}
        special = set(tokenizer.all_special_ids)
        tokens: dict[bytes, list[int]] = {}
        for text, i in tokenizer.get_vocab().items():
            if i not in special:
                tokens.setdefault(bytes(byte_of[ch] for ch in text), []).append(i)
        self.vocab_size = vocab_size
        self._vocabulary = outlines_core.Vocabulary(stop_token_ids[0], tokens)  # it knows a single stop token

    def compile_json(self, schema: dict | None):
        import outlines_core

        regex = outlines_core.json_schema.build_regex_from_schema(json.dumps(schema or {"type": "object"}))
        return outlines_core.Index(regex, self._vocabulary)

    def matcher(self, index) -> OutlinesMatcher:
        return OutlinesMatcher(index, self.vocab_size, self._vocabulary.get_eos_token_id())


class OutlinesMatcher:
    """allowed/advance on an outlines-core Guide, for chains: accept along the chain, roll back once.

    The Guide allows the stop token in a final state but has no transition on it, so the stop is kept here."""

    def __init__(self, index, vocab_size: int, stop: int) -> None:
        import outlines_core

        self.vocab_size = vocab_size
        self._stop = stop
        self._terminated = False
        self._guide = outlines_core.Guide(index, max_rollback=CHAIN + 1)
        self._bitmask = np.zeros((CHAIN + 1, (vocab_size + 31) // 32), dtype=np.int32)  # [rows, words]

    def allowed(self, paths: list[list[int]]) -> tuple[torch.Tensor, list[bool]]:
        chain = paths[-1]  # the bench's paths are the prefixes of the last one
        bitmask = self._bitmask[: len(chain) + 1]
        bitmask.fill(0)
        ok = [True] + [False] * len(chain)
        if not self._terminated:
            self._guide.write_mask_into(bitmask[0].ctypes.data, bitmask.shape[1], 4)
        accepted = 0
        for j, token in enumerate(chain, start=1):
            if not (bitmask[j - 1, token >> 5] >> (token & 31) & 1):
                break
            if token == self._stop:  # allowed, and nothing may follow: its row stays zero
                ok[j] = True
                break
            self._guide.advance(token, return_tokens=False)
            accepted, ok[j] = j, True
            self._guide.write_mask_into(bitmask[j].ctypes.data, bitmask.shape[1], 4)
        if accepted:
            self._guide.rollback_state(accepted)
        bits = np.unpackbits(bitmask.view(np.uint8), axis=1, bitorder="little")
        return torch.from_numpy(bits).view(torch.bool)[:, : self.vocab_size], ok

    def advance(self, tokens: list[int]) -> None:
        for token in tokens:
            if token == self._stop:
                self._terminated = True
            else:
                self._guide.advance(token, return_tokens=False)


def backends() -> dict[str, type]:
    """The installed libraries, by name -> compiler class with specdecode.grammar's constructor."""
    found: dict[str, type] = {"xgrammar": GrammarCompiler}
    try:
        import outlines_core  # noqa: F401

        found["outlines-core"] = OutlinesCompiler
    except ImportError:
        pass
    return found


def median_of_fastest_us(walks: list[list[float]]) -> float:
    """Per position the fastest of the walks (the machine is shared: slower repeats are interference), then the
    median over positions, in µs."""
    return round(1e6 * statistics.median(min(position) for position in zip(*walks, strict=True)), 1)


def walk(compiler, grammar, ids: list[int]) -> dict[str, list[float]]:
    """Time allowed([[]]), allowed(9 chained paths) and advance at each token of one document."""
    times: dict[str, list[float]] = {"allowed_1": [], "allowed_9": [], "advance": []}
    matcher = compiler.matcher(grammar)
    for t, token in enumerate(ids):
        t0 = time.perf_counter()
        mask, _ = matcher.allowed([[]])
        times["allowed_1"].append(time.perf_counter() - t0)
        assert mask[0, token], f"document token {t} ({token}) masked out"
        if t + CHAIN <= len(ids):  # full chains only, so every call sees 9 paths
            paths = [ids[t : t + j] for j in range(CHAIN + 1)]
            t0 = time.perf_counter()
            _, ok = matcher.allowed(paths)
            times["allowed_9"].append(time.perf_counter() - t0)
            assert all(ok), f"document rejected after token {t}"
        t0 = time.perf_counter()
        matcher.advance([token])
        times["advance"].append(time.perf_counter() - t0)
    return times


def compile_fresh(cls: type, tokenizer, vocab_size: int, stop: list[int], schema: dict | None, repeats: int):
    """The fastest of `repeats` first compilations, each on a fresh compiler (no cache) -> (ms, compiler, grammar)."""
    best = float("inf")
    for _ in range(repeats):
        compiler = cls(tokenizer, vocab_size, stop)
        t0 = time.perf_counter()
        grammar = compiler.compile_json(schema)
        best = min(best, time.perf_counter() - t0)
    return round(1e3 * best, 1), compiler, grammar


def measure(name: str, cls: type, tokenizer, vocab_size: int, stop: list[int], repeats: int) -> list[dict]:
    rows = []
    for schema_name, schema in [("any object (json_object)", None)] + [(n, s) for n, (s, _) in SCHEMAS.items()]:
        ms, compiler, grammar = compile_fresh(cls, tokenizer, vocab_size, stop, schema, repeats)
        row = {"library": name, "schema": schema_name, "compile_ms": ms}
        if schema is not None:
            ids = tokenizer.encode(json.dumps(SCHEMAS[schema_name][1]), add_special_tokens=False) + [stop[0]]
            walk(compiler, grammar, ids)  # warm-up: first-call costs and lazily built caches
            walks = [walk(compiler, grammar, ids) for _ in range(repeats)]
            row["tokens"] = len(ids)
            for key in walks[0]:
                row[f"{key}_us"] = median_of_fastest_us([w[key] for w in walks])
        rows.append(row)
    return rows


def render(rows: list[dict]) -> None:
    table = Table(title="JSON grammar cost per token (median µs over positions; compile in ms)")
    columns = ["library", "schema", "tokens", "compile_ms", "allowed_1_us", "allowed_9_us", "advance_us"]
    for c in columns:
        table.add_column(c, justify="left" if c in ("library", "schema") else "right")
    for row in rows:
        table.add_row(*(str(row.get(c, "-")) for c in columns))
    Console(file=sys.stdout, width=120).print(table)


def library_version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokenizer", help="Hugging Face tokenizer directory (default: SmolLM2-135M-Instruct's)")
    p.add_argument("--repeats", type=int, default=5, help="compilations and timed walks of each schema")
    p.add_argument("--output", default="results/grammar_cost.json")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    if a.tokenizer is None:
        from specdecode.models.loader import resolve_model_dir

        a.tokenizer = str(resolve_model_dir("smollm2-135m-instruct", progress=False))
    tokenizer = AutoTokenizer.from_pretrained(a.tokenizer)
    stop = [tokenizer.eos_token_id]
    rows = []
    for name, cls in backends().items():
        rows += measure(name, cls, tokenizer, len(tokenizer), stop, a.repeats)
    render(rows)
    result = {
        "command": " ".join(["python -m experiments.grammar_cost", *(sys.argv[1:] if argv is None else argv)]),
        "machine": f"{cpu_model()} ({os.cpu_count()} cores, shared with other jobs)",
        "date": date.today().isoformat(),
        "tokenizer": Path(a.tokenizer).name,
        "vocab_size": len(tokenizer),
        "versions": {n: library_version(n) for n in ("xgrammar", "outlines-core")},
        "settings": {"xgrammar": f"strict mode, max_whitespace {MAX_WHITESPACE}", "outlines-core": "default regex"},
        "rows": rows,
    }
    write_result(a.output, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
