"""Greedy speculative decoding is token-for-token plain greedy decoding, for every drafter, K and batch."""

from __future__ import annotations

import pytest

from specdecode import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
# Mixed lengths; repetition in the prompts gives the n-gram drafter something to find.
PROMPTS = [
    [5, 6, 7, 8, 5, 6, 7, 8, 5, 6],
    [11, 12, 13],
    [20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 20, 21, 22, 23, 24, 25, 40, 41, 20, 21, 22],
    [3, 4],
]


@pytest.fixture(scope="module")
def reference(tiny_target) -> list[list[int]]:
    llm = LLM(target=str(tiny_target), method="none", max_num_seqs=1)
    return [llm.generate([p], GREEDY)[0].token_ids for p in PROMPTS]


def make_llm(method: str, k: int, target, draft, batch: int, controller: str = "fixed", **settings) -> LLM:
    return LLM(
        target=str(target),
        draft=str(draft) if method == "draft" else None,
        method=method,
        num_speculative_tokens=k,
        controller=controller,
        max_num_seqs=batch,
        **settings,
    )


@pytest.mark.parametrize("method", ["ngram", "ngram_tree", "draft", "self"])
@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("batch", [1, 4])
def test_speculative_equals_plain_greedy(method, k, batch, tiny_target, tiny_draft, reference):
    llm = make_llm(method, k, tiny_target, tiny_draft, batch)
    outs = llm.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == reference
    assert all(o.metrics["num_generated"] == GREEDY.max_tokens for o in outs)
    if method != "ngram":
        assert sum(o.metrics["num_drafted"] for o in outs) > 0


def test_self_draft_accepts_everything(tiny_target, reference):
    llm = make_llm("self", 4, tiny_target, None, 4)
    for out in llm.generate(PROMPTS, GREEDY):
        assert out.metrics["acceptance_rate"] == 1.0
        assert out.metrics["mean_accepted_tokens"] > 4.0  # 5 per forward except where max_tokens cuts K


def test_draft_model_really_disagrees(tiny_target, tiny_draft):
    """Guard on the test itself: with a weak draft some drafts are rejected, so rollback is exercised."""
    outs = make_llm("draft", 3, tiny_target, tiny_draft, 4).generate(PROMPTS, GREEDY)
    drafted = sum(o.metrics["num_drafted"] for o in outs)
    accepted = sum(o.metrics["num_accepted"] for o in outs)
    assert 0 < accepted < drafted


def test_plain_decoding_tau_is_one(tiny_target):
    out = LLM(target=str(tiny_target), method="none").generate([PROMPTS[0]], GREEDY)[0]
    assert out.metrics["mean_accepted_tokens"] == 1.0
    assert out.metrics["num_target_forwards"] == GREEDY.max_tokens


def test_batched_equals_unbatched(tiny_target, tiny_draft, reference):
    """Batch invariance: rows joining and leaving a batch don't change any row's greedy output."""
    llm = make_llm("draft", 3, tiny_target, tiny_draft, 2)  # 4 prompts through 2 slots: continuous batching
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (40, 13, 40, 27)]
    outs = llm.generate(PROMPTS, params)
    assert [o.token_ids for o in outs] == [r[: p.max_tokens] for r, p in zip(reference, params, strict=True)]


@pytest.mark.parametrize("controller", ["heuristic", "goodput", "confidence"])
@pytest.mark.parametrize("method", ["ngram", "ngram_tree", "draft"])
def test_dynamic_controllers_are_lossless(method, controller, tiny_target, tiny_draft, reference):
    llm = make_llm(method, 8, tiny_target, tiny_draft, 4, controller)
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == reference


@pytest.mark.parametrize("stop_below", [0.3, 0.9])
def test_draft_that_stops_when_unsure_equals_plain_greedy(stop_below, tiny_target, tiny_draft, reference):
    """Rows stop drafting at different depths in one batch; every row's cache still grows by its own count."""
    outs = make_llm("draft", 6, tiny_target, tiny_draft, 4, draft_stop_below=stop_below).generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == reference
    drafted = sum(o.metrics["num_drafted"] for o in outs)
    forwards = sum(o.metrics["num_target_forwards"] for o in outs)
    assert 0 < drafted < 0.9 * 6 * forwards  # drafts were verified, and rows stopped short of K


def counting_sources(propose, sources: dict[str, int]):
    """The lookup ahead of a draft model's `propose`, counting the rows it drafted for ("lookup") and the rows asked
    for drafts it found none for, which the draft model then drafts ("model")."""

    def counting(seqs, num_tokens, st):
        found = propose(seqs, num_tokens, st)
        made = found.num_tokens.tolist()
        sources["lookup"] += sum(n > 0 for n in made)
        sources["model"] += sum(n == 0 and k > 0 for n, k in zip(made, num_tokens, strict=True))
        return found

    return counting


@pytest.mark.parametrize("controller", ["fixed", "goodput"])
@pytest.mark.parametrize(("k", "batch"), [(3, 1), (8, 4)])
def test_draft_with_prompt_lookup_equals_plain_greedy(controller, k, batch, tiny_target, tiny_draft, reference):
    """Rows whose last tokens recur take lookup drafts, the others the draft model's, in one batch and step; the
    draft model reads what lookup rows skipped when it next drafts for them (drafters/lookup_first.py)."""
    llm = make_llm("draft", k, tiny_target, tiny_draft, batch, controller, draft_lookup=2, draft_stop_below=0.3)
    drafter, sources = llm.engine.drafter, {"lookup": 0, "model": 0}
    drafter.lookup.propose = counting_sources(drafter.lookup.propose, sources)
    holds, hold = [], drafter.hold_model
    drafter.hold_model = lambda ids: holds.append(len(ids)) or hold(ids)
    llm.engine.controller.bind_drafter(drafter)  # binds the counting hold
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == reference
    # both sources drafted (goodput soon asks this tiny random draft for nothing: only that it ran is asked of it)
    least = 5 if controller == "fixed" else 1
    assert sources["lookup"] >= least and sources["model"] >= least, sources
    # goodput holds the rows it asks the model nothing for to the lookup (`GoodputController._hold`): on its first
    # steps, and then while the lookups pay (control/hold_ledger.py; on this tiny random model they soon do not)
    assert (sum(holds) >= 4) == (controller == "goodput"), sum(holds)


def test_goodput_over_a_draft_that_stops_when_unsure_is_lossless_and_told_where_it_stops(
    tiny_target, tiny_draft, reference
):
    """`goodput` reads the draft's stop off the drafter it is bound to and learns the position past each K from the
    last draft's confidence (control/continuation.py); the tokens stay plain greedy's."""
    llm = make_llm("draft", 6, tiny_target, tiny_draft, 4, "goodput", draft_stop_below=0.5)
    controller = llm.engine.controller
    controller.cheap_draft = 0.0  # K priced as for a dear draft model, not asked in full as a cheap lookup is
    update, verdicts = controller.continuation.update, []

    def spy(asked: int, made: int, accepted: int, would_go_on: bool | None = None) -> None:
        verdicts.append(would_go_on)
        update(asked, made, accepted, would_go_on)

    controller.continuation.update = spy
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == reference
    assert controller.draft_stop_below == 0.5
    assert {True, False} <= set(verdicts)  # rows that made all they were asked, confident and not
