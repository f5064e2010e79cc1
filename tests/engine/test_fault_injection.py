"""Fault injection through the real engine, driven by a hypothesis state machine over mixed batches.

Each example builds an engine (chain and tree drafters, the draft model; K, batch size and token budget drawn)
and interleaves `add` (greedy and seeded sampled requests, n = 1 or 2; most samples armed as victims: a
chosen stage raises for it, or its rows of logits turn NaN, once it has generated a chosen number of tokens)
and `step`. The faults are real code paths failing for one request:

    sampling     its sampling tensors and logit adjustments (engine.sampling_tensors)
    propose      its drafts (the drafter's propose, when its rows are in the call)
    nan_logits   NaN in its own rows of the target's logits (the forward itself is untouched)
    commit       appending its verified tokens (Engine._append)
    detokenize   its detokenizer (IncrementalDetokenizer.add)
    drafter      the drafter's state for it at admission (add_sequence)

After every step the engine's state is consistent (tests/engine/machine.py: caches, slots, drafter, controller,
detokenizers). At the end: every victim finished with reason "error" and its fault's message; zero collateral:
every other sample finished normally (all requests ignore EOS: "length") with the tokens it has in a run of the
same requests without the faulty ones (the same engine shape, no faults; see ONE_HOT_DRAFTS for the draft
model's seeded requests); and everything was released. `make test` runs EXAMPLES examples per
drafter (>= 1,000 faults fired in all, each stage counted); `make property-long` runs LONG_EXAMPLES.

No grammar here: the tiny models' 96-token vocabulary holds no token a JSON grammar allows first ("{" is
beyond it in the SmolLM2 tokenizer); a grammar's failure is a commit failure of its request (Engine._append),
and tests/engine/test_isolation.py runs the commit stage.

The negative control restores the old fail-all path (a row's error leaves the step, NaN rows are not
quarantined): the same machine reports collateral failures.
"""

from __future__ import annotations

import os
from collections import Counter
from contextlib import ExitStack
from unittest import mock

import pytest
import torch
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import specdecode.engine.engine as engine_module
from specdecode.config import SamplingParams
from specdecode.detokenize import IncrementalDetokenizer
from specdecode.engine.engine import Engine
from specdecode.llm import LLM
from specdecode.models.llama import LlamaModel
from tests.engine.machine import World, check_engine_state

LONG = os.environ.get("SPECDECODE_PROPERTY") == "long"
EXAMPLES, LONG_EXAMPLES = 48, 600
METHODS = ("ngram", "ngram_tree", "draft")
# Seeded randomness is keyed by (seed, position) and a one-hot draft is verified by the seeded race, so these
# drafters' seeded requests have the same tokens whatever the batch (tests/engine/test_properties.py). The draft
# model's drafts are sampled from q and how many it makes follows its catch-up budget, shared by the batch: its
# seeded survivors are only distributed alike, so they are checked for finishing normally, its greedy ones exactly.
ONE_HOT_DRAFTS = ("ngram", "ngram_tree")
STAGES = ("sampling", "propose", "nan_logits", "commit", "detokenize", "drafter")
MIN_FAULTS_PER_METHOD = 340  # x 3 drafters: >= 1,000 faults fired in make test
MAX_REQUESTS = 20

SETTINGS = settings(
    max_examples=LONG_EXAMPLES if LONG else EXAMPLES,
    stateful_step_count=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=not LONG,
    phases=list(Phase) if LONG else [Phase.explicit, Phase.generate],
    print_blob=True,
)


class Injected(Exception):
    """The injected fault (its message names the stage)."""


class Faults:
    """The armed faults: sample request id -> (stage, tokens it generates before the fault fires), and the
    faults that fired. `install` patches the real code paths; each fires only for its victim."""

    def __init__(self) -> None:
        self.armed: dict[str, tuple[str, int]] = {}
        self.fired: Counter[str] = Counter()
        self.engine: Engine | None = None

    def due(self, seq, stage: str) -> bool:
        plan = self.armed.get(seq.request_id)
        return plan is not None and plan[0] == stage and seq.metrics.num_generated >= plan[1]

    def fire(self, seq, stage: str) -> None:
        raise Injected(f"injected fault in {stage} for {seq.request_id}")

    def install(self, stack: ExitStack, engine: Engine) -> None:
        self.engine = engine
        faults = self
        build = engine_module.sampling_tensors

        def sampling(seqs, *args):
            for s in seqs:
                if faults.due(s, "sampling"):
                    faults.fire(s, "sampling")
            return build(seqs, *args)

        stack.enter_context(mock.patch.object(engine_module, "sampling_tensors", sampling))
        propose = engine.drafter.propose

        def proposing(seqs, *args):
            for s in seqs:
                if faults.due(s, "propose"):
                    faults.fire(s, "propose")
            return propose(seqs, *args)

        stack.enter_context(mock.patch.object(engine.drafter, "propose", proposing))
        add_sequence = engine.drafter.add_sequence

        def admitted(seq):
            if faults.armed.get(seq.request_id, ("",))[0] == "drafter":  # at admission: nothing generated yet
                faults.fire(seq, "drafter")
            return add_sequence(seq)

        stack.enter_context(mock.patch.object(engine.drafter, "add_sequence", admitted))
        append = Engine._append

        def committing(self, seq, *args):
            if faults.due(seq, "commit"):
                faults.fire(seq, "commit")
            return append(self, seq, *args)

        stack.enter_context(mock.patch.object(Engine, "_append", committing))
        add = IncrementalDetokenizer.add

        def detokenizing(self, ids):
            victim = next((s for s in engine.running if engine._detok.get(s.request_id) is self), None)
            if victim is not None and faults.due(victim, "detokenize"):
                faults.fire(victim, "detokenize")
            return add(self, ids)

        stack.enter_context(mock.patch.object(IncrementalDetokenizer, "add", detokenizing))
        forward = LlamaModel.forward

        def poisoned(model, tokens, meta, *args, **kwargs):
            out = forward(model, tokens, meta, *args, **kwargs)
            slots = [s.slot for s in engine.running if faults.due(s, "nan_logits")]
            if model is engine.target and slots:
                logits = out[0] if isinstance(out, tuple) else out  # [num_seqs, n, vocab]
                logits[torch.isin(meta.slots, torch.tensor(slots))] = float("nan")
            return out

        stack.enter_context(mock.patch.object(LlamaModel, "forward", poisoned))


def request_params() -> st.SearchStrategy[SamplingParams]:
    """Greedy or seeded sampled, n = 1 or 2."""
    return st.builds(
        lambda temperature, seed, n, max_tokens: SamplingParams(
            temperature=temperature,
            top_k=0 if temperature == 0 else 8,
            seed=seed,
            n=n,
            max_tokens=max_tokens,
            ignore_eos=True,
        ),
        st.sampled_from([0.0, 0.0, 1.0]),
        st.integers(0, 2**16),
        st.sampled_from([1, 1, 2]),
        st.integers(3, 10),
    )


class FaultMachine(RuleBasedStateMachine):
    world: World
    method: str
    faults: Faults  # shared across examples: its `fired` counts every fault of the test

    def __init__(self) -> None:
        super().__init__()
        self.stack = ExitStack()
        self.engine: Engine | None = None
        self.requests: list[tuple[str, list[int], SamplingParams]] = []
        self.seqs = {}
        self.victims: dict[str, str] = {}  # sample id -> stage
        self.collateral: list[str] = []

    @initialize(
        data=st.data(),
        k=st.integers(1, 4),
        max_num_seqs=st.integers(2, 4),
        budget=st.sampled_from([16, 24, 64]),
        count=st.integers(6, 12),
    )
    def build(self, data: st.DataObject, k: int, max_num_seqs: int, budget: int, count: int) -> None:
        """An engine of a drawn shape and `count` requests to start with (a batch that outlasts some faults)."""
        self.shape = (k, max_num_seqs, budget)
        self.engine = self.world.engine(self.method, "fixed", 48, budget, max_num_seqs, k)
        self.faults.armed = {}
        self.faults.install(self.stack, self.engine)
        self.add(data, count)

    @precondition(lambda self: len(self.requests) < MAX_REQUESTS)
    @rule(data=st.data(), count=st.integers(1, 4))
    def add(self, data: st.DataObject, count: int) -> None:
        """`count` requests; most of their samples are armed at once (a stage, and tokens before it fires)."""
        for _ in range(count):
            prompt = data.draw(st.lists(st.integers(3, 95), min_size=1, max_size=24), label="prompt")
            params = data.draw(request_params(), label="params")
            rid = f"r{len(self.requests)}"
            self.requests.append((rid, prompt, params))
            for seq in self.engine.add_samples(rid, prompt, params):
                self.seqs[seq.request_id] = seq
                armed = st.tuples(st.sampled_from(STAGES), st.integers(0, 3))
                plan = data.draw(st.one_of(st.none(), armed, armed), label="fault")
                if plan is not None:
                    self.faults.armed[seq.request_id] = plan
                    self.victims[seq.request_id] = plan[0]

    @rule(steps=st.integers(1, 4))
    def step(self, steps: int) -> None:
        for _ in range(steps):
            if self.engine is not None and self.engine.has_work():
                self.advance()

    def advance(self) -> None:
        """One step. A step that raises fails every live request: collateral, unless all of them were victims
        (an error that every row of a step hits alone is the batch's, by design: engine._isolated)."""
        try:
            self.engine.step()
        except Exception as e:  # noqa: BLE001 - the step failed as a whole
            live = [s.request_id for s in [*self.engine.running, *self.engine.waiting]]
            self.collateral += [
                f"{rid}: the step raised {e!r} ({self.seqs[rid].error})" for rid in live if rid not in self.victims
            ]
            self.engine = None  # an engine whose step raised is not used again; the example ends here
            if self.collateral:
                raise AssertionError(f"collateral failures: {self.collateral}") from e

    @invariant()
    def consistent(self) -> None:
        if self.engine is not None:
            check_engine_state(self.engine)

    def teardown(self) -> None:
        with self.stack:  # the faults stay armed until the requests are done
            for _ in range(500):
                if self.engine is None or not self.engine.has_work():
                    break
                self.advance()
        if self.engine is None:
            return
        check_engine_state(self.engine)
        engine = self.engine
        assert engine.cache.num_free == engine.cache.num_slots and not engine._detok
        assert not engine.drafter.live_request_ids() and not engine.controller.live_request_ids()
        fired = [sid for sid in self.victims if self.seqs[sid].finish_reason == "error"]
        for sid in fired:
            error = self.seqs[sid].error
            assert "injected fault" in error or "not finite" in error, f"{sid}: {error}"
            self.faults.fired[self.victims[sid]] += 1
        want = self.reference(set(fired))
        for sid, seq in self.seqs.items():
            if sid in fired:
                continue
            exact = seq.params.greedy or self.method in ONE_HOT_DRAFTS
            if seq.finish_reason != "length" or (exact and seq.output_ids != want[sid]):
                self.collateral.append(f"{sid}: {seq.finish_reason} {seq.error} {seq.output_ids} != {want[sid]}")
        assert not self.collateral, f"collateral failures: {self.collateral}"

    def reference(self, failed: set[str]) -> dict[str, list[int]]:
        """Every sample's tokens in a run, on a fresh engine of the same shape without faults, of the requests
        that kept at least one sample (a request whose samples all failed is left out)."""
        k, max_num_seqs, budget = self.shape
        engine = self.world.engine(self.method, "fixed", 48, budget, max_num_seqs, k)
        seqs = []
        for rid, prompt, params in self.requests:
            ids = [rid] if params.n == 1 else [f"{rid}/{i}" for i in range(params.n)]
            if not set(ids) <= failed:
                seqs += engine.add_samples(rid, prompt, params)
        while engine.has_work():
            engine.step()
        return {s.request_id: s.output_ids for s in seqs}


@pytest.fixture(scope="module")
def world(tiny_target, tiny_draft, drafts):
    llm = LLM(target=str(tiny_target), draft=str(tiny_draft), method="draft")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one thread is fastest, and the box is shared
    yield World(llm.target, llm.draft_model, llm.tokenizer, drafts, llm._eos_ids())
    torch.set_num_threads(threads)


def machine(world: World, method: str, faults: Faults) -> type[FaultMachine]:
    return type("Machine", (FaultMachine,), {"world": world, "method": method, "faults": faults})


@pytest.mark.parametrize("method", METHODS)
def test_faults_stay_with_their_request(world, method):
    faults = Faults()
    run_state_machine_as_test(machine(world, method, faults), settings=SETTINGS)
    assert sum(faults.fired.values()) >= MIN_FAULTS_PER_METHOD, faults.fired
    assert set(faults.fired) == set(STAGES), faults.fired  # every stage fired


def test_control_the_fail_all_path_hurts_the_others(world, monkeypatch):
    """Fault: the old path, where a row's error leaves the step (and the batch fails) and NaN is not caught."""
    monkeypatch.setattr(Engine, "_isolated", lambda self, seqs, stage: (seqs, stage(seqs)))
    monkeypatch.setattr(engine_module, "quarantine", lambda logits: (logits, torch.zeros(len(logits), dtype=bool)))
    control = settings(SETTINGS, max_examples=20, phases=[Phase.generate], derandomize=True)
    with pytest.raises(AssertionError, match="collateral failures"):
        run_state_machine_as_test(machine(world, "ngram", Faults()), settings=control)
