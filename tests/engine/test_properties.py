"""Property-based engine tests: every drafter x controller pair under random add / abort / step (machine.py).

`make test` runs EXAMPLES_PER_PAIR derandomized examples per pair (40 pairs, 640 examples; 26 per pair until the
API features' tests had to fit beside them in make test's 15 minutes). The long
profile, `SPECDECODE_PROPERTY=long` (`make property-long`), runs LONG_EXAMPLES_PER_PAIR random ones per pair
(over 20,000), shrinks what fails and keeps it in .hypothesis/ to replay first next time.

Negative controls run the same machine with a fault injected into the real engine and must be caught.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.stateful import run_state_machine_as_test

from specdecode.config import CONTROLLER_NAMES, SamplingParams
from specdecode.control.heuristic import HeuristicController
from specdecode.drafters.layer_select import LayerSkipChoice
from specdecode.engine.engine import Engine
from specdecode.llm import LLM
from tests.engine.machine import DRAFTER_METHODS, MAX_TOKENS, EngineMachine, World, sampling_params
from tests.engine.test_head_drafters import write_heads

LONG = os.environ.get("SPECDECODE_PROPERTY") == "long"
EXAMPLES_PER_PAIR = 16
LONG_EXAMPLES_PER_PAIR = 512
STEPS_PER_EXAMPLE = 12

SETTINGS = settings(
    max_examples=LONG_EXAMPLES_PER_PAIR if LONG else EXAMPLES_PER_PAIR,
    stateful_step_count=STEPS_PER_EXAMPLE,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=not LONG,  # `make test` sees the same examples every run; the long profile explores
    database=DirectoryBasedExampleDatabase(Path(".hypothesis") / "examples") if LONG else None,
    # Shrinking a failing engine run can take minutes: `make test` reports the example as found, the long
    # profile shrinks it (and keeps it in .hypothesis/ to replay first).
    phases=list(Phase) if LONG else [Phase.explicit, Phase.generate],
    print_blob=True,
)
# A negative control only has to show that the machine catches its fault: no shrinking, few examples.
CONTROL = settings(SETTINGS, max_examples=20, phases=[Phase.generate], derandomize=True, database=None)


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_target, tiny_draft):
    root = tmp_path_factory.mktemp("property_drafters")
    paths = {kind: str(write_heads(root / kind, tiny_target, kind, 3)) for kind in ("eagle", "medusa", "mtp")}
    LayerSkipChoice([0], 0.5, 1.1).save(root / "choice.json")  # the tiny target has 2 layers: draft through one
    paths["layer_skip"] = str(root / "choice.json")
    llm = LLM(target=str(tiny_target), draft=str(tiny_draft), method="draft")  # loads both as LLM does
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one thread is fastest, and the box is shared
    yield World(llm.target, llm.draft_model, llm.tokenizer, paths, llm._eos_ids())
    torch.set_num_threads(threads)


def machine(world: World, method: str, controller: str) -> type[EngineMachine]:
    return type("Machine", (EngineMachine,), {"world": world, "method": method, "controller": controller})


@pytest.mark.parametrize("controller", CONTROLLER_NAMES)
@pytest.mark.parametrize("method", DRAFTER_METHODS)
def test_engine_properties(world, method, controller):
    run_state_machine_as_test(machine(world, method, controller), settings=SETTINGS)


class SeededAlone(EngineMachine):
    """Also: every finished seeded sampled request gives the same tokens as the same request alone."""

    def sampling_params(self) -> st.SearchStrategy[SamplingParams]:
        seeded = st.builds(
            SamplingParams,
            temperature=st.sampled_from([0.8, 1.2]),
            max_tokens=st.integers(1, MAX_TOKENS),
            seed=st.integers(0, 2**16),
            ignore_eos=st.booleans(),
        )
        return st.one_of(seeded, sampling_params())  # beside greedy and unseeded requests of other draft widths

    def teardown(self) -> None:
        super().teardown()
        max_len, chunk, k, self_draft = self.shape
        for seq in self.seqs.values():
            if seq.params.greedy or seq.params.seed is None or seq.finish_reason == "abort":
                continue
            alone = self.world.engine(self.method, self.controller, max_len, chunk, 1, k, self_draft)
            solo = alone.add_request("alone", seq.prompt_ids, seq.params)
            while alone.has_work():
                alone.step()
            assert seq.output_ids == solo.output_ids, f"{seq.request_id} differs in a batch from alone"


# Seeded randomness is keyed by (seed, position), and a one-hot draft is verified by the seeded race, so a
# seeded n-gram request's tokens depend on neither the batch nor K: the goodput controller (whose K follows the
# batch) must give the same tokens alone and in a batch, as the fixed one does.
@pytest.mark.parametrize("controller", ["fixed", "goodput"])
def test_seeded_request_same_alone_and_in_a_batch(world, controller):
    seeded = type("Machine", (SeededAlone,), {"world": world, "method": "ngram", "controller": controller})
    examples = LONG_EXAMPLES_PER_PAIR if LONG else 24
    run_state_machine_as_test(seeded, settings=settings(SETTINGS, max_examples=examples, phases=[Phase.generate]))


def test_control_leaking_controller_state_is_caught(world, monkeypatch):
    """A controller that keeps finished requests' state (as forget-before-observe once did) fails the machine."""
    monkeypatch.setattr(HeuristicController, "forget", lambda self, seq: None)
    with pytest.raises(AssertionError, match="controller holds finished requests"):
        run_state_machine_as_test(machine(world, "ngram", "heuristic"), settings=CONTROL)


def test_control_missing_rollback_is_caught(world, monkeypatch):
    """A commit that keeps the K/V of one rejected draft fails the cache-length invariant."""
    original = Engine._after_commit

    def keep_one_more(self, seqs, verified):
        original(self, seqs, verified)
        for s in seqs:
            if s.slot >= 0 and self.cache.lengths[s.slot] < self.cache.max_len and s.num_cached > 0:
                self.cache.set_length(s.slot, s.num_cached + 1)

    monkeypatch.setattr(Engine, "_after_commit", keep_one_more)
    with pytest.raises(AssertionError, match="cache != committed tokens"):
        run_state_machine_as_test(machine(world, "ngram", "fixed"), settings=CONTROL)


def test_control_lossy_verification_is_caught(world, monkeypatch):
    """Accepting every draft unchecked (then the target's own token) breaks greedy equality with plain decoding."""
    original = Engine._verify

    def accept_all(self, seqs, proposal, sampling, *chunks):
        verified = original(self, seqs, proposal, sampling, *chunks)
        r = verified.result
        recovered = r.output_token_ids.gather(1, r.num_accepted[:, None])  # [num_seqs, 1]
        rows = torch.cat([proposal.token_ids.clamp(min=0), recovered], dim=1)  # [num_seqs, k + 1]
        r.output_token_ids = rows.scatter(1, proposal.num_tokens[:, None], recovered)
        r.num_accepted = proposal.num_tokens.clone()
        return verified

    monkeypatch.setattr(Engine, "_verify", accept_all)
    with pytest.raises(AssertionError, match="plain greedy"):
        run_state_machine_as_test(machine(world, "ngram", "fixed"), settings=CONTROL)
