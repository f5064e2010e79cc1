"""Token indexes for suffix decoding: where the current suffix occurred before, and what followed it.

Both indexes answer the same two questions about a token history: `match(pattern)`, the longest suffix of
`pattern` that occurs in the history and a node standing for all its occurrences; `children(node)`, the
tokens that followed those occurrences with their counts, each with a node for the longer continuation.
A node's count is its number of occurrences (ones that end there included), so count(child) / count(node)
is the empirical probability of that continuation: the suffix tree of the SuffixDecoding paper, read lazily.

- `SuffixArray` is built once over a large static corpus (seconds for millions of tokens, prefix doubling in
  numpy) and answered by binary search: occurrences of a pattern are one contiguous range of the array, and
  because suffixes are sorted past the pattern, so are each continuation's occurrences (a sub-range).
- `TokenScan` answers from a plain token buffer by a vectorised scan: for one request's prompt + output,
  and for the bounded cache of recent outputs, which change every step and are small.
"""

from __future__ import annotations

import bisect
import math
from pathlib import Path

import numpy as np

from specdecode.config import ConfigError

SEPARATOR = np.iinfo(np.int32).max  # between documents: above every token, never matched, never proposed
SAMPLE = 4096  # past this many occurrences, continuations are found on a strided sample of them

# (lo, hi, offset): SuffixArray rows lo..hi-1, whose suffixes share their first `offset` tokens
RangeNode = tuple[int, int, int]


def join_documents(docs: list[np.ndarray]) -> np.ndarray:
    """[sum(len) + len(docs)] int32 the documents, each followed by SEPARATOR (so no match spans two)."""
    out = np.full(sum(len(d) for d in docs) + len(docs), SEPARATOR, dtype=np.int32)
    at = 0
    for d in docs:
        out[at : at + len(d)] = d
        at += len(d) + 1
    return out


def suffix_array(tokens: np.ndarray, depth: int) -> tuple[np.ndarray, int]:
    """([n] int32 suffix start positions sorted by their first `sorted_depth` tokens, sorted_depth >= depth).

    Prefix doubling: ranks by the first h tokens, then by (rank[i], rank[i + h]) for the first 2h, one numpy
    sort per round. Suffixes equal that far keep an arbitrary order, which no lookup within that depth sees.
    """
    n = len(tokens)
    rank = np.unique(tokens, return_inverse=True)[1].astype(np.int64)  # [n] order-preserving dense ranks
    order = np.argsort(rank)
    h = 1
    while h < depth:
        if int(rank.max()) + 1 == n:  # every suffix already told apart: sorted all the way
            return order.astype(np.int32), n
        later = np.full(n, -1, dtype=np.int64)  # rank h tokens on; -1 past the end sorts first, as shorter does
        later[: max(n - h, 0)] = rank[h:]
        key = rank * (int(rank.max()) + 2) + later + 1  # [n] the pair as one int64
        order = np.argsort(key)
        sorted_key = key[order]
        rank = np.empty(n, dtype=np.int64)
        rank[order] = np.concatenate([[0], np.cumsum(sorted_key[1:] != sorted_key[:-1])])
        h *= 2
    return order.astype(np.int32), h


class SuffixArray:
    """A static token corpus (documents joined by SEPARATOR), indexed to depth `depth` by a suffix array."""

    def __init__(self, tokens: np.ndarray, depth: int) -> None:
        self.tokens = tokens  # [n] int32, ends with SEPARATOR
        self.sa, self.depth = suffix_array(tokens, depth)  # [n] int32
        self._raw = tokens.astype(">u4").tobytes()  # big-endian: bytes order is token order, for bisect
        self._sa = memoryview(self.sa)  # indexing a memoryview gives Python ints, fast for bisect
        self._tok = memoryview(tokens)

    @property
    def nbytes(self) -> int:
        return self.tokens.nbytes + self.sa.nbytes + len(self._raw)

    def _range(self, pattern: bytes, side: str, lo: int = 0) -> int:
        width = len(pattern)
        find = bisect.bisect_left if side == "left" else bisect.bisect_right
        return find(self._sa, pattern, lo, len(self.sa), key=lambda s: self._raw[4 * s : 4 * s + width])

    def _occurs(self, pattern: bytes) -> bool:
        at = self._range(pattern, "left")
        return at < len(self.sa) and self._raw[4 * self._sa[at] : 4 * self._sa[at] + len(pattern)] == pattern

    def match(self, pattern: np.ndarray) -> tuple[int, RangeNode | None]:
        """(m, node) for the longest suffix pattern[-m:] that occurs (m <= sorted depth); (0, None) if none.

        Occurrence is monotone in m (a suffix of an occurring pattern occurs), so m is found by bisection."""
        raw = pattern[-self.depth :].astype(">u4").tobytes()
        lo, hi = 0, len(raw) // 4  # pattern[-lo:] occurs; pattern[-(hi + 1):] does not
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if self._occurs(raw[-4 * mid :]) else (lo, mid - 1)
        if lo == 0:
            return 0, None
        key = raw[-4 * lo :]
        first = self._range(key, "left")
        return lo, (first, self._range(key, "right", first), lo)

    @staticmethod
    def count(node: RangeNode) -> int:
        return node[1] - node[0]

    def children(self, node: RangeNode, min_count: int) -> list[tuple[int, int, RangeNode]]:
        """(token, count, child) for continuations seen at least `min_count` times, most frequent first.

        Within the node's rows the next tokens are sorted, so each continuation is a run of rows. A large
        node is scanned at a stride of at most `min_count` rows, which no run that long can slip through;
        the runs found are then located exactly by bisection."""
        lo, hi, off = node
        if off >= self.depth:  # rows are not sorted past the indexed depth
            return []
        step = max(1, min(min_count, (hi - lo) // SAMPLE))
        nxt = self.tokens[self.sa[lo:hi:step] + off]  # [ceil((hi - lo) / step)] non-decreasing
        edges = np.flatnonzero(nxt[1:] != nxt[:-1]) + 1
        starts = np.concatenate([[0], edges])
        runs = np.diff(np.concatenate([starts, [len(nxt)]]))  # [num runs] sampled rows per token
        keep = ((runs + 1) * step >= min_count) & (nxt[starts] != SEPARATOR)

        def next_token(s: int) -> int:
            return self._tok[s + off]

        out = []
        for tok, start, run in zip(nxt[starts[keep]].tolist(), starts[keep].tolist(), runs[keep].tolist(), strict=True):
            if step == 1:
                first, last = lo + start, lo + start + run
            else:  # the sample only brackets the run: find its ends
                first = bisect.bisect_left(self._sa, tok, lo, hi, key=next_token)
                last = bisect.bisect_right(self._sa, tok, first, hi, key=next_token)
            if last - first >= min_count:
                out.append((tok, last - first, (first, last, off + 1)))
        return sorted(out, key=lambda c: -c[1])


class TokenScan:
    """A token buffer searched by a vectorised scan; occurrences must end before `limit` (exclusive).

    A node is the array of buffer positions right after each occurrence (where its continuation is read).
    Only the latest `max_occurrences` occurrences of a match are kept: a bound on the work per lookup, and
    in a stream of outputs the recent ones are the better guide anyway.
    """

    def __init__(self, tokens: np.ndarray, limit: int, max_occurrences: int = 256) -> None:
        self.tokens = tokens  # [n] int32, SEPARATOR between documents
        self.limit = limit
        self.max_occurrences = max_occurrences

    def match(self, pattern: np.ndarray) -> tuple[int, np.ndarray | None]:
        """(m, node) for the longest suffix pattern[-m:] occurring in tokens[:limit]; (0, None) if none.

        Start from every occurrence of the last token and keep those whose earlier tokens keep agreeing."""
        ends = np.flatnonzero(self.tokens[: self.limit] == pattern[-1])  # [num occurrences] ascending
        if not ends.size:
            return 0, None
        m = 1
        while m < len(pattern):
            ends_m = ends[np.searchsorted(ends, m) :]  # room for m earlier tokens
            agree = ends_m[self.tokens[ends_m - m] == pattern[-1 - m]]
            if not agree.size:
                break
            ends, m = agree, m + 1
        return m, ends[-self.max_occurrences :] + 1

    @staticmethod
    def count(node: np.ndarray) -> int:
        return len(node)

    def children(self, node: np.ndarray, min_count: int) -> list[tuple[int, int, np.ndarray]]:
        """(token, count, child) for continuations seen at least `min_count` times, most frequent first."""
        pos = node[node < len(self.tokens)]  # occurrences at the very end have no continuation yet
        nxt = self.tokens[pos]
        values, inverse, counts = np.unique(nxt, return_inverse=True, return_counts=True)
        out = [
            (int(values[i]), int(counts[i]), pos[inverse == i] + 1)
            for i in np.flatnonzero((counts >= min_count) & (values != SEPARATOR))
        ]
        return sorted(out, key=lambda c: -c[1])


def load_corpus(paths: list[str] | tuple[str, ...], vocab_size: int) -> list[np.ndarray]:
    """The responses in token files of the distillation format (specdecode/train/data.py): for record i,
    tokens[offsets[i] + prompt_len[i] : offsets[i + 1]]. Prompts are left out: they are the users' words,
    not the target's. Any problem is a ConfigError naming the file."""
    docs: list[np.ndarray] = []
    for path in paths:
        try:
            with np.load(Path(path)) as data:
                tokens, offsets, prompt_len = data["tokens"], data["offsets"], data["prompt_len"]
        except (OSError, ValueError, KeyError) as e:
            raise ConfigError(
                f"suffix corpus {path}: not a token file (npz of tokens, offsets, prompt_len): {e}"
            ) from e
        if len(offsets) != len(prompt_len) + 1 or (len(offsets) and offsets[-1] != len(tokens)):
            raise ConfigError(f"suffix corpus {path}: offsets and prompt_len do not describe its {len(tokens)} tokens")
        if tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size):
            raise ConfigError(
                f"suffix corpus {path}: token ids {int(tokens.min())}..{int(tokens.max())} fall outside the target's"
                f" vocabulary 0..{vocab_size - 1} (made with another tokenizer?)"
            )
        bounds = zip((offsets[:-1] + prompt_len).tolist(), offsets[1:].tolist(), strict=True)
        docs += [tokens[s:e].astype(np.int32) for s, e in bounds if e > s]
    return docs


def min_count(prob: float, total: int, min_prob: float) -> int:
    """Fewest occurrences a child of a node at path probability `prob` with `total` occurrences needs for its
    own path probability prob * count / total to reach `min_prob`."""
    return max(1, math.ceil(min_prob * total / prob - 1e-9))
