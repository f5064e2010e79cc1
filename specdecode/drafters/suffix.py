"""SuffixDecoding (Oliaro et al., NeurIPS 2025): model-free drafts from everything the target has said before.

Three histories are searched every step, each by its longest match of the request's last `max_depth` tokens
(specdecode/drafters/suffix_index.py): this request's prompt and output; a corpus of the target's earlier
responses (`--suffix-corpus`, indexed at start-up); and the outputs of the requests this engine has finished
(a FIFO of at most `--suffix-cache-max-tokens` tokens, oldest evicted; 0 turns it off). From a match the
continuations grow best first by empirical probability, a child's count over its parent's, until a budget of
`spec_factor * match length` nodes (the paper's adaptive MAX_SPEC: a long match predicts further), capped
by K, or until the path probability falls under `min_prob`. A match in the request's own history has its own,
larger factor (`request_spec_factor`): replayed over the target's answers to held-out chat prompts
(bench/suffix_replay.py), its drafts were accepted about three times as often as the corpus's at the same
match length (2 tokens: 0.83 of 2 drafts a step against 0.27 of 1.7).

`tree=True` (method suffix_tree) proposes one token tree of all three histories' trees (`merge`): where they
disagree the verifier tries each, where they agree a path is proposed once; each node's confidence is its path
probability. `tree=False` (method suffix) proposes one history's best single path, the most frequent
continuation at each step: the history whose chain expects more accepted tokens (the sum of its path
probabilities) wins. The chain's confidences are, as n-gram's, each draft's probability given the drafts
before it. Drafts are fixed functions of the history (q one-hot), so both are lossless under sampling with
the verify rules.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import count

import numpy as np
import torch

from specdecode.config import MAX_SPECULATIVE_TOKENS, SpeculativeConfig
from specdecode.drafters.base import DrafterBase, Proposal
from specdecode.drafters.history import RequestHistory
from specdecode.drafters.suffix_index import SuffixArray, TokenScan, join_documents, load_corpus, min_count
from specdecode.step.sequence import Sequence
from specdecode.verify.sampling import PAD_TOKEN_ID, SamplingTensors

Index = SuffixArray | TokenScan


@dataclass
class Draft:
    """One history's speculation: tokens in best-first order, parents as tree positions (0 = the pending
    token), and each node's path probability."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)

    @property
    def score(self) -> float:
        """Expected accepted drafts, if the empirical probabilities are right."""
        return sum(self.probs)


def grow(index: Index, root, budget: int, min_prob: float, tree: bool) -> Draft:
    """The `budget` most probable continuations of `root` with path probability >= min_prob, best first (so
    parents precede children and any prefix is the best subtree of its size); tree=False keeps only the
    most frequent child of each node, a chain."""
    draft = Draft()
    frontier: list[tuple[float, int, int, object, int]] = []  # (-path prob, arrival, token, node, parent pos)
    arrival = count()

    def expand(node, prob: float, position: int) -> None:
        total = index.count(node)
        kids = index.children(node, min_count(prob, total, min_prob))
        for tok, n, child in kids if tree else kids[:1]:
            heapq.heappush(frontier, (-prob * n / total, next(arrival), tok, child, position))

    expand(root, 1.0, 0)
    while frontier and len(draft.tokens) < budget:
        neg_prob, _, tok, node, parent = heapq.heappop(frontier)
        draft.tokens.append(tok)
        draft.parents.append(parent)
        draft.probs.append(-neg_prob)
        if len(draft.tokens) < budget:
            expand(node, -neg_prob, len(draft.tokens))
    return draft


def path_key(parent: int, token: int) -> tuple[int, int]:
    """A node of the union, by its parent's position there and its token: equal keys, equal root paths."""
    return parent, token


def merge(drafts: list[Draft], k: int) -> Draft:
    """One tree of the drafts' trees, cut to its k most probable nodes, best first.

    A path several drafts propose is one path, at the highest of their path probabilities. A node's probability
    never exceeds its parent's, and ties keep the order nodes were met in (a parent before its children), so
    sorting by probability keeps parents before children and the k best nodes form a tree."""
    tokens: list[int] = []
    parents: list[int] = []
    probs: list[float] = []
    position: dict[tuple[int, int], int] = {}  # (parent position, token) -> position; 0 is the pending token
    for d in drafts:
        mapped = {0: 0}  # d's positions -> the union's
        for j, (tok, parent, prob) in enumerate(zip(d.tokens, d.parents, d.probs, strict=True)):
            key = path_key(mapped[parent], tok)
            prob = min(prob, probs[key[0] - 1]) if key[0] else prob  # a rounding error may put a child ahead
            if key in position:
                probs[position[key] - 1] = max(probs[position[key] - 1], prob)
            else:
                tokens.append(tok)
                parents.append(key[0])
                probs.append(prob)
                position[key] = len(tokens)
            mapped[j + 1] = position[key]
    best = sorted(range(len(tokens)), key=lambda i: (-probs[i], i))[:k]
    renumber = {0: 0} | {old + 1: new + 1 for new, old in enumerate(best)}
    return Draft([tokens[i] for i in best], [renumber[parents[i]] for i in best], [probs[i] for i in best])


class OutputCache:
    """The outputs of finished requests, oldest evicted first: never more than `max_tokens` tokens in all."""

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self.outputs: deque[np.ndarray] = deque()
        self.num_tokens = 0
        self._index: TokenScan | None = None  # rebuilt on the first lookup after a change

    def add(self, output: np.ndarray) -> None:
        if not self.max_tokens or not len(output):
            return
        output = output[-self.max_tokens :]  # one output longer than the whole cache keeps its end
        self.outputs.append(output)
        self.num_tokens += len(output)
        self.evict()
        self._index = None

    def evict(self) -> None:
        while self.num_tokens > self.max_tokens:
            self.num_tokens -= len(self.outputs.popleft())

    def index(self) -> TokenScan | None:
        if self._index is None and self.outputs:
            joined = join_documents(list(self.outputs))
            self._index = TokenScan(joined, len(joined))
        return self._index


@lru_cache(maxsize=1)  # one engine per arm in a bench run: the corpus is indexed once, not per arm
def corpus_index(paths: tuple[str, ...], vocab_size: int, depth: int) -> SuffixArray | None:
    docs = load_corpus(paths, vocab_size)
    return SuffixArray(join_documents(docs), depth) if docs else None


class SuffixDrafter(DrafterBase):
    retryable_propose = True  # drafts depend on committed state only (drafters/base.py)

    def __init__(
        self,
        corpus: SuffixArray | None,
        cache: OutputCache,
        tree: bool,
        max_depth: int = 24,
        spec_factor: float = 1.0,
        min_prob: float = 0.1,
        device: str = "cpu",
        request_spec_factor: float = 4.0,
    ) -> None:
        self.corpus, self.cache, self.tree = corpus, cache, tree
        self.max_depth, self.spec_factor, self.min_prob = max_depth, spec_factor, min_prob
        self.request_spec_factor = request_spec_factor
        self.device = device
        self.requests: dict[str, RequestHistory] = {}

    @classmethod
    def from_config(cls, spec: SpeculativeConfig, vocab_size: int, tree: bool, device: str) -> SuffixDrafter:
        depth = spec.suffix_max_depth + MAX_SPECULATIVE_TOKENS  # a match, then the deepest draft below it
        corpus = corpus_index(spec.suffix_corpus, vocab_size, depth) if spec.suffix_corpus else None
        cache = OutputCache(spec.suffix_cache_max_tokens)
        return cls(
            corpus,
            cache,
            tree,
            spec.suffix_max_depth,
            spec.suffix_spec_factor,
            spec.suffix_min_prob,
            device,
            request_spec_factor=spec.suffix_request_spec_factor,
        )

    def add_sequence(self, seq: Sequence) -> None:
        self.requests[seq.request_id] = RequestHistory(seq.max_len)

    def draft(self, seq: Sequence, k: int) -> Draft:
        """A draft of at most k nodes over the request's own history, the finished outputs and the corpus."""
        history = self.requests[seq.request_id].sync(seq.token_ids)
        if not k:
            return Draft()
        pattern = history[-self.max_depth :]
        own = TokenScan(history, len(history) - 1)  # an occurrence needs a continuation: not the suffix itself
        sources = [
            (own, self.request_spec_factor),
            (self.cache.index(), self.spec_factor),
            (self.corpus, self.spec_factor),
        ]
        grown = []
        for ix, factor in sources:
            length, node = ix.match(pattern) if ix is not None else (0, None)
            budget = min(k, int(factor * length + 1e-9))
            if budget and (self.tree or budget > max((d.score for d in grown), default=0.0)):
                grown.append(grow(ix, node, budget, self.min_prob, self.tree))  # a chain adds at most 1 a node
        if self.tree:
            return merge(grown, k)
        return max(grown, key=lambda d: d.score, default=Draft())

    def propose(self, seqs: list[Sequence], num_tokens: list[int], st: SamplingTensors) -> Proposal:
        drafts = [self.draft(s, k) for s, k in zip(seqs, num_tokens, strict=True)]
        width = max((len(d.tokens) for d in drafts), default=0)  # pad only to the largest draft found
        if not self.tree:
            conditional = [[p / q for p, q in zip(d.probs, [1.0, *d.probs][:-1], strict=True)] for d in drafts]
            return Proposal.from_lists([d.tokens for d in drafts], width, self.device, conditional, True)
        ids = torch.full((len(seqs), width), PAD_TOKEN_ID, dtype=torch.long)  # [num_seqs, width]
        parents = torch.zeros((len(seqs), width), dtype=torch.long)  # [num_seqs, width]
        conf = torch.zeros((len(seqs), width), dtype=torch.float32)  # [num_seqs, width]
        for b, d in enumerate(drafts):
            ids[b, : len(d.tokens)] = torch.tensor(d.tokens, dtype=torch.long)
            parents[b, : len(d.parents)] = torch.tensor(d.parents, dtype=torch.long)
            conf[b, : len(d.probs)] = torch.tensor(d.probs, dtype=torch.float32)
        num = torch.tensor([len(d.tokens) for d in drafts], dtype=torch.long)  # [num_seqs]
        dev = self.device
        return Proposal(ids.to(dev), num.to(dev), None, conf.to(dev), parents.to(dev))

    def remove_sequence(self, seq: Sequence) -> None:
        """Free the request's history; its output joins the cache of finished outputs."""
        self.requests.pop(seq.request_id, None)
        self.cache.add(np.asarray(seq.output_ids, dtype=np.int32))

    def live_request_ids(self) -> set[str]:
        return set(self.requests)
