"""The suffix drafter's indexes: the suffix array answers exactly as a plain scan and a naive count do, drafts
grow best first within their budget, and corpus files are read (responses only) or refused clearly."""

from __future__ import annotations

import numpy as np
import pytest

from specdecode.config import ConfigError
from specdecode.drafters import suffix_index
from specdecode.drafters.suffix import grow
from specdecode.drafters.suffix_index import SuffixArray, TokenScan, join_documents, load_corpus


def random_docs(seed: int, num: int, alphabet: int, longest: int) -> list[np.ndarray]:
    """A small alphabet, so patterns recur often and continuations branch."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, alphabet, int(rng.integers(1, longest))).astype(np.int32) for _ in range(num)]


def naive_match(docs: list[np.ndarray], pattern: np.ndarray) -> tuple[int, int]:
    """(longest m such that pattern[-m:] occurs in some document, its number of occurrences), by brute force."""
    for m in range(len(pattern), 0, -1):
        sub = pattern[-m:].tolist()
        hits = sum(d[i : i + m].tolist() == sub for d in docs for i in range(len(d) - m + 1))
        if hits:
            return m, hits
    return 0, 0


def answers(index, pattern: np.ndarray) -> tuple:
    """Everything a drafter reads from an index for `pattern`: the match, its continuations, and both drafts."""
    m, node = index.match(pattern)
    if not m:
        return 0, 0, [], None, None
    kids = [(tok, n) for tok, n, _ in index.children(node, 2)]
    tree, chain = grow(index, node, 12, 0.05, True), grow(index, node, 12, 0.05, False)
    return m, index.count(node), kids, (tree.tokens, tree.parents, tree.probs), (chain.tokens, chain.probs)


@pytest.mark.parametrize("sample", [4096, 8])  # 8: large nodes go through the strided sample and bisection
def test_suffix_array_answers_like_a_scan(sample, monkeypatch):
    monkeypatch.setattr(suffix_index, "SAMPLE", sample)
    docs = random_docs(0, 150, 4, 60)
    joined = join_documents(docs)
    array, scan = SuffixArray(joined, 40), TokenScan(joined, len(joined), max_occurrences=len(joined))
    rng = np.random.default_rng(1)
    for _ in range(150):
        pattern = rng.integers(0, 4, int(rng.integers(1, 12))).astype(np.int32)
        got = answers(array, pattern)
        assert got == answers(scan, pattern)
        assert got[:2] == naive_match(docs, pattern)


def test_shallow_sort_is_detected():
    """Negative control: rows sorted to depth 2 but trusted to depth 40 give different answers (ranges and
    continuations are only contiguous as deep as the sort went)."""
    docs = random_docs(0, 150, 4, 60)
    joined = join_documents(docs)
    shallow = SuffixArray(joined, 2)
    shallow.depth = 40
    scan = TokenScan(joined, len(joined), max_occurrences=len(joined))
    rng = np.random.default_rng(1)
    patterns = [rng.integers(0, 4, int(rng.integers(1, 12))).astype(np.int32) for _ in range(150)]
    wrong = sum(answers(shallow, p) != answers(scan, p) for p in patterns)
    assert wrong > 50


def test_scan_excludes_occurrences_at_the_limit():
    """A request's own index: the suffix itself (ending at the last token) is not an occurrence."""
    tokens = np.array([5, 6, 7, 5, 6], dtype=np.int32)
    m, node = TokenScan(tokens, len(tokens) - 1).match(tokens)
    assert (m, node.tolist()) == (2, [2])  # "5 6" at 0..1, continued by 7 at position 2
    assert TokenScan(tokens, len(tokens) - 1).children(node, 1)[0][:2] == (7, 1)


def test_drafts_grow_best_first_within_budget():
    docs = random_docs(2, 100, 3, 80)
    index = SuffixArray(join_documents(docs), 40)
    _, node = index.match(np.array([0, 1, 2], dtype=np.int32))
    tree = grow(index, node, 10, 0.02, True)
    assert len(tree.tokens) == 10
    assert tree.probs == sorted(tree.probs, reverse=True) and min(tree.probs) >= 0.02
    assert all(0 <= p <= j for j, p in enumerate(tree.parents))  # parents come first: a valid tree proposal
    assert len(set(tree.parents)) < len(tree.parents)  # it really branches
    chain = grow(index, node, 10, 0.02, False)
    assert chain.parents == list(range(len(chain.tokens)))
    assert chain.tokens[0] == tree.tokens[0]  # both start with the most frequent continuation


def write_corpus(path, records: list[tuple[list[int], list[int]]], **extra: np.ndarray):
    """A token file in the distillation format: each record is a prompt and its response; `extra` arrays too."""
    seqs = [p + r for p, r in records]
    np.savez(
        path,
        tokens=np.array([t for s in seqs for t in s], dtype=np.uint16),
        offsets=np.concatenate([[0], np.cumsum([len(s) for s in seqs])]).astype(np.int64),
        prompt_len=np.array([len(p) for p, _ in records]),
        response_len=np.array([len(r) for _, r in records]),
        **extra,
    )
    return path


def test_corpus_holds_responses_only(tmp_path):
    path = write_corpus(tmp_path / "c.npz", [([1, 2, 3], [10, 11]), ([4], [12, 13, 14]), ([5, 6], [])])
    assert [d.tolist() for d in load_corpus([str(path)], 96)] == [[10, 11], [12, 13, 14]]


def test_corpus_outside_the_vocabulary_names_the_file(tmp_path):
    path = write_corpus(tmp_path / "foreign.npz", [([1, 2], [3, 4000])])
    with pytest.raises(ConfigError, match="foreign.npz.*outside the target's vocabulary 0..95"):
        load_corpus([str(path)], 96)


def test_unreadable_corpus_names_the_file(tmp_path):
    path = tmp_path / "junk.npz"
    np.savez(path, tokens=np.arange(5))
    with pytest.raises(ConfigError, match="junk.npz"):
        load_corpus([str(path)], 96)
