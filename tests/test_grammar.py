"""JSON grammar masks (specdecode/grammar.py) on the real SmolLM2 tokenizer, checked against an independent JSON
prefix parser and against token-by-token matching."""

from __future__ import annotations

import json
import random

import pytest
import torch
import xgrammar as xgr

from specdecode import grammar
from specdecode.config import ConfigError
from specdecode.grammar import GrammarCompiler, GrammarViolationError, check_schema

PADDING = 45  # model vocab = tokenizer + padding, not a multiple of 32: the mask's last word is partly unused

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "tags": {"type": "array"}},
    "required": ["name", "age", "tags"],
}
PERSON_DOC = '{"name": "Bob", "age": 42, "tags": ["a", 1]}'

# Tight enough that a random walk over allowed tokens finishes within a few hundred tokens.
RECORD = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 0, "maximum": 999},
        "ok": {"type": "boolean"},
        "color": {"enum": ["red", "green", "blue"]},
        "label": {"type": "string", "maxLength": 8},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 3},
    },
    "required": ["id", "ok", "color", "label", "tags"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def tok(smollm2_tokenizer):
    return smollm2_tokenizer


@pytest.fixture(scope="module")
def stops(tok) -> list[int]:
    return [tok.eos_token_id, tok.convert_tokens_to_ids("<|endoftext|>")]  # <|im_end|> and <|endoftext|>


@pytest.fixture(scope="module")
def compiler(tok, stops) -> GrammarCompiler:
    return GrammarCompiler(tok, len(tok) + PADDING, stops)


def encode(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def next_mask(matcher) -> torch.Tensor:
    mask, ok = matcher.allowed([[]])
    assert ok == [True]
    return mask[0]  # [vocab]


def test_valid_document_is_accepted_and_ends_with_only_the_stops(compiler, tok, stops):
    m = compiler.matcher(compiler.compile_json(PERSON))
    for token in encode(tok, PERSON_DOC):
        mask = next_mask(m)
        assert mask[token]
        assert not mask[stops].any()  # the document is incomplete until its last token
        m.advance([token])
    mask = next_mask(m)
    assert mask[stops].all() and mask.sum() == len(stops)  # complete: only a stop may follow
    after_stop, ok = m.allowed([[stops[0]], [stops[0], stops[1]]])
    assert ok == [True, False] and not after_stop.any()  # and nothing after the stop
    m.advance([stops[1]])
    assert m.is_terminated
    assert not next_mask(m).any()


def test_breaking_token_is_masked_and_its_paths_are_invalid(compiler, tok):
    m = compiler.matcher(compiler.compile_json(PERSON))
    m.advance(encode(tok, '{"name": "Bob", "age":'))
    bad, good = encode(tok, "]")[0], encode(tok, " 4")[0]
    assert not next_mask(m)[bad]
    mask, ok = m.allowed([[], [bad], [bad, good], [good], [good, bad]])
    assert ok == [True, False, False, True, False]
    assert not mask[[1, 2, 4]].any()  # a rejected path allows nothing after it
    assert mask[[0, 3]].any(dim=1).all()
    with pytest.raises(GrammarViolationError):
        m.advance([good, bad])
    assert next_mask(m)[good]  # all or none: the good token was not committed either


def test_allowed_leaves_the_committed_state_unchanged(compiler, tok, stops):
    m = compiler.matcher(compiler.compile_json(PERSON))
    m.advance(encode(tok, '{"name": "Bob", "age": 4'))
    before = next_mask(m)
    rest = encode(tok, '2, "tags": []}') + [stops[0]]
    m.allowed([rest[:j] for j in range(len(rest) + 1)] + [[encode(tok, "]")[0]], rest[:2] + [7]])
    assert torch.equal(next_mask(m), before)
    m.advance(rest[:2])  # negative control: committing "2," does change the mask
    assert not torch.equal(next_mask(m), before)


def test_paths_match_token_by_token_matching(compiler, tok):
    """Every row of one trie walk equals the mask of a fresh matcher advanced along that path alone."""
    grammar = compiler.compile_json(PERSON)
    prefix = encode(tok, '{"name": "')
    a, b, c = encode(tok, "Bob")[0], encode(tok, '",')[0], encode(tok, "Al")[0]
    paths = [[a, b], [], [c], [a], [a, b, b], [c, b], [a, c], [a, b]]  # rows out of trie order, one repeated
    m = compiler.matcher(grammar)
    m.advance(prefix)
    mask, ok = m.allowed(paths)
    for row, path in enumerate(paths):
        single = compiler.matcher(grammar)
        single.advance(prefix)
        try:
            single.advance(path)
        except GrammarViolationError:
            assert not ok[row] and not mask[row].any()
            continue
        assert ok[row] and torch.equal(mask[row], next_mask(single))
    assert ok == [True, True, True, True, False, True, True, True]


def test_mask_covers_the_model_vocab_without_padding_or_special_tokens(compiler, tok, stops):
    m = compiler.matcher(compiler.compile_json(None))
    m.advance(encode(tok, '{"note": "'))  # inside a string almost any text is allowed
    mask, _ = m.allowed([[], [encode(tok, "hi")[0]]])
    assert mask.shape == (2, len(tok) + PADDING) and mask.dtype == torch.bool
    assert mask.sum(dim=1).min() > len(tok) // 2  # control: the string admits most of the vocabulary...
    assert not mask[:, len(tok) :].any()  # ...but never padding ids,
    special = [i for i, t in tok.added_tokens_decoder.items() if t.special and i not in stops]
    assert special and not mask[:, special].any()  # nor special tokens such as <|im_start|> as literal text
    with pytest.raises(ValueError, match="token ids"):
        m.allowed([[-1]])  # PAD reaching the matcher is an engine bug


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "nonsense"},
        [1, 2],
        "an object",
        {"type": "object", "required": "name"},
        {"$ref": "#/nowhere"},
        {"type": "object", "properties": {"a": {"type": 5}}},
        {"enum": {1, 2}},
    ],
)
def test_invalid_schema_raises_a_one_line_config_error(compiler, schema):
    with pytest.raises(ConfigError) as e:
        compiler.compile_json(schema)
    message = str(e.value)
    assert "schema" in message and "\n" not in message
    assert ".cc:" not in message and not message.startswith("[")  # xgrammar's C++ location is stripped


def test_compile_cache_is_per_schema_and_keeps_property_order(compiler, tok):
    first = compiler.compile_json(PERSON)
    assert compiler.compile_json(json.loads(json.dumps(PERSON))) is first
    assert compiler.compile_json(None) is compiler.compile_json(None) is not first
    ab = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
    ba = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "integer"}}}
    assert compiler.compile_json(ab) is not compiler.compile_json(ba)  # properties are generated in order
    for schema, ok in ((ab, True), (ba, False)):
        m = compiler.matcher(compiler.compile_json(schema))
        path = encode(tok, '{"a": 1, "b": 2}')
        assert m.allowed([path])[1] == [ok]


def test_whitespace_runs_are_bounded(compiler, tok, stops):
    """Pretty-printing fits; a run past max_whitespace does not, unless the bound is off (the control)."""
    pretty, runaway = encode(tok, '{\n    "name"'), encode(tok, "{" + " " * (compiler.max_whitespace + 1))
    unbounded = GrammarCompiler(tok, len(tok), stops, max_whitespace=None)
    for c, expected in ((compiler, [True, False]), (unbounded, [True, True])):
        assert c.matcher(c.compile_json(PERSON)).allowed([pretty, runaway])[1] == expected


def test_length_bounded_strings_admit_no_control_characters(compiler, tok):
    """xgrammar's own bounded strings admit raw control characters (mlc-ai/xgrammar#800; the control below): the
    compiler rewrites the bounds as a pattern, which keeps the bound and the JSON."""
    control = [i for i in range(len(tok)) if any(ord(ch) < 0x20 for ch in tok.decode([i]))]
    schema = {"type": "object", "properties": {"s": {"type": "string", "maxLength": 3}}, "required": ["s"]}
    opening = encode(tok, '{"s": "')
    m = compiler.matcher(compiler.compile_json(schema))
    m.advance(opening)
    assert not next_mask(m)[control].any()
    assert m.allowed([encode(tok, 'abc"}'), encode(tok, 'abcd"}')])[1] == [True, False]
    raw = xgr.GrammarMatcher(compiler._compiler.compile_json_schema(json.dumps(schema)))
    assert all(raw.accept_token(t) for t in opening)
    bitmask = xgr.allocate_token_bitmask(1, compiler.vocab_size)
    raw.fill_next_token_bitmask(bitmask)
    assert any(bitmask[0, t // 32] >> (t % 32) & 1 for t in control)  # fixed upstream? then drop the rewrite


def random_walk(compiler, tok, schema, stops, seed: int, steps: int = 200) -> tuple[list[int], bool]:
    """Random allowed tokens (a stop as soon as one is allowed); checks each prefix with the independent parser."""
    gen = torch.Generator().manual_seed(seed)
    m = compiler.matcher(compiler.compile_json(schema))
    ids: list[int] = []
    for _ in range(steps):
        mask = next_mask(m)
        stop = next((s for s in stops if mask[s]), None)
        uniform = torch.rand(mask.shape, generator=gen).masked_fill(~mask, -1.0)  # [vocab]: argmax is uniform
        token = stop if stop is not None else int(uniform.argmax())
        m.advance([token])
        if m.is_terminated:
            return ids, True
        ids.append(token)
        assert is_json_prefix(tok.decode(ids)), tok.decode(ids)
    return ids, False


@pytest.mark.parametrize("schema", [RECORD, None], ids=["record", "json_object"])
def test_random_walks_stay_valid_json_and_validate_when_done(compiler, tok, stops, schema):
    finished = 0
    for seed in range(8):
        ids, done = random_walk(compiler, tok, schema, stops, seed)
        if done:
            doc = json.loads(tok.decode(ids))
            assert isinstance(doc, dict)
            if schema is RECORD:
                check_record(doc)
            finished += 1
    if schema is RECORD:
        assert finished >= 4  # the validation above ran on real documents


def test_prefix_parser_rejects_an_unconstrained_walk(tok):
    """Negative control: the same check fails at once on tokens drawn without the mask."""
    rng = random.Random(0)
    assert is_json_prefix('{"a": [1, {"b": "x\\u00')
    assert not is_json_prefix('{"a" 1') and not is_json_prefix('{"a": 1}}')
    ids = encode(tok, "{")
    for _ in range(5):
        ids.append(rng.randrange(len(tok)))
    assert not is_json_prefix(tok.decode(ids))


def check_record(doc: dict) -> None:
    assert set(doc) == set(RECORD["required"])
    assert type(doc["id"]) is int and 0 <= doc["id"] <= 999
    assert type(doc["ok"]) is bool
    assert doc["color"] in ("red", "green", "blue")
    assert isinstance(doc["label"], str) and len(doc["label"]) <= 8
    assert isinstance(doc["tags"], list) and len(doc["tags"]) <= 3
    assert all(isinstance(t, str) and len(t) <= 5 for t in doc["tags"])


class _End(Exception):
    """The text ended inside a value: everything so far was a valid prefix."""


class _Prefix:
    """Recursive-descent JSON parser that raises _End where the text runs out and ValueError where it is wrong."""

    def __init__(self, text: str) -> None:
        self.s, self.i = text, 0

    def peek(self) -> str:
        if self.i >= len(self.s):
            raise _End
        return self.s[self.i]

    def eat(self, chars: str) -> str:
        c = self.peek()
        if c not in chars:
            raise ValueError(f"{c!r} at {self.i}")
        self.i += 1
        return c

    def digits(self, first: str = "0123456789") -> None:
        self.eat(first)
        while self.i < len(self.s) and self.s[self.i].isdigit():
            self.i += 1

    def ws(self) -> None:
        while self.i < len(self.s) and self.s[self.i] in " \t\n\r":
            self.i += 1

    def value(self) -> None:
        self.ws()
        c = self.peek()
        if c in "{[":
            self.i += 1
            close, item = ("}", self.member) if c == "{" else ("]", self.value)
            self.ws()
            if self.peek() == close:
                self.i += 1
                return
            while True:
                item()
                self.ws()
                if self.eat("," + close) == close:
                    return
        elif c == '"':
            self.string()
        elif c in "-0123456789":
            self.number()
        else:
            word = next((w for w in ("true", "false", "null") if w[0] == c), None)
            if word is None:
                raise ValueError(f"{c!r} at {self.i}")
            for expected in word:
                self.eat(expected)

    def member(self) -> None:
        self.ws()
        self.string()
        self.ws()
        self.eat(":")
        self.value()

    def string(self) -> None:
        self.eat('"')
        while (c := self.peek()) != '"':
            self.i += 1
            if c == "\\":
                if self.eat('"\\/bfnrtu') == "u":
                    for _ in range(4):
                        self.eat("0123456789abcdefABCDEF")
            elif ord(c) < 0x20:
                raise ValueError("control character in a string")
        self.i += 1

    def number(self) -> None:
        if self.peek() == "-":
            self.i += 1
        if self.eat("0123456789") != "0":
            self.i -= 1
            self.digits()
        if self.i < len(self.s) and self.s[self.i] == ".":
            self.i += 1
            self.digits()
        if self.i < len(self.s) and self.s[self.i] in "eE":
            self.i += 1
            if self.peek() in "+-":
                self.i += 1
            self.digits()


def is_json_prefix(text: str) -> bool:
    """Whether some continuation of text is one JSON value (independent of the grammar library)."""
    parser = _Prefix(text)
    try:
        parser.value()
        parser.ws()
        return parser.i == len(text)
    except _End:
        return True
    except ValueError:
        return False


def test_compiled_grammars_are_bounded_in_memory(tok, stops, monkeypatch):
    """xgrammar's own cache is unbounded by default (cache_limit_bytes=-1, GHSA-389x-67px-mjg3); ours held 256
    grammars whatever their size. Both are bounded by CACHE_BYTES: here, room for about one grammar."""
    monkeypatch.setattr(grammar, "CACHE_BYTES", 4 * 1024 * 1024)
    small = GrammarCompiler(tok, len(tok) + PADDING, stops)
    assert small._compiler.cache_limit_bytes == 4 * 1024 * 1024
    for i in range(3):
        small.compile_json({"type": "object", "properties": {f"p{i}": {"type": "integer"}}})
    assert len(small._cache) == 1 and 0 < small._cache_bytes <= 4 * 1024 * 1024
    assert GrammarCompiler(tok, len(tok) + PADDING, stops)._compiler.cache_limit_bytes == grammar.CACHE_BYTES > 0


LIMITS = dict(max_bytes=1000, max_depth=4, max_enum=3, max_repeat=8)


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        ({"type": "object", "description": "x" * 1000}, "bytes"),
        ({"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"enum": [[1]]}}}}, "deeper"),
        ({"enum": [1, 2, 3, 4]}, "enum"),
        ({"type": "string", "maxLength": 9}, "maxLength"),
        ({"type": "string", "minLength": 9}, "minLength"),
        ({"type": "string", "pattern": "^(ab){2,9}$"}, "pattern"),
        ({"type": "string", "pattern": "^a{10,}$"}, "pattern"),
        ({"properties": {"a": {"type": "string", "maxLength": 100}}}, "maxLength"),  # found inside properties
    ],
)
def test_check_schema_refuses_what_is_over_a_bound(schema, words):
    with pytest.raises(ConfigError, match=words):
        check_schema(schema, **LIMITS)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "description": "x" * 900},
        {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}}},
        {"enum": [1, 2, 3]},
        {"type": "string", "minLength": 8, "maxLength": 8, "pattern": "^a{1,8}$"},
        {"type": "string", "pattern": "^[{}]{2}$"},
    ],
)
def test_check_schema_passes_what_is_within_the_bounds(schema):
    check_schema(schema, **LIMITS)
