"""End to end: the joint of the first two generated tokens under speculative sampling equals the target's own
(computed exactly from the target), for every drafter path and every controller.

One-hot drafts go through the exponential race (n-gram chain; trees from `ngram_tree`, `eagle`, `medusa` with
tiny random heads), sampled drafts through rejection sampling (`layer_skip`, the draft model); the controllers
run over sampled drafts, where their choice of K could matter. Half the requests are seeded, so both the keyed
streams and the global RNG are exercised. Each path has a negative control: a fault injected into the real
engine path, caught by the same assertion with a wide margin (tests/stats.py). Exact per-position
probabilities of the verify rules themselves are tested at unit level (tests/test_verify*.py).

The target's processed distribution is computed by tests/stats.reference_probs, written from the spec rather
than with the engine's own process_logits: a fault in temperature, top-k or top-p would otherwise sit in the
reference too and pass (the top-k control below did, with process_logits as the reference).
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
import torch

import specdecode.drafters.draft_model
import specdecode.engine.engine
import specdecode.verify.chain
import specdecode.verify.sampling
import specdecode.verify.tree
from specdecode import LLM, SamplingParams
from specdecode.control.confidence import ConfidenceController
from specdecode.control.cost import CostModel
from specdecode.control.goodput import GoodputController
from specdecode.control.heuristic import HeuristicController
from specdecode.drafters.layer_select import LayerSkipChoice
from specdecode.drafters.subset_head import SubsetLMHead
from specdecode.step.runner import prefill
from specdecode.verify.sampling import SamplingTensors, process_logits
from specdecode.verify.streams import race
from tests.engine.test_greedy import counting_sources
from tests.engine.test_head_drafters import write_heads
from tests.stats import assert_follows, reference_probs
from tests.tiny import write_tiny_model

VOCAB = 8
N = 2000
# "3 7" recurs with three continuations: the n-gram chain drafts one of them, the n-gram tree all three.
REPEATING = [3, 7, 1, 3, 7, 2, 3, 7, 4, 3, 7]
SHORT = [3, 7, 1, 5]
# max_tokens 5 lets the first step draft up to 4 tokens (or tree nodes); only the first two are checked.
PARAMS = SamplingParams(temperature=1.0, top_k=6, top_p=0.95, max_tokens=5, ignore_eos=True)


@pytest.fixture(scope="module")
def models(tmp_path_factory, smollm2_tokenizer) -> dict[str, str]:
    root = tmp_path_factory.mktemp("dist")
    paths = {}
    for name, seed, layers in (("target", 0, 3), ("draft", 5, 1)):
        d = write_tiny_model(root / name, seed=seed, vocab_size=VOCAB, embed_scale=8.0, num_hidden_layers=layers)
        smollm2_tokenizer.save_pretrained(d)
        paths[name] = str(d)
    for kind in ("eagle", "medusa"):
        paths[kind] = str(write_heads(root / kind, paths["target"], kind, 3))
    LayerSkipChoice([0], 0.5, 1.1).save(root / "skip.json")  # drafts through layer 0 of 3: q far from p
    paths["layer_skip"] = str(root / "skip.json")
    return paths


def make_kwargs(models: dict[str, str], method: str, controller: str = "fixed", k: int = 4) -> dict:
    return {
        "target": models["target"],
        "draft": models.get(method),
        "method": method,
        "num_speculative_tokens": k,
        "controller": controller,
        "max_num_seqs": 1024,
        "max_model_len": 32,  # a small cache for 1024 rows: attention and allocation stay cheap
        "max_num_batched_tokens": 16384,
    }


def make(models: dict[str, str], method: str, controller: str = "fixed", k: int = 4) -> LLM:
    return LLM(**make_kwargs(models, method, controller, k))


def exact_joint(llm: LLM, prompt: list[int]) -> torch.Tensor:
    """[vocab, vocab] P(x1, x2 | prompt) under the processed target distribution (the reference's, in float64)."""
    model = llm.target
    cache = model.new_cache(1, 32)
    with torch.inference_mode():
        p1 = reference_probs(prefill(model, cache, 0, prompt, 64)[0, 0], PARAMS)  # [vocab]
        rows = []
        for x1 in range(VOCAB):
            cache.set_length(0, len(prompt))
            rows.append(reference_probs(prefill(model, cache, 0, [x1], 64)[0, 0], PARAMS))
    return p1[:, None] * torch.stack(rows)  # [vocab, vocab]


def sampled_joint(llm: LLM, prompt: list[int], n: int = N) -> tuple[torch.Tensor, int]:
    """[vocab, vocab] counts of (x1, x2) over n requests (every other one seeded), and the drafts verified."""
    params = [replace(PARAMS, seed=i if i % 2 else None) for i in range(n)]
    outs = llm.generate([prompt] * n, params)
    counts = torch.zeros(VOCAB, VOCAB)
    for o in outs:
        counts[o.token_ids[0], o.token_ids[1]] += 1
    return counts, sum(o.metrics["num_drafted"] for o in outs)


def target_sample_one_position_late(mp: pytest.MonkeyPatch, llm: LLM) -> None:
    """Fault: the target's own sample at each position is read one position late (drafts and target logits
    misaligned by one), in the chain's race and in the tree's."""

    def late(probs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        return race(probs, noise).roll(-1, dims=1)  # [num_seqs, n] position j gets position j + 1's sample

    mp.setattr(specdecode.verify.chain, "race", late)
    mp.setattr(specdecode.verify.tree, "race", late)


def draft_q_at_wrong_temperature(mp: pytest.MonkeyPatch, llm: LLM) -> None:
    """Fault: drafts drawn from q but q reported as processed at temperature 2 (sqrt(q) renormalised)."""
    propose = llm.engine.drafter.propose

    def lying_propose(seqs, num_tokens, st):
        proposal = propose(seqs, num_tokens, st)
        if proposal.probs is not None:  # None on steps that propose nothing
            flat = proposal.probs.sqrt()
            proposal.probs = flat / flat.sum(-1, keepdim=True)
        return proposal

    mp.setattr(llm.engine.drafter, "propose", lying_propose)


def recovered_from_p(mp: pytest.MonkeyPatch, llm: LLM) -> None:
    """Fault: at a rejection, emit a sample of p instead of the residual max(0, p - q)."""
    mp.setattr(specdecode.verify.chain, "residual", lambda p, q: p)


def top_k_off_by_one(mp: pytest.MonkeyPatch, llm: LLM | None = None) -> None:
    """Fault: top-k keeps k + 1 tokens, for the target's p and the drafts' q alike (so speculation stays
    consistent with it and only a reference written apart from the engine can see it)."""
    real = specdecode.verify.sampling._filter_top_k_top_p

    def keeps_one_more(logits: torch.Tensor, st: SamplingTensors) -> torch.Tensor:
        return real(logits, replace(st, top_k=torch.where(st.top_k > 0, st.top_k + 1, 0)))

    mp.setattr(specdecode.verify.sampling, "_filter_top_k_top_p", keeps_one_more)


# path -> (method, prompt, the fault its negative control injects, requests). The race is shared by the chain
# and every tree, so its fault runs once on a chain (ngram) and once on a tree (medusa, the cheapest tree
# drafter here); EAGLE, several times slower per request, checks its own tree path on half the requests.
PATHS = {
    "ngram": ("ngram", REPEATING, target_sample_one_position_late, N),
    "ngram_tree": ("ngram_tree", REPEATING, target_sample_one_position_late, N),
    "eagle": ("eagle", SHORT, target_sample_one_position_late, N // 2),
    "medusa": ("medusa", SHORT, target_sample_one_position_late, N),
    "layer_skip": ("layer_skip", SHORT, draft_q_at_wrong_temperature, N),
    "draft": ("draft", SHORT[:1], recovered_from_p, N),  # one-token prompt: no per-request draft prefill
}


CASES = [(path, False) for path in PATHS] + [(path, True) for path in ("ngram", "medusa", "layer_skip", "draft")]


@pytest.mark.parametrize(("path", "faulty"), CASES, ids=[f"{p}-{'fault' if f else 'intact'}" for p, f in CASES])
def test_first_two_tokens_follow_target(models, path, faulty, monkeypatch):
    method, prompt, fault, n = PATHS[path]
    llm = make(models, method)
    if faulty:
        fault(monkeypatch, llm)
    counts, drafted = sampled_joint(llm, prompt, n)
    assert_follows(counts, exact_joint(llm, prompt), fault.__name__ if faulty else None)
    assert drafted >= n  # speculation really ran


def test_control_top_k_off_by_one_is_caught(models, monkeypatch):
    """Negative control of the reference itself: the engine's top-k off by one moves the joint off the spec's
    (on the n-gram chain, whose first token's top-k cut binds). With process_logits as the reference, as the
    test had it, the fault passed: chi-square 0.42 x critical."""
    llm = make(models, "ngram")
    top_k_off_by_one(monkeypatch)
    counts, _ = sampled_joint(llm, REPEATING)
    assert_follows(counts, exact_joint(llm, REPEATING), "top_k_off_by_one")


# Temperatures, top-k and top-p (1e-300 rounds to 0 in fp32: the best token alone stays), over random rows and
# rows with ties inside and across the cuts and -inf (a grammar's mask).
UNIT_PARAMS = [
    SamplingParams(temperature=t, top_k=k, top_p=p)
    for t in (0.0, 0.5, 1.0, 3.0)
    for k in (0, 1, 3, 6)
    for p in (1.0, 0.9, 0.5, 1e-300)
]
INF = float("-inf")
TIED_ROWS = [
    [2.0, 2.0, 1.0, 1.0, 1.0, -1.0, INF, 0.0],
    [0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0],
    [INF, INF, 3.0, INF, 0.0, 0.0, INF, INF],
    [INF, INF, INF, INF, INF, 1.0, INF, INF],
]


def _unit_rows() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(VOCAB, generator=gen) * 2 for _ in range(24)] + [torch.tensor(r) for r in TIED_ROWS]


def _disagreements() -> list[str]:
    """Cases where process_logits differs from the reference (by more than fp32 rounding); where ties make the
    reference ambiguous (it raises), the sorted probabilities must still agree."""
    bad = []
    for i, row in enumerate(_unit_rows()):
        for params in UNIT_PARAMS:
            got = process_logits(row[None, None], SamplingTensors.from_params([params], "cpu"))[0, 0].double()
            try:
                want = reference_probs(row, params)
            except ValueError:
                got, want = got.sort().values, reference_probs(row, params, strict=False).sort().values
            if not torch.allclose(got, want, atol=1e-6):
                bad.append(f"row {i} {params}: {got.tolist()} != {want.tolist()}")
    return bad


@pytest.mark.parametrize("fault", [False, True])
def test_process_logits_follows_the_reference(fault, monkeypatch):
    """The engine's processing equals the brute-force reference on every case; the negative control (top-k
    off by one) is caught on many."""
    if fault:
        top_k_off_by_one(monkeypatch)
        assert len(_disagreements()) >= 20
    else:
        assert _disagreements() == []


def goodput_varying_k() -> GoodputController:
    # A row costs as much as three verified tokens: at the prior acceptance one or two drafts pay, no more, so
    # the verified width moves with the acceptance estimates (it would stay at K_max with cheap tokens).
    return GoodputController(cost=CostModel.linear(0.0, 3.0, 1.0, 0.0))


CONTROLLERS = {
    "goodput": goodput_varying_k,
    "heuristic": HeuristicController,
    "confidence": lambda: ConfidenceController(threshold=0.5),
}


@pytest.mark.parametrize("controller", list(CONTROLLERS))
def test_every_controller_keeps_sampled_drafts_lossless(models, controller):
    """Controllers choose K (and may cut drafts) from past outcomes and draft-side information; over sampled
    drafts (`layer_skip`), where K could matter, the joint stays the target's, while K really varies."""
    llm = make(models, "layer_skip")
    llm.engine.controller = CONTROLLERS[controller]()
    seen: set[int] = set()
    observe = llm.engine.controller.observe

    def record(stats):
        seen.update(stats.num_proposed)
        observe(stats)

    llm.engine.controller.observe = record
    counts, drafted = sampled_joint(llm, SHORT)
    assert_follows(counts, exact_joint(llm, SHORT))
    assert drafted >= N // 4 and len(seen - {0}) >= 2, f"K did not vary: {sorted(seen)}"


def test_draft_with_a_vocabulary_subset_stays_lossless(models):
    """A draft that can only propose 5 of the 8 tokens (q = 0 elsewhere, as with `--draft-vocab`): the
    target's tokens outside the subset come back through the residual, so the joint is still the target's."""
    llm = make(models, "draft")
    SubsetLMHead.install(llm.draft_model, torch.tensor([0, 2, 5, 6, 7]))
    counts, drafted = sampled_joint(llm, SHORT[:1])
    assert_follows(counts, exact_joint(llm, SHORT[:1]))
    assert drafted >= N


def lookup_q_uniform(mp: pytest.MonkeyPatch, llm: LLM) -> None:
    """Fault: lookup drafts reported as drawn from a uniform q instead of one-hot (their source forgotten)."""
    real = specdecode.drafters.draft_model.merge

    def blurred(model, lookup, vocab):
        proposal = real(model, lookup, vocab)
        for b, made in enumerate(lookup.num_tokens.tolist()):
            if made and proposal.probs is not None:
                proposal.probs[b] = 1.0 / vocab
        return proposal

    mp.setattr(specdecode.drafters.draft_model, "merge", blurred)


@pytest.mark.parametrize("faulty", [False, True], ids=["intact", "fault"])
def test_draft_with_prompt_lookup_stays_lossless(models, faulty, monkeypatch):
    """Requests whose last two tokens recur (REPEATING) take lookup drafts, one-hot q; in the same batches requests
    on a prompt that recurs nowhere take the draft model's sampled drafts, so the lookup rows' q is spelled out
    beside theirs. The joint of the lookup rows is still the target's. Control: lookup drafts verified as if drawn
    from a uniform q."""
    llm = LLM(**{**make_kwargs(models, "draft"), "draft_lookup": 2})
    sources = {"lookup": 0, "model": 0}
    llm.engine.drafter.lookup.propose = counting_sources(llm.engine.drafter.lookup.propose, sources)
    if faulty:
        lookup_q_uniform(monkeypatch, llm)
    prompts = [REPEATING if i % 2 == 0 else SHORT[:1] for i in range(2 * N)]
    params = [replace(PARAMS, seed=i if i % 4 == 0 else None) for i in range(2 * N)]
    counts = torch.zeros(VOCAB, VOCAB)
    for o in llm.generate(prompts, params)[::2]:
        counts[o.token_ids[0], o.token_ids[1]] += 1
    assert_follows(counts, exact_joint(llm, REPEATING), lookup_q_uniform.__name__ if faulty else None)
    assert sources["lookup"] >= N and sources["model"] >= N, sources


def test_goodput_holding_rows_to_the_lookup_stays_lossless(models):
    """`goodput` holds the rows it asks the draft model nothing for to the lookup (`GoodputController._hold`): which
    rows it holds follows timings and past outcomes, never the drafts, and their drafts are one-hot; the joint of
    the lookup rows is still the target's. Held on every step it could be (the ledger that stops holding where the
    lookups stop paying, control/hold_ledger.py, also goes by past outcomes and timings alone), for enough lookup
    drafts to judge.

    Which rows the model is asked for followed this machine's timings too: a CI run on a busy machine asked it for
    every row on every step and held none (2026-12-01). So every other step here asks the model nothing, whatever
    the timings (by step count: still never by the drafts), and no step is a plain probe (`plain_doubt`)."""
    llm = LLM(**{**make_kwargs(models, "draft"), "draft_lookup": 2, "controller": "goodput"})
    controller = llm.engine.controller
    controller.hold_ledger.min_steps = float("inf")
    controller.plain_doubt = 0.0
    ask, steps = controller._ask, itertools.count()
    controller._ask = lambda seqs, ks, room: ask(seqs, ks if next(steps) % 2 else [0] * len(ks), room)
    drafter, holds, sources = llm.engine.drafter, [], {"lookup": 0, "model": 0}
    hold = drafter.hold_model
    drafter.hold_model = lambda ids: holds.append(len(ids)) or hold(ids)
    llm.engine.controller.bind_drafter(drafter)  # binds the counting hold
    drafter.lookup.propose = counting_sources(drafter.lookup.propose, sources)
    prompts = [REPEATING if i % 2 == 0 else SHORT[:1] for i in range(2 * N)]
    params = [replace(PARAMS, seed=i if i % 4 == 0 else None) for i in range(2 * N)]
    counts = torch.zeros(VOCAB, VOCAB)
    for o in llm.generate(prompts, params)[::2]:
        counts[o.token_ids[0], o.token_ids[1]] += 1
    assert_follows(counts, exact_joint(llm, REPEATING))
    assert sum(holds) >= N and sources["lookup"] >= N, (sum(holds), sources)


def test_draft_that_stops_when_unsure_stays_lossless(models):
    """The draft model stops a row's drafting after a draft whose top probability is below 0.6 (on this tiny
    random draft, often): fewer drafts, and the joint is still the target's."""
    llm = LLM(**{**make_kwargs(models, "draft"), "draft_stop_below": 0.6})
    drafter, cuts = llm.engine.drafter, [0]
    stop_unsure = drafter._stop_unsure

    def counting(num_tokens, confidence, j):
        kept = stop_unsure(num_tokens, confidence, j)
        cuts[0] += sum(a != b for a, b in zip(num_tokens, kept, strict=True))
        return kept

    drafter._stop_unsure = counting
    counts, drafted = sampled_joint(llm, SHORT[:1])
    assert_follows(counts, exact_joint(llm, SHORT[:1]))
    assert drafted >= N and cuts[0] >= N // 4  # it drafted, and rows stopped short of K
