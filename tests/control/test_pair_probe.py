"""The draft-model pair priced at load (control/pair_probe.py) and `goodput` starting from that price.

The probe on real (tiny) models: a draft that is the target itself agrees with the target's greedy text; the
same target with its logits shifted by one token id (a fault in the draft's head) never does. The seed on the
controller: a request's first step speculates after a high-acceptance price and stays at K = 0 after a low one,
and the seeded draft price survives the first steady steps that confirm it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specdecode.config import SamplingParams
from specdecode.control.base import StepStats
from specdecode.control.cost import CostModel
from specdecode.control.goodput import GoodputController
from specdecode.control.pair_probe import LONG_CONTEXT, PROBE_ROWS, greedy_continuation, probe_pair
from specdecode.llm import LLM
from specdecode.step.proposal import Proposal
from specdecode.step.sequence import Sequence

K_MAX = 8


class ShiftedLogits(torch.nn.Module):
    """A model whose logits are rolled by one token id: its top token is never the model's own (the fault)."""

    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def new_cache(self, *args):
        return self.model.new_cache(*args)

    @property
    def device(self) -> torch.device:
        return self.model.device

    def forward(self, *args, **kwargs) -> torch.Tensor:
        return self.model(*args, **kwargs).roll(1, dims=-1)  # [..., vocab]


@pytest.fixture(scope="module")
def target(tiny_target):
    return LLM(target=str(tiny_target), method="ngram", enforce_eager=True).target


def test_a_draft_that_is_the_target_agrees_and_a_shifted_head_never_does(target):
    prompt = list(range(5, 25))
    same = probe_pair(target, target, prompt, new_tokens=24)
    assert same.positions == 24 and same.acceptance >= 0.95
    assert 0.0 < same.draft_step_s < 10.0
    shifted = probe_pair(target, ShiftedLogits(target), prompt, new_tokens=24)
    assert shifted.acceptance <= 0.05  # the control: the same real probe, a faulty draft


def test_greedy_continuation_is_the_engines_greedy_output(tiny_target, target):
    """The probe's target text is what the engine decodes (K = 0, greedy) from the same prompt."""
    prompt = list(range(5, 25))
    llm = LLM(target=str(tiny_target), method="ngram", num_speculative_tokens=0, enforce_eager=True)
    out = llm.generate([prompt], SamplingParams(max_tokens=16, ignore_eos=True))[0]
    assert greedy_continuation(target, prompt, 16) == out.token_ids


def costly_controller() -> GoodputController:
    cost = CostModel.linear(20.1e-3, 1.5e-3, 2.4e-3, 0.3e-3)  # ~22 ms a step, 2.4 ms a verified token
    return GoodputController(cost=cost, cheap_draft=0.0)


def fresh_request() -> Sequence:
    return Sequence("new", [1, 2, 3], SamplingParams(max_tokens=100_000), max_len=200_000)


def test_a_high_price_speculates_from_the_first_step_and_a_low_one_does_not():
    """A draft at 7 ms a token (a third of a step): right 85% of the time it is worth 3 drafts from the first
    step; right 30% (the control) none; the unseeded prior (0.5, 0.45, ...) with the same draft price, 1."""
    seeded = costly_controller()
    seeded.seed_pair(0.85, 7e-3)
    k_seeded = seeded.choose([fresh_request()], K_MAX)[0]
    low = costly_controller()
    low.seed_pair(0.30, 7e-3)
    unseeded = costly_controller()
    unseeded.cost.seed_draft(7e-3)
    assert k_seeded >= 3 and low.choose([fresh_request()], K_MAX)[0] == 0
    assert unseeded.choose([fresh_request()], K_MAX)[0] < k_seeded


def k_asked_at(context: int, steps: tuple[tuple[int, int, float], ...]) -> int:
    """K a fresh goodput asks for a request `context` tokens long, seeded with draft steps timed at `steps`."""
    ctrl = costly_controller()
    ctrl.seed_pair(0.85, steps[0][2], steps=steps)
    seq = Sequence("new", list(range(context + 1)), SamplingParams(max_tokens=100_000), max_len=200_000)
    return ctrl.choose([seq], K_MAX)[0]


def test_a_draft_dearer_at_a_long_context_drafts_less_there():
    """A draft at 7 ms a token after 100 cached tokens and 13 ms after 2,048 (3 ms per 1,000: 32 ms at 8,192,
    more than the 26 ms verify step): worth drafts at 100 tokens, none at 8,192. Control: priced at 100 tokens
    only (the probe before the long timing), it still asks for drafts at 8,192."""
    both = ((1, 100, 7e-3), (1, 2048, 7e-3 + 3e-3 * 1.948))
    assert k_asked_at(100, both) >= 3
    assert k_asked_at(8192, both) == 0
    assert k_asked_at(8192, both[:1]) >= 1


def k_asked_of(rows: int, steps: tuple[tuple[int, int, float], ...]) -> list[int]:
    """K a fresh goodput asks of each of `rows` new 100-token requests, seeded at 0.85 with draft steps `steps`."""
    ctrl = costly_controller()
    ctrl.seed_pair(0.85, steps[0][2], steps=steps)
    params = SamplingParams(max_tokens=100_000)
    return ctrl.choose([Sequence(f"r{i}", list(range(101)), params, max_len=200_000) for i in range(rows)], K_MAX)


def test_a_draft_priced_at_four_rows_is_not_asked_of_eight():
    """A draft step of one row at 7 ms and of four at 15 ms (~2.7 ms a row more; the 0.5B took ~15 ms a step of
    one row and ~68 of eight): one row drafts 3; at 8 rows (~26 ms a draft step against a 52 ms plain step) none
    does. Control: priced at one row only (the probe before its batched timing), all 8 rows draft."""
    both = ((1, 100, 7e-3), (4, 100, 15e-3))
    assert k_asked_of(1, both)[0] >= 3
    assert k_asked_of(8, both) == [0] * 8
    assert min(k_asked_of(8, both[:1])) >= 1


def draft_price_after_a_probe(per_row: bool) -> tuple[float, float]:
    """Seconds of a draft of one token in each of 8 rows at 2,048 tokens, predicted before and after a probe of
    one row of the 8 drafts in what the seed prices one row's draft at, two steps running (the second is steady,
    and priced). per_row: the draft is priced per row asked (False: as every row's, the rule before)."""
    ctrl = costly_controller()
    ctrl.seed_pair(0.85, 8.6e-3, steps=((1, 86, 8.6e-3), (4, 86, 14.9e-3)))  # the 0.5B's probe
    before, one_row = ctrl.cost.predict_draft(8, 1, 2048.0), ctrl.cost.predict_draft(1, 1, 2048.0)
    if not per_row:
        observe = ctrl.cost.observe
        ctrl.cost.observe = lambda *args: observe(*args[:7])  # draft_rows left out
    seqs = [Sequence(f"r{i}", list(range(2048)), SamplingParams(max_tokens=128), max_len=200_000) for i in range(8)]
    one = [1] + [0] * 7
    for _ in range(2):
        ctrl.asked = {"r0": 1}
        ctrl.observe(StepStats(seqs, one, one, 0.15, 9, 2048.0, one_row))
    return before, ctrl.cost.predict_draft(8, 1, 2048.0)


def test_a_probe_of_one_row_is_priced_as_one_rows_draft():
    """One row of 8 drafting in what the seed says a row's draft costs: the price of all 8 drafting stays within 10%
    of the seed's. Control: read as 8 rows' drafts (as it was), the same step cuts it by over half (on the pair at 8
    rows, a probe's 15 ms put a step of 8 drafts at ~15 ms where it takes ~68, and all 8 rows drafted at once)."""
    before, after = draft_price_after_a_probe(per_row=True)
    assert 0.9 * before <= after <= 1.1 * before
    before, after = draft_price_after_a_probe(per_row=False)
    assert after < 0.5 * before


def test_the_seeded_draft_price_is_refined_not_replaced():
    """Seeded at 7 ms a draft, then steady steps that cost 8 ms a draft: the price moves towards 8 and stays
    near it; seeded at 7 and then shown 30 ms a draft (a slower machine), it follows the steps (at the steps'
    context: the seed's was 0, and where the two differ the context term may take some of the change)."""
    for truth, lo, hi in ((8e-3, 7e-3, 8.5e-3), (30e-3, 20e-3, 31e-3)):
        cost = CostModel.linear(20.1e-3, 1.5e-3, 2.4e-3, 0.3e-3)
        cost.seed_draft(7e-3)
        assert cost.predict_draft(1, 1) == pytest.approx(7e-3, rel=0.02)
        for k in [3, 4, 3, 5] * 10:
            cost.observe(1, k, 100.0, cost.predict_verify(1, k, 100.0), truth * k)
        assert lo <= cost.predict_draft(1, 4, 100.0) / 4 <= hi


def test_an_llm_with_goodput_and_a_draft_model_is_priced_at_load():
    """SmolLM2 and its shipped draft: probed at load, the price seeds the controller's pool; without a draft
    model there is nothing to price."""
    llm = LLM("smollm2-135m-instruct", method="draft", controller="goodput", num_speculative_tokens=4)
    price = llm.pair_price
    assert price is not None and price.positions == 32 and 0.0 < price.acceptance <= 1.0
    assert len(price.confidences) == len(price.agreed) == 32 and sum(price.agreed) / 32 == price.acceptance
    assert all(0.0 < c <= 1.0 for c in price.confidences)
    pool = llm.engine.controller.acceptance
    assert np.allclose(pool.pool_hits / pool.pool_trials, min(price.acceptance, 0.98))
    assert 0 < price.context < price.long_context <= LONG_CONTEXT and price.draft_step_long_s > 0
    assert price.rows == PROBE_ROWS and price.draft_step_rows_s > 0
    assert price.context < price.read_context and price.draft_read_long_s > 0
    # Seeded at both contexts: a line through the two timings where the longer is dearer (NNLS: the draft's
    # attention never costs less than nothing), else their mean; either way, each is priced within their span.
    timings = (price.draft_step_s, price.draft_step_long_s)
    for context in (price.context, price.long_context):
        predicted = llm.engine.controller.cost.predict_draft(1, 1, context)
        assert 0.98 * min(timings) <= predicted <= 1.02 * max(timings)
    assert LLM("smollm2-135m-instruct", method="ngram", controller="goodput").pair_price is None


def request(prompt_tokens: int, max_tokens: int = 128) -> Sequence:
    return Sequence("r", list(range(prompt_tokens)), SamplingParams(max_tokens=max_tokens), max_len=200_000)


def drafting_steps(ctrl: GoodputController, seq: Sequence, steps: int) -> int:
    """Steps in which the row was given drafts (every draft rejected: nothing changes what was learned)."""
    drafted = 0
    for _ in range(steps):
        ks = ctrl.choose([seq], K_MAX)
        ctrl.observe(StepStats([seq], ks, [0], 0.022, ks[0] + 1, 100.0, 0.0, 0.022))
        drafted += ks[0] > 0
    return drafted


def test_a_long_unread_prompt_is_not_worth_the_drafts_catch_up():
    """Seeded at 0.85 acceptance, 7 ms a draft and 2 ms a token read: a 100-token prompt with 128 tokens to write
    drafts from the first step; a 3000-token prompt (6 s of reading for well under 1 s saved) neither drafts nor
    is probed in 100 steps. The control, reading unpriced (0), drafts the long one too."""
    short, long = costly_controller(), costly_controller()
    short.seed_pair(0.85, 7e-3, 2e-3)
    long.seed_pair(0.85, 7e-3, 2e-3)
    assert short.choose([request(100)], K_MAX)[0] >= 2
    assert drafting_steps(long, request(3000), 100) == 0
    control = costly_controller()
    control.seed_pair(0.85, 7e-3, 0.0)
    assert control.choose([request(3000)], K_MAX)[0] >= 2


def test_a_row_the_draft_has_read_is_not_priced_again():
    """Once a row has drafted, its draft model has read it: a long text no longer keeps it from drafting."""
    ctrl = costly_controller()
    ctrl.seed_pair(0.85, 7e-3, 2e-3)
    seq = request(3000)
    assert ctrl.choose([seq], K_MAX)[0] == 0
    ctrl.observe(StepStats([seq], [2], [2], 0.04, 3, 100.0, 0.014, 0.026))  # it drafted (a probe, say)
    ctrl.k_batch = None
    assert ctrl.choose([seq], K_MAX)[0] >= 2


def test_the_tokens_written_while_the_draft_reads_earn_nothing():
    """A 400-token prompt, read 32 tokens a step, leaves 115 of its 128 tokens to draft for: its reading (0.86 s)
    no longer pays, and it neither drafts nor is probed. The control, read all at once (catch_up_chunk 0, where
    all 128 tokens would be drafted for), drafts from the first step."""
    chunked = costly_controller()
    chunked.seed_pair(0.85, 7e-3, 2.15e-3, catch_up_chunk=32)
    assert drafting_steps(chunked, request(400), 100) == 0
    control = costly_controller()
    control.seed_pair(0.85, 7e-3, 2.15e-3, catch_up_chunk=0)
    assert control.choose([request(400)], K_MAX)[0] >= 2


def batch_of_unread_rows(read: bool) -> tuple[list[int], list[int]]:
    """Each of 8 rows has a 100-token prompt its draft has not read (read: has read), 128 tokens to write: K asked
    of one such row alone, and of the 8 together (seeded at 0.85, 7 ms a draft, 2 ms a token read)."""
    alone, batch = costly_controller(), costly_controller()
    for ctrl in (alone, batch):
        ctrl.seed_pair(0.85, 7e-3, 2e-3)
        if read:
            ctrl.bind_drafter(Backlog(0))
    seqs = [Sequence(f"r{i}", list(range(100)), SamplingParams(max_tokens=128), max_len=200_000) for i in range(8)]
    return alone.choose(seqs[:1], K_MAX), batch.choose(seqs, K_MAX)


def test_a_rows_reading_is_weighed_against_its_own_share_of_the_batchs_saving():
    """Alone, a row's 100 tokens of reading (0.2 s) pay for its drafts; in a batch of 8 each row's share of what
    drafting saves is an eighth of the step's, and none reads (each row credited with the whole step's saving, as
    before, all 8 draft at K = 2). Control: rows their draft has read draft in the batch too (the reading is what
    stops them)."""
    alone, batch = batch_of_unread_rows(read=False)
    assert alone[0] >= 2 and batch == [0] * 8
    assert min(batch_of_unread_rows(read=True)[1]) >= 1


def test_a_row_the_drafter_has_already_read_is_not_priced_for_reading():
    """goodput asks the drafter what is left to read: a 3000-token row its draft has read drafts at once, though
    goodput never saw it draft. The control, unbound, prices the whole text and does not draft."""
    bound = costly_controller()
    bound.seed_pair(0.85, 7e-3, 2e-3, catch_up_chunk=32)
    bound.bind_drafter(Backlog(0))
    assert bound.choose([request(3000)], K_MAX)[0] >= 2
    unbound = costly_controller()
    unbound.seed_pair(0.85, 7e-3, 2e-3, catch_up_chunk=32)
    assert unbound.choose([request(3000)], K_MAX)[0] == 0


class Backlog:
    """A drafter with `n` tokens of every row left to read, but the rows `rows` names (request id: tokens)."""

    def __init__(self, n: int, rows: dict[str, int] | None = None) -> None:
        self.n, self.rows = n, rows or {}

    def unread(self, seq: Sequence) -> int:
        return self.rows.get(seq.request_id, self.n)


def k_asked_with_backlog(backlog: int, reads: tuple[tuple[int, float], ...], drafted: bool = False) -> int:
    """K asked of a 2,100-token row with 128 tokens to write whose draft has `backlog` tokens left to read, the
    reading priced at `reads` (cached tokens, seconds a token); drafted: the row drafted (and was verified) once."""
    ctrl = costly_controller()
    ctrl.seed_pair(0.85, 7e-3, reads[0][1], reads=reads)
    ctrl.bind_drafter(Backlog(backlog))
    seq = Sequence("r", list(range(2100)), SamplingParams(max_tokens=128), max_len=200_000)
    if drafted:
        ctrl.observe(StepStats([seq], [2], [2], 0.04, 3, 2100.0, 0.014, 0.026))
        ctrl.k_batch = None
    return ctrl.choose([seq], K_MAX)[0]


LONG_READS = ((50, 1.1e-3), (2064, 3.3e-3))  # the 0.5B: 1.1 ms a token read after ~100 tokens, ~3.3 after 2,048


def test_reading_is_priced_at_the_rows_context():
    """500 tokens to read at the end of a 2,100-token row: ~1.6 s at the reading's price there, more than its 128
    tokens' drafts save; it does not draft. Control: priced at the probe's short context only (0.55 s), it does."""
    assert k_asked_with_backlog(500, LONG_READS) == 0
    assert k_asked_with_backlog(500, LONG_READS[:1]) >= 2


def test_a_row_that_drafted_and_then_sat_idle_is_priced_for_its_backlog():
    """A row that drafted once and then wrote 500 tokens at K = 0 has all of them to read again (having drafted
    was taken to mean its draft had read it: on the pair at 8 rows, rows that had drafted once were asked to catch
    up on ~45 tokens each at once, a 1.4 s step). Control: a backlog of what one step accepts drafts at once."""
    assert k_asked_with_backlog(500, LONG_READS, drafted=True) == 0
    assert k_asked_with_backlog(3, LONG_READS, drafted=True) >= 2


def test_a_draft_model_reports_what_it_has_left_to_read(tiny_target, tiny_draft):
    """The draft model's backlog: the whole row before it is asked to draft, then none once it has caught up."""
    llm = LLM(target=str(tiny_target), draft=str(tiny_draft), method="draft", num_speculative_tokens=2)
    seq = llm.engine.add_request("r", list(range(5, 45)), SamplingParams(max_tokens=8, ignore_eos=True))
    llm.engine.step()  # the prompt's prefill
    assert llm.engine.drafter.unread(seq) == len(seq.token_ids)
    while not seq.metrics.num_drafted:
        llm.engine.step()
    assert llm.engine.drafter.unread(seq) <= 3  # at most the tokens verified in its last step


class PairOnCall:
    """A draft model beside a target, stepped as the engine steps them: the target's step costs what `costly`'s
    cost model says, a drafted token 10 ms, and a draft that was idle first reads its backlog at 1 ms a token (a
    fresh request: its whole text). Each draft is right with probability 0.85 until the first miss."""

    def __init__(self, ctrl: GoodputController) -> None:
        self.ctrl, self.rng, self.backlog = ctrl, np.random.default_rng(0), 0
        ctrl.unread = lambda seq: self.backlog
        self.truth = CostModel.linear(20.1e-3, 1.5e-3, 2.4e-3, 0.3e-3)

    def serve(self, name: str, prompt: int = 100, max_tokens: int = 64) -> list[int]:
        """One request to its end; the K of each step."""
        seq = Sequence(name, list(range(prompt)), SamplingParams(max_tokens=max_tokens), max_len=200_000)
        seq.token_ids.append(7)  # the prefill's token
        seq.metrics.num_generated = 1
        self.backlog, ks = len(seq.token_ids), []
        while seq.metrics.num_generated < max_tokens:
            room = max_tokens - seq.metrics.num_generated - 1
            ks.append(self.step(seq, min(self.ctrl.choose([seq], K_MAX)[0], room)))
        self.ctrl.forget(seq)
        return ks

    def step(self, seq: Sequence, k: int) -> int:
        if k:
            proposal = Proposal(torch.full((1, k), 100), torch.tensor([k]), None, torch.ones(1, k))
            k = int(self.ctrl.truncate([seq], proposal).num_tokens[0])
        accepted = int(np.argmin(np.append(self.rng.random(k) < 0.85, False)))
        context = float(seq.num_cached)
        draft_s = (self.backlog * 1e-3 + k * 10e-3) if k else 0.0
        verify_s = self.truth.predict_verify(1, k, context)
        self.backlog = (2 if accepted == k else 1) if k else self.backlog + 1
        seq.token_ids.extend([7] * (accepted + 1))
        seq.metrics.num_generated += accepted + 1
        self.ctrl.observe(StepStats([seq], [k], [accepted], draft_s + verify_s, k + 1, context, draft_s, verify_s))
        return k


def speculating_share_after_a_busy_probe(requests: int = 32) -> float:
    """The share of the last 8 requests' steps that draft, for a pair priced at 2.5x its drafts' cost (the load
    probe timed while another process loaded beside it)."""
    ctrl = costly_controller()
    ctrl.seed_pair(0.85, 25e-3, 2.5e-3)
    pair = PairOnCall(ctrl)
    ks = [pair.serve(f"r{i}") for i in range(requests)]
    return float(np.mean([k >= 1 for request_ks in ks[-8:] for k in request_ks]))


def test_a_pair_priced_on_a_busy_machine_learns_its_drafts_real_price(monkeypatch):
    """Priced at 25 ms a draft where drafts cost 10 ms, `goodput` first sees K = 0 as best; its probes, which
    read a backlog first, price no draft, and the follow-up draft after each probe does: a few probes on, the
    pair drafts on almost every step (0.98 of them here, as when priced right). Controls, the same run with one
    part removed: no follow-up draft (every probe's drafting is a catch-up, so no step is priced), and no probe
    of a row the draft has not read (every request is fresh at its first steps, and drafting looked too dear to
    read it): K = 0 for good."""
    assert speculating_share_after_a_busy_probe() >= 0.8
    with monkeypatch.context() as m:
        m.setattr(GoodputController, "_follow_up", lambda self, seqs, ks, caps: ks)
        assert speculating_share_after_a_busy_probe() <= 0.05
    with monkeypatch.context() as m:
        m.setattr(GoodputController, "_probe_affords_reading", lambda self, seq, num_seqs, context: False)
        assert speculating_share_after_a_busy_probe() <= 0.05


def ks_of_a_pair(second_read: bool, checked: bool = True) -> list[int]:
    """K asked of two rows of 100 tokens with 128 to write, seeded at 0.85 acceptance and a draft whose forward
    costs 12 ms a position for one row and 13.5 for two (it reads its weights either way): the first row's draft
    has read it, the second's has 3,000 tokens left to read (second_read: none). checked: the asked drafts are
    priced again once rows are cut (`_asked_pays`; False: the control, as before it)."""
    ctrl = costly_controller()
    ctrl.seed_pair(0.85, 12e-3, 2e-3, steps=((1, 0, 12e-3), (2, 0, 13.5e-3)))
    ctrl.bind_drafter(Backlog(0, {"b": 0 if second_read else 3000}))
    if not checked:
        ctrl._asked_pays = lambda *args: True
    seqs = [Sequence(rid, list(range(100)), SamplingParams(max_tokens=128), max_len=200_000) for rid in "ab"]
    return ctrl.choose(seqs, K_MAX)


def test_drafts_left_to_one_row_of_a_batch_must_pay_for_the_draft_forward_alone():
    """Both rows drafting pay (~80 tokens/s at K = 1 against ~72 plain, at 0.85 a draft), so the batch curve asks
    for drafts; the second row's reading does not pay and it is cut, and the first row's drafts alone (~64
    tokens/s at K = 1, its draft forward costing nearly what two rows' did) lose to a plain step: nothing is
    drafted. Controls: both rows read, both draft; the same cut batch without the second pricing has the first
    row draft alone."""
    assert ks_of_a_pair(second_read=False) == [0, 0]
    both = ks_of_a_pair(second_read=True)
    assert min(both) >= 1
    unchecked = ks_of_a_pair(second_read=False, checked=False)
    assert unchecked[0] >= 1 and unchecked[1] == 0
