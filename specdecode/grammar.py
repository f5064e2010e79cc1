"""Token masks from a JSON grammar: structured output (OpenAI `response_format`) under speculative decoding.

A GrammarCompiler (one per tokenizer) turns a JSON schema, or None for "any JSON object", into a
CompiledGrammar; each request gets a GrammarMatcher that holds its committed parse state. Every step the engine
asks which tokens may follow each draft path (`allowed`: one mask row per path, so the target's distribution at
every verified position can be constrained before acceptance, which keeps verification lossless) and then
commits what it emitted (`advance`).

Backed by xgrammar, chosen over outlines-core by `python -m experiments.grammar_cost` (results/
grammar_cost.json): it compiles a schema in 20-45 ms where outlines-core takes 2-4x as long, and "any JSON
object" in 20-45 ms where outlines-core needs 6-13 s and still bounds the nesting depth (a regex DFA over the
vocabulary cannot count brackets). outlines-core's single mask is faster (~11 against ~30 µs), its 9-path chain
anywhere from 3x faster to 2x slower; all of it is small beside a model step. xgrammar also walks a whole draft
tree in one native call, and knows several stop tokens and a model vocabulary larger than the tokenizer's.
"""

from __future__ import annotations

import functools
import json
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch
import xgrammar as xgr

from specdecode.config import ConfigError

ANY_OBJECT = '{"type": "object"}'  # json_object mode: an object with any members
# Whitespace between two JSON elements, at most: a newline and indentation to depth 4 at 4 spaces. Unbounded, a
# small model can spend its whole budget on whitespace, which the grammar would never stop. The bound costs
# ~7 µs per mask (xgrammar caches fewer masks for counted whitespace): ~90 µs per step for a chain of K = 8.
MAX_WHITESPACE = 20
CACHE_SIZE = 256  # compiled schemas kept per compiler; requests reusing a schema skip compilation
# Memory that compiled grammars may hold per compiler, in our cache and in xgrammar's own (unbounded by default:
# GHSA-389x-67px-mjg3). A JSON grammar over SmolLM2's vocabulary takes ~2.6-3 MB.
CACHE_BYTES = 256 * 1024 * 1024
_NATIVE_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: (?:Check failed: .*? is false: )?")  # "[01:46:05] a.cc:12: "


class GrammarViolationError(RuntimeError):
    """A committed token the grammar forbids: the engine emitted a token its own mask disallowed (a bug)."""


@dataclass(frozen=True, eq=False)
class CompiledGrammar:
    """A compiled JSON grammar; immutable and shared by every request with the same schema."""

    schema_key: str  # json.dumps(schema) (key order kept: it is the order members are generated in), "null" = any
    compiled: xgr.CompiledGrammar


class GrammarCompiler:
    """Compiles JSON schemas against one tokenizer and model vocabulary; caches them per schema."""

    def __init__(
        self, tokenizer, vocab_size: int, stop_token_ids: list[int], max_whitespace: int | None = MAX_WHITESPACE
    ) -> None:
        """tokenizer: a Hugging Face tokenizer; vocab_size: the model's (may exceed len(tokenizer)); stop_token_ids:
        the EOS ids the engine stops on; max_whitespace: characters between JSON elements (None = unbounded)."""
        if not stop_token_ids:
            raise ValueError("a grammar needs at least one stop token id")
        self.vocab_size = vocab_size
        self.max_whitespace = max_whitespace
        info = _tokenizer_info(tokenizer, vocab_size, stop_token_ids)
        self._compiler = xgr.GrammarCompiler(info, cache_limit_bytes=CACHE_BYTES)
        self._cache: OrderedDict[str, CompiledGrammar] = OrderedDict()
        self._cache_bytes = 0
        self._lock = threading.Lock()  # a server compiles in worker threads while the engine thread reads the cache

    def compile_json(self, schema: dict | None) -> CompiledGrammar:
        """schema None = any JSON object (`json_object` mode). An invalid schema raises ConfigError.

        Properties a schema does not declare are not generated unless it sets `additionalProperties`, and
        properties come in the schema's order (xgrammar's strict mode; vLLM's and SGLang's default, and what
        OpenAI's strict structured outputs require of a schema): every output validates, and compiling stays
        tens of milliseconds (JSON Schema's default of "any extra property" costs 0.1-0.8 s per schema). Whitespace
        between elements is free up to max_whitespace characters, so a model that pretty-prints keeps its habit.
        """
        key = _schema_key(schema)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        try:
            schema_text = json.dumps(_bounded_strings_as_patterns(schema)) if schema is not None else ANY_OBJECT
            compiled = self._compiler.compile_json_schema(schema_text, max_whitespace_cnt=self.max_whitespace)
        except RuntimeError as e:  # xgrammar reports every schema problem as a RuntimeError with a C++ prefix
            raise ConfigError(f"invalid JSON schema: {_one_line(e)}") from None
        grammar = CompiledGrammar(key, compiled)
        with self._lock:
            if key not in self._cache:
                self._cache[key] = grammar
                self._cache_bytes += compiled.memory_size_bytes
            while len(self._cache) > CACHE_SIZE or (self._cache_bytes > CACHE_BYTES and len(self._cache) > 1):
                _, old = self._cache.popitem(last=False)
                self._cache_bytes -= old.compiled.memory_size_bytes
        return grammar

    def matcher(self, grammar: CompiledGrammar) -> GrammarMatcher:
        return GrammarMatcher(grammar, self.vocab_size)


class GrammarMatcher:
    """One request's parse state: masks for draft paths, and the tokens committed so far."""

    def __init__(self, grammar: CompiledGrammar, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self._matcher = xgr.GrammarMatcher(grammar.compiled)
        self._bitmask = xgr.allocate_token_bitmask(1, vocab_size)  # [rows, ceil(vocab / 32)] int32, grown on use

    def allowed(self, paths: list[list[int]]) -> tuple[torch.Tensor, list[bool]]:
        """paths[i]: token ids after the committed ones ([] = the next token now).

        Returns mask [len(paths), vocab_size] bool (True = may follow that path) and, per path, whether the path
        itself stays inside the grammar (a path with a rejected token has an all-False row). The committed state
        is unchanged.

        Cost: paths are merged into a trie, so a shared prefix is parsed once; xgrammar then walks the trie in
        one native call (accept a token, fill its mask, roll back), one accept and one mask fill per distinct
        node. The K + 1 prefixes of a K-token chain are K + 1 nodes, not (K + 1)(K + 2) / 2 tokens. Measured on
        SmolLM2's 49k vocabulary (2-core EPYC): ~30 µs for [[]], 150-190 µs for a chain's 9 paths, of which
        ~25 µs is unpacking the bool rows and ~90 µs the whitespace cap.
        """
        parents, tokens, rows = _trie(paths)
        self._check_ids(tokens[1:])
        n = len(tokens)
        first_child, next_sibling = _links(tuple(parents))
        bitmask = self._rows(n)  # [n, ceil(vocab / 32)]
        bitmask.zero_()  # the walk leaves rejected nodes' rows untouched; zero keeps them all-False
        self._matcher.traverse_draft_tree(first_child, next_sibling, torch.tensor(tokens), bitmask)
        packed = bitmask.numpy()  # [n, ceil(vocab / 32)]: bit t % 32 of word t // 32 allows token t
        # A node is inside the grammar iff its parent's mask allows its token (a rejected parent's row is zero).
        node_ok = [True] + [bool(packed[parents[i], tokens[i] >> 5] >> (tokens[i] & 31) & 1) for i in range(1, n)]
        mask = _unpack(packed)[:, : self.vocab_size]  # [n, vocab]
        if rows != list(range(n)):  # a chain's prefixes are its nodes in order: no gather needed
            mask = mask[rows]  # [len(paths), vocab]
        return mask.contiguous(), [node_ok[r] for r in rows]

    def advance(self, tokens: list[int]) -> None:
        """Commit emitted tokens. All or none: a disallowed token raises and leaves the state as it was."""
        for i, token in enumerate(tokens):
            if not (0 <= token < self.vocab_size and self._matcher.accept_token(token)):
                if i:
                    self._matcher.rollback(i)
                raise GrammarViolationError(f"token {token} (position {i} of {tokens}) is not allowed by the grammar")

    @property
    def is_terminated(self) -> bool:
        """True once a stop token was committed after a complete document."""
        return self._matcher.is_terminated()

    def _rows(self, n: int) -> torch.Tensor:
        if self._bitmask.shape[0] < n:
            self._bitmask = xgr.allocate_token_bitmask(n, self.vocab_size)
        return self._bitmask[:n]

    def _check_ids(self, tokens: list[int]) -> None:
        # xgrammar would index its bitmask with an out-of-range id; PAD (-1) reaching here is an engine bug.
        if tokens and not (0 <= min(tokens) and max(tokens) < self.vocab_size):
            raise ValueError(f"token ids must be in [0, {self.vocab_size}), got {tokens}")


def _tokenizer_info(tokenizer, vocab_size: int, stop_token_ids: list[int]) -> xgr.TokenizerInfo:
    """xgrammar's view of the vocabulary, with special tokens other than the stops made unreachable.

    xgrammar reads a special token such as <|im_start|> as its literal text, so it would allow one inside a JSON
    string while the detokenizer drops it; an empty string is how xgrammar marks a token never allowed. Ids at
    or past len(tokenizer) (model padding) are empty too.
    """
    detected = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids)
    special = set(tokenizer.all_special_ids) | {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    vocab = [""] * vocab_size
    for text, i in tokenizer.get_vocab().items():
        if i < vocab_size and (i not in special or i in stop_token_ids):
            vocab[i] = text
    return xgr.TokenizerInfo(
        vocab,
        detected.vocab_type,
        vocab_size=vocab_size,
        stop_token_ids=list(stop_token_ids),
        add_prefix_space=detected.add_prefix_space,
    )


_QUANTIFIER = re.compile(r"\{(\d+)(?:,(\d*))?\}")  # a regex's counted repetition: {n}, {n,} or {n,m}


def check_schema(schema: dict, max_bytes: int, max_depth: int, max_enum: int, max_repeat: int) -> None:
    """Refuse (ConfigError) a schema whose compilation could take unbounded time or memory: larger than max_bytes as
    JSON, nested deeper than max_depth, an enum of more than max_enum values, or a string length bound (which
    becomes a regex of that many characters, compiled in time that grows with it) or a pattern's counted
    repetition over max_repeat."""
    _check_node(schema, 1, max_depth, max_enum, max_repeat)  # depth first: json.dumps recurses
    size = len(_schema_key(schema).encode())
    if size > max_bytes:
        raise ConfigError(f"JSON schema is {size} bytes; at most {max_bytes} are allowed")


def _check_node(node, depth: int, max_depth: int, max_enum: int, max_repeat: int) -> None:
    """`node` is an object or array `depth` levels deep (the schema itself is level 1)."""
    if isinstance(node, (dict, list)) and depth > max_depth:
        raise ConfigError(f"JSON schema nests deeper than {max_depth} levels")
    if isinstance(node, list):
        for v in node:
            _check_node(v, depth + 1, max_depth, max_enum, max_repeat)
        return
    if not isinstance(node, dict):
        return
    enum = node.get("enum")
    if isinstance(enum, list) and len(enum) > max_enum:
        raise ConfigError(f"JSON schema enum has {len(enum)} values; at most {max_enum} are allowed")
    for bound in ("minLength", "maxLength"):
        n = node.get(bound)
        if isinstance(n, int) and n > max_repeat:
            raise ConfigError(f"JSON schema {bound} is {n}; at most {max_repeat} is allowed")
    pattern = node.get("pattern")
    if isinstance(pattern, str):
        for m in _QUANTIFIER.finditer(pattern):
            if max(int(g) for g in m.groups() if g) > max_repeat:
                raise ConfigError(f"JSON schema pattern repeats {m.group(0)}; at most {max_repeat} times is allowed")
    for v in node.values():
        _check_node(v, depth + 1, max_depth, max_enum, max_repeat)


def _schema_key(schema: dict | None) -> str:
    if schema is None:
        return "null"
    if not isinstance(schema, dict):
        raise ConfigError(f"a JSON schema must be an object, got {type(schema).__name__}")
    try:
        return json.dumps(schema)  # not sort_keys: members are generated in the schema's order of properties
    except (TypeError, ValueError) as e:
        raise ConfigError(f"a JSON schema must be plain JSON: {e}") from None


def _bounded_strings_as_patterns(node):
    """The schema with each string's minLength/maxLength rewritten as a `pattern` of as many characters.

    xgrammar 0.2.8 lowers a length-bounded string to a character class that admits raw control characters
    (mlc-ai/xgrammar#800), which no JSON parser accepts; its `pattern` path is JSON-aware. Either way such a
    string holds no escapes. The user's schema is not modified."""
    if isinstance(node, list):
        return [_bounded_strings_as_patterns(v) for v in node]
    if not isinstance(node, dict):
        return node
    values = ("const", "enum", "default", "examples")  # these hold JSON values, not schemas
    out = {k: v if k in values else _bounded_strings_as_patterns(v) for k, v in node.items()}
    if out.get("type") == "string" and "pattern" not in out and ("minLength" in out or "maxLength" in out):
        low, high = out.pop("minLength", 0), out.pop("maxLength", None)
        if not all(isinstance(b, int) and b >= 0 for b in (low, high) if b is not None):
            raise ConfigError(f"minLength and maxLength must be non-negative integers, got {low} and {high}")
        out["pattern"] = f"^.{{{low},{'' if high is None else high}}}$"
    return out


def _one_line(error: Exception) -> str:
    """xgrammar's message without its timestamp and C++ source location, first line only."""
    text = _NATIVE_PREFIX.sub("", str(error).strip())
    return text.splitlines()[0] if text else type(error).__name__


def _trie(paths: list[list[int]]) -> tuple[list[int], list[int], list[int]]:
    """Merge paths into a trie. Node 0 is the committed state; nodes are numbered parents first.

    Returns parents (-1 for the root), tokens (0 for the root) and rows (the node that ends each path)."""
    parents, tokens, rows = [-1], [0], []
    children: dict[tuple[int, int], int] = {}  # (parent node, token) -> node
    for path in paths:
        node = 0
        for token in path:
            child = children.get((node, token))
            if child is None:
                child = children[node, token] = len(tokens)
                parents.append(node)
                tokens.append(token)
            node = child
        rows.append(node)
    return parents, tokens, rows


@functools.lru_cache(maxsize=1024)
def _links(parents: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """First-child and next-sibling links ([num_nodes] int64, -1 = none), the tree layout xgrammar walks.

    Cached: a step's trie has the shape of the last step's (a chain of K, or the drafter's tree) nearly always,
    and building the two tensors costs more than the walk itself. xgrammar only reads them."""
    first_child = [-1] * len(parents)
    next_sibling = [-1] * len(parents)
    last_child: dict[int, int] = {}
    for node, parent in enumerate(parents[1:], start=1):
        if parent in last_child:
            next_sibling[last_child[parent]] = node
        else:
            first_child[parent] = node
        last_child[parent] = node
    return torch.tensor(first_child), torch.tensor(next_sibling)


def _unpack(packed: np.ndarray) -> torch.Tensor:
    """[n, words] int32 packed -> [n, words * 32] bool. numpy's unpackbits is ~4x faster than torch shifts."""
    bits = np.unpackbits(packed.view(np.uint8), axis=1, bitorder="little")  # int32 words are little-endian
    return torch.from_numpy(bits).view(torch.bool)
