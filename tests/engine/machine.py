"""A hypothesis state machine over the engine: requests are added, aborted and stepped in random order.

Every example builds a fresh engine (random context, prefill chunk, batch size and K) for one drafter and one
controller on tiny random models, then interleaves `add` (prompt lengths up to the context limit, random
max_tokens, greedy or sampled), `abort` (any live request, waiting or mid-flight) and `step`. After every rule:

- the engine's state is consistent: every cache length (target and the drafter's own) is within bounds and
  equals its sequence's committed tokens; only live requests hold slots, controller, drafter or detokenizer
  state;
- every request that finished is well-formed (finish reason, max_tokens, context);
- at the end of the example, every finished greedy request equals plain greedy decoding of its prompt, and
  every aborted greedy request is a prefix of it (one batched reference decode, cached across examples).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import count

import torch
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from specdecode.config import EngineConfig, SamplingParams, SpeculativeConfig
from specdecode.control import make_controller
from specdecode.drafters import DrafterContext, make_drafter
from specdecode.engine.engine import Engine
from specdecode.models.llama import LlamaModel
from specdecode.step.runner import forward_ragged, prefill
from specdecode.step.sequence import Sequence, Status

DRAFTER_METHODS = (
    "none",
    "ngram",
    "ngram_tree",
    "suffix",
    "suffix_tree",
    "draft",
    "eagle",
    "medusa",
    "mtp",
    "layer_skip",
)
MAX_REQUESTS = 8  # per example
MAX_TOKENS = 16


@dataclass
class World:
    """What every example shares: the tiny models (loaded once), drafter files, and the reference decodes."""

    target: LlamaModel
    draft: LlamaModel
    tokenizer: object
    drafter_paths: dict[str, str]  # method -> what --draft names (heads, a layer choice)
    eos_token_ids: set[int]
    references: dict[tuple[int, ...], list[int]] = field(default_factory=dict)
    # Where the target's greedy decoding settles (random tiny models fall into a cycle): prompts cut from it are
    # continued as they go on, so n-gram drafts from them get accepted, runs of them at a time.
    attractor: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.attractor = greedy_decode(self.target, [[3]], 64)[0]

    def engine(
        self,
        method: str,
        controller: str,
        max_len: int,
        chunk: int,
        max_num_seqs: int,
        k: int,
        self_draft: bool = False,
        fused_prefill: bool = True,
    ) -> Engine:
        """An engine wired as LLM wires it, from the preloaded models; `self_draft`: the target drafts for itself
        (method draft), so every draft is accepted; fused_prefill: EngineConfig's."""
        spec = SpeculativeConfig(method, k, self.drafter_paths.get(method), controller=controller)
        config = EngineConfig(max_num_seqs, max_len, max_num_batched_tokens=chunk, fused_prefill=fused_prefill)
        draft = (self.target if self_draft else self.draft) if method == "draft" else None
        drafter = make_drafter(DrafterContext(self.target, draft, spec, config, max_len))
        ctl = make_controller(controller, self.target)
        return Engine(self.target, self.tokenizer, drafter, ctl, config, spec.k, max_len, self.eos_token_ids)

    def reference(self, prompts: list[list[int]], n: int) -> list[list[int]]:
        """The first n tokens of plain greedy decoding of each prompt (ignoring EOS), computed once per prompt."""
        missing = [p for p in prompts if len(self.references.get(tuple(p), ())) < n]
        if missing:
            for p, out in zip(missing, greedy_decode(self.target, missing, n), strict=True):
                self.references[tuple(p)] = out
        return [self.references[tuple(p)][:n] for p in prompts]


@torch.inference_mode()
def greedy_decode(model: LlamaModel, prompts: list[list[int]], n: int) -> list[list[int]]:
    """Plain greedy decoding, one token per forward, without the engine: n output tokens per prompt."""
    cache = model.new_cache(len(prompts), max(len(p) for p in prompts) + n)
    slots = list(range(len(prompts)))
    for slot, p in zip(slots, prompts, strict=True):
        if len(p) > 1:
            prefill(model, cache, slot, p[:-1], chunk=512)
    rows = [list(p) for p in prompts]
    for _ in range(n):
        logits = forward_ragged(model, cache, slots, [[r[-1]] for r in rows], last_only=True)  # [B, 1, vocab]
        for slot, row, tok in zip(slots, rows, logits[:, 0].argmax(-1).tolist(), strict=True):
            cache.set_length(slot, cache.lengths[slot] + 1)
            row.append(tok)
    return [r[len(p) :] for r, p in zip(rows, prompts, strict=True)]


def prompts(max_len: int, attractor: list[int]) -> st.SearchStrategy[list[int]]:
    """A repeated random motif, or a piece of the target's own attractor (drafts from it get accepted)."""
    lengths = prompt_lengths(max_len)
    motif = st.lists(st.integers(3, 95), min_size=1, max_size=6)
    repeated = st.builds(lambda m, n: (m * n)[:n], motif, lengths)
    ring = attractor * (max_len // len(attractor) + 2)
    cut = st.builds(lambda at, n: ring[at : at + n], st.integers(0, len(attractor) - 1), lengths)
    return st.one_of(repeated, cut)


def prompt_lengths(max_len: int) -> st.SearchStrategy[int]:
    """Short prompts, prompts at the context limit, and anything between."""
    top = max_len - 1
    return st.one_of(st.integers(1, 4), st.integers(max(1, top - 4), top), st.integers(1, top))


def sampling_params() -> st.SearchStrategy[SamplingParams]:
    greedy = st.builds(
        SamplingParams, max_tokens=st.integers(1, MAX_TOKENS), ignore_eos=st.booleans(), temperature=st.just(0.0)
    )
    sampled = st.builds(
        SamplingParams,
        temperature=st.sampled_from([0.6, 1.0, 1.5]),
        top_k=st.sampled_from([0, 5]),
        top_p=st.sampled_from([1.0, 0.8]),
        max_tokens=st.integers(1, MAX_TOKENS),
        seed=st.one_of(st.none(), st.integers(0, 2**16)),
        ignore_eos=st.booleans(),
    )
    return st.one_of(greedy, greedy, sampled)  # mostly greedy: those are checked token for token


def expected_greedy(seq: Sequence, ref: list[int], max_len: int, eos: set[int]) -> list[int]:
    """What plain greedy decoding emits for this request: its reference cut by max_tokens, context and EOS."""
    out = ref[: min(seq.params.max_tokens, max_len - len(seq.prompt_ids))]
    if not seq.params.ignore_eos:
        at = next((i for i, t in enumerate(out) if t in eos), None)
        out = out if at is None else out[: at + 1]
    return out


class EngineMachine(RuleBasedStateMachine):
    """Subclassed per test with `world`, `method` and `controller` set (see tests/engine/test_properties.py)."""

    world: World
    method: str
    controller: str

    def __init__(self) -> None:
        super().__init__()
        self.engine: Engine | None = None
        self.shape: tuple[int, int, int, bool] = (0, 0, 0, False)
        self.broken = False
        self.seqs: dict[str, Sequence] = {}
        self.checked: set[str] = set()
        self.ids = count()

    @initialize(
        max_len=st.sampled_from([20, 33, 48]),
        chunk=st.sampled_from([16, 24]),
        max_num_seqs=st.integers(1, 3),
        k=st.integers(1, 6),
        self_draft=st.booleans(),
    )
    def build(self, max_len: int, chunk: int, max_num_seqs: int, k: int, self_draft: bool) -> None:
        self.engine = self.world.engine(self.method, self.controller, max_len, chunk, max_num_seqs, k, self_draft)
        self.shape = (max_len, chunk, k, self_draft)  # to build the same engine for one request alone

    # Preconditions and draws never depend on the engine's progress: the goodput controller times steps, so
    # which requests are still live differs between runs, and hypothesis needs the same rules to replay.
    def sampling_params(self) -> st.SearchStrategy[SamplingParams]:
        return sampling_params()

    @precondition(lambda self: len(self.seqs) < MAX_REQUESTS)
    @rule(data=st.data(), count=st.integers(1, 3))
    def add(self, data: st.DataObject, count: int) -> None:
        for _ in range(count):
            prompt = data.draw(prompts(self.engine.max_model_len, self.world.attractor), label="prompt")
            params = data.draw(self.sampling_params(), label="params")
            rid = f"r{next(self.ids)}"
            self.seqs[rid] = self.engine.add_request(rid, prompt, params)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        """Any request added so far: waiting, prefilling, decoding, or already finished (then a no-op)."""
        self.engine.abort(data.draw(st.sampled_from(sorted(self.seqs)), label="aborted"))

    @rule(steps=st.integers(1, 4))
    def step(self, steps: int) -> None:
        for _ in range(steps):
            if not self.engine.has_work():
                return
            self.advance()

    def advance(self) -> None:
        self.broken = True  # until the step returns: a step that raised leaves the engine unusable
        self.engine.step()
        self.broken = False
        self.check_engine()

    @invariant()
    def check_engine(self) -> None:
        if self.engine is None:
            return
        check_engine_state(self.engine)
        for rid, seq in self.seqs.items():
            if seq.status is Status.FINISHED and rid not in self.checked:
                check_finished(seq, self.engine)
                self.checked.add(rid)

    def teardown(self) -> None:
        if self.engine is None or self.broken:  # after a failed step, report that failure alone
            return
        for _ in range(1000):  # finish what is left, still checking every step
            if not self.engine.has_work():
                break
            self.advance()
        assert not self.engine.has_work(), "requests never finished"
        self.check_engine()
        self.check_greedy_outputs()

    def check_greedy_outputs(self) -> None:
        greedy = [s for s in self.seqs.values() if s.params.greedy]
        if not greedy:
            return
        refs = self.world.reference([s.prompt_ids for s in greedy], MAX_TOKENS)
        for seq, ref in zip(greedy, refs, strict=True):
            want = expected_greedy(seq, ref, self.engine.max_model_len, self.world.eos_token_ids)
            if seq.finish_reason == "abort":
                assert seq.output_ids == want[: len(seq.output_ids)], f"{seq.request_id} is not a prefix of plain"
            else:
                assert seq.output_ids == want, f"{seq.request_id}: {seq.output_ids} != plain greedy {want}"


def check_engine_state(engine: Engine) -> None:
    """Caches, slots and per-request state agree with the live sequences."""
    running = {s.request_id for s in engine.running}
    live = running | {s.request_id for s in engine.waiting}
    assert all(s.status is Status.WAITING for s in engine.waiting)
    assert all(s.status in (Status.PREFILLING, Status.RUNNING) for s in engine.running)
    assert engine.controller.live_request_ids() <= live, "controller holds finished requests"
    assert engine.drafter.live_request_ids() <= running, "drafter holds finished requests"
    assert set(engine._detok) == live
    cache = engine.cache
    slots = [s.slot for s in engine.running]
    assert len(set(slots)) == len(slots) and cache.num_free == cache.num_slots - len(slots)
    for slot in set(range(cache.num_slots)) - set(slots):
        assert cache.lengths[slot] == 0, f"free slot {slot} has length {cache.lengths[slot]}"
    for s in engine.running:
        committed = s.num_prefilled if s.status is Status.PREFILLING else s.num_cached
        assert cache.lengths[s.slot] == committed <= cache.max_len, f"{s.request_id}: cache != committed tokens"
        assert len(s.token_ids) < engine.max_model_len and s.metrics.num_generated < s.params.max_tokens
    own = getattr(engine.drafter, "slots", None)  # drafters with a cache of their own (draft model, EAGLE)
    if own is not None:
        by_id = {s.request_id: s for s in engine.running}
        for rid, slot in own.items():
            assert engine.drafter.cache.lengths[slot] <= by_id[rid].num_cached, f"{rid}: drafter cache ahead"
        assert engine.drafter.cache.num_free == engine.drafter.cache.num_slots - len(own)


def check_finished(seq: Sequence, engine: Engine) -> None:
    n = seq.metrics.num_generated
    assert n == len(seq.output_ids) <= seq.params.max_tokens
    assert len(seq.token_ids) <= engine.max_model_len
    assert all(0 <= t < engine.target.cfg.vocab_size for t in seq.output_ids)
    if seq.finish_reason == "length":
        assert n == seq.params.max_tokens or len(seq.token_ids) == engine.max_model_len
    elif seq.finish_reason == "stop":
        assert seq.output_ids[-1] in engine.eos_token_ids and not seq.params.ignore_eos
    else:
        assert seq.finish_reason == "abort", seq.finish_reason
