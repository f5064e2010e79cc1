"""Chunked prefill under a per-step token budget (EngineConfig.max_num_batched_tokens).

A long prompt arrives while three short requests decode. With a small budget the engine runs the short ones'
decode and verify tokens first and the prompt's chunks from the rest, so the prompt is cut at boundaries that
move with the step's decode tokens; with a large one it is prefilled in one piece. Every request's tokens must be
the same either way (greedy and seeded sampled), on every drafter: chain and tree drafters, the draft model and
the target drafting for itself (own caches fed a chunk per step), EAGLE, Medusa and MTP (features of each chunk),
layer skip (the target's cache) and the suffix drafters (an index over the prompt). The drafters' state over the
prompt is checked as well: at every position both runs drafted from, they proposed the same tokens. And the long
request's log-probabilities agree to float rounding, so a wrong cache that happens to move no argmax is seen.

A chunk rides in the step's verify forward, cut into rows of the step's width on its own slot (fused_prefill, the
default: every drafter), or runs in a forward of its own (fused_prefill off: one drafter of each kind). Negative
controls cut the chunk boundaries wrong through the real engine (each chunk after the first starts one position
early, repeating one, or one late, skipping one), on either path, and the same comparison fails.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import specdecode.engine.engine as engine_module
from specdecode.config import ConfigError, EngineConfig, SamplingParams
from specdecode.engine.engine import Engine
from specdecode.llm import LLM
from specdecode.models import few_rows
from specdecode.step.sequence import Status
from tests.engine.machine import DRAFTER_METHODS, World
from tests.engine.test_context_edges import ramp
from tests.models.test_few_queries_attention import use_sdpa

MAX_LEN = 256
LONG = ramp(170, 5)  # the long prompt: 169 tokens to prefill, the last one stays pending
SHORT = [ramp(6, 7), ramp(9, 11), ramp(4, 13)]
SHORT_PARAMS = [
    SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True),
    SamplingParams(temperature=1.0, top_k=8, seed=5, max_tokens=40, ignore_eos=True),
    SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True),
]
LONG_PARAMS = {
    "greedy": SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, logprobs=2),
    "seeded": SamplingParams(temperature=0.9, top_p=0.95, seed=17, max_tokens=16, ignore_eos=True, logprobs=2),
}
SMALL, WHOLE = 40, 1024  # budgets: chunks of 16..28 tokens beside three rows of K + 1 = 4, or the prompt whole
K = 3
CASES = [(m, False) for m in DRAFTER_METHODS] + [("draft", True)]  # ("draft", True): the target drafts for itself
# Every case runs with its chunks in the verify forward (the default); the separate forward, unchanged code, runs
# for one drafter of each kind: a chain, a tree, a feature drafter, a draft model, the target drafting for itself.
SEPARATE = {("none", False), ("ngram_tree", False), ("eagle", False), ("draft", False), ("draft", True)}
PATHS = [(m, d, True) for m, d in CASES] + [(m, d, False) for m, d in CASES if (m, d) in SEPARATE]


@pytest.fixture(scope="module")
def world(tiny_target, tiny_draft, drafts):
    llm = LLM(target=str(tiny_target), draft=str(tiny_draft), method="draft")  # loads both as LLM does
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one thread is fastest, and the box is shared
    yield World(llm.target, llm.draft_model, llm.tokenizer, drafts, llm._eos_ids())
    torch.set_num_threads(threads)


class Run:
    """One engine run of the scene, with what the test reads of it: tokens, the long prompt's chunks, the
    long request's proposals by position, and each step's target tokens."""

    def __init__(
        self,
        world: World,
        method: str,
        self_draft: bool,
        budget: int,
        monkeypatch,
        fused: bool = True,
        max_num_seqs: int = 4,
    ) -> None:
        self.engine = world.engine(method, "fixed", MAX_LEN, budget, max_num_seqs, K, self_draft, fused)
        if fused:  # every chunk rides: the tiny model's weights are few bytes beside its K/V (`_rides`, tested below)
            self.engine._weight_bytes = 1 << 40
        self.chunks: list[tuple[int, int]] = []  # (first position, length) of each chunk of the long prompt
        self.proposals: dict[int, tuple] = {}  # long request's pending position -> its drafts (and tree parents)
        self.step_tokens: list[tuple[int, int]] = []  # (decode and verify tokens, prefill tokens) per step
        self._prefill_tokens = 0
        self._long = None  # the long request, once added
        self._watch(monkeypatch)

    def _watch(self, monkeypatch) -> None:
        prefilled = self.engine._prefilled  # every chunk's bookkeeping, whichever forward cached it

        def seen(chunks, hidden):
            for seq, chunk in chunks:
                if chunk and seq is self._long:
                    self.chunks.append((seq.num_prefilled, len(chunk)))
                self._prefill_tokens += len(chunk)
            return prefilled(chunks, hidden)

        monkeypatch.setattr(self.engine, "_prefilled", seen)
        self.forwards = 0  # the target's forwards (the engine's own, and a drafter's through the target)
        target = self.engine.target
        forward = target.forward

        def counted(*args, **kwargs):
            self.forwards += 1
            return forward(*args, **kwargs)

        monkeypatch.setattr(target, "forward", counted)
        propose = self.engine.drafter.propose

        def recorded(seqs, num_tokens, st):
            proposal = propose(seqs, num_tokens, st)
            for b, seq in enumerate(seqs):
                n = int(proposal.num_tokens[b])
                if seq is self._long and n:
                    parents = None if proposal.parents is None else proposal.parents[b, :n].tolist()
                    self.proposals[seq.num_cached] = (proposal.token_ids[b, :n].tolist(), parents)
            return proposal

        monkeypatch.setattr(self.engine.drafter, "propose", recorded)

    def play(self, long_params: SamplingParams) -> list[list[int]]:
        """The short requests decode for three steps; then the long prompt arrives; all run to the end."""
        engine = self.engine
        seqs = [engine.add_request(f"s{i}", p, sp) for i, (p, sp) in enumerate(zip(SHORT, SHORT_PARAMS, strict=True))]
        for _ in range(3):
            self._step()
        self._long = engine.add_request("long", LONG, long_params)
        seqs.append(self._long)
        self.interleaved = 0  # steps in which the long prompt was prefilled and every short request got tokens
        self.interleaved_forwards: list[int] = []  # target forwards in each of those steps
        while engine.has_work():
            prefilling = self._long.status is not Status.RUNNING and self._long.status is not Status.FINISHED
            forwards = self.forwards
            updates = self._step()
            short_served = {u.seq.request_id for u in updates if u.new_token_ids} >= {"s0", "s1", "s2"}
            self.interleaved += prefilling and short_served
            if prefilling and short_served:
                self.interleaved_forwards.append(self.forwards - forwards)
        assert all(s.finish_reason == "length" for s in seqs), [s.error for s in seqs]
        self.logprobs = torch.tensor([t.logprob for t in self._long.logprobs])  # [16] of the long one's tokens
        return [s.output_ids for s in seqs]

    def _step(self) -> list:
        self._prefill_tokens = 0
        before = self.engine.last_step
        updates = self.engine.step()
        decoded = self.engine.last_step.num_verified_tokens if self.engine.last_step is not before else 0
        self.step_tokens.append((decoded, self._prefill_tokens))
        return updates


def check_chunked_equals_whole(
    world: World, method: str, self_draft: bool, sampling: str, monkeypatch, fault=None, fused: bool = True
) -> Run:
    """The scene with the prompt whole, then chunked (with `fault` injected first, for the controls); `fused`:
    the chunks ride in the verify forward."""
    whole = Run(world, method, self_draft, WHOLE, monkeypatch, fused)
    want = whole.play(LONG_PARAMS[sampling])
    monkeypatch.undo()  # the chunked run watches its own engine
    if fault is not None:
        fault(monkeypatch)
    chunked = Run(world, method, self_draft, SMALL, monkeypatch, fused)
    got = chunked.play(LONG_PARAMS[sampling])
    assert whole.chunks == [(0, len(LONG) - 1)], whole.chunks  # the reference prefilled the prompt in one piece
    assert got == want, "a chunked prefill changed the tokens"
    # Exact tokens could hide a wrong cache that moves no argmax: the long request's log-probabilities agree too
    # (to float rounding: a chunk's matmuls are shaped unlike the whole prompt's).
    assert torch.allclose(chunked.logprobs, whole.logprobs, atol=1e-4), "a chunked prefill changed the logprobs"
    common = set(whole.proposals) & set(chunked.proposals)
    for pos in sorted(common):
        assert chunked.proposals[pos] == whole.proposals[pos], f"the drafter proposed otherwise at position {pos}"
    return chunked


@pytest.mark.parametrize("sampling", ["greedy", "seeded"])
@pytest.mark.parametrize(("method", "self_draft", "fused"), PATHS)
def test_chunked_prefill_gives_the_tokens_of_one_piece(world, method, self_draft, sampling, fused, monkeypatch):
    chunked = check_chunked_equals_whole(world, method, self_draft, sampling, monkeypatch, fused=fused)
    # The prompt was cut in contiguous chunks that cover it once, while the others kept decoding.
    starts = [start for start, _ in chunked.chunks]
    assert len(chunked.chunks) >= 5 and starts == sorted(set(starts))
    assert starts[0] == 0 and sum(n for _, n in chunked.chunks) == len(LONG) - 1
    assert chunked.interleaved >= len(chunked.chunks) - 1
    # Each step stays within the budget; a prompt always advances by MIN_PREFILL_TOKENS at least.
    for decoded, prefilled in chunked.step_tokens:
        assert decoded + prefilled <= max(SMALL, decoded + engine_module.MIN_PREFILL_TOKENS), (decoded, prefilled)


@pytest.mark.parametrize("method", ["none", "ngram_tree"])
def test_chunked_prefill_on_the_sdpa_path(world, method, monkeypatch):
    """Without the kernel a chunk's rows, cut on the prompt's one slot, go through SDPA beside the decoding rows:
    the same tokens and log-probabilities as the prompt whole (SDPA's grouped view held one query row per slot, and
    rows on a shared slot overwrote each other there: 5e-3 apart on CPUs without AVX-512, 2026-12-07)."""
    served = few_rows.attention_usable()
    use_sdpa(monkeypatch)
    try:
        check_chunked_equals_whole(world, method, False, "greedy", monkeypatch, fault=use_sdpa)
    finally:
        if hasattr(torch.ops.specdecode, "set_attend_kernel"):
            few_rows.set_attention_kernel(served)


def check_one_forward_a_step(world, fused: bool, monkeypatch) -> None:
    """While the long prompt prefills beside the three decoding requests, each step runs one target forward."""
    run = Run(world, "ngram", False, SMALL, monkeypatch, fused)
    run.play(LONG_PARAMS["greedy"])
    assert len(run.interleaved_forwards) >= 5
    assert set(run.interleaved_forwards) == {1}, f"target forwards a step: {run.interleaved_forwards}"


def test_a_prompt_chunk_rides_in_the_verify_forward(world, monkeypatch):
    """fused_prefill: the chunk's weights are read once with the verify's, not in a forward of its own."""
    check_one_forward_a_step(world, True, monkeypatch)


def test_control_chunks_in_a_forward_of_their_own_are_caught(world, monkeypatch):
    with pytest.raises(AssertionError, match="target forwards a step"):
        check_one_forward_a_step(world, False, monkeypatch)


def test_a_chunk_rides_while_its_extra_cache_reads_are_fewer_bytes_than_the_weights(world):
    """Rows of `width` tokens each read the prompt's cache before them: a chunk of 24 tokens at position 100 in
    one-token rows reads it 23 times more than whole; it rides only if that is no more than the weights' bytes."""
    engine = world.engine("ngram", "fixed", MAX_LEN, SMALL, 4, K)
    target = world.target
    per_token = 2 * target.cfg.num_layers * target.cfg.num_kv_heads * target.cfg.head_dim * 4  # K and V, fp32
    assert engine._kv_bytes_per_token() == per_token
    seq = SimpleNamespace(num_prefilled=100)
    extra = 23 * 124 * per_token
    engine._weight_bytes = extra
    assert engine._rides(seq, 24, 1) and engine._rides(seq, 24, 24) and engine._rides(seq, 24, 2)
    engine._weight_bytes = extra - 1
    assert not engine._rides(seq, 24, 1) and engine._rides(seq, 24, 24)  # one row: no extra reads


def test_the_proposals_are_compared(world, monkeypatch):
    """The drafter-state check is not vacuous: both runs drafted from many of the same positions."""
    whole = Run(world, "suffix", False, WHOLE, monkeypatch)
    whole.play(LONG_PARAMS["greedy"])
    monkeypatch.undo()
    chunked = Run(world, "suffix", False, SMALL, monkeypatch)
    chunked.play(LONG_PARAMS["greedy"])
    assert len(set(whole.proposals) & set(chunked.proposals)) >= 3


def shifted_boundaries(monkeypatch, shift: int) -> None:
    """Fault: every prompt chunk after the first starts `shift` positions off (-1 repeats the position before
    it, +1 skips one), its length and the cache's bookkeeping unchanged: in whichever forward it runs."""
    next_chunks = Engine._next_chunks

    def faulty(self, budget, *priced):
        chunks = next_chunks(self, budget, *priced)
        return [
            (seq, seq.prompt_ids[seq.num_prefilled + shift :][: len(chunk)] if seq.num_prefilled else chunk)
            for seq, chunk in chunks
        ]

    monkeypatch.setattr(Engine, "_next_chunks", faulty)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("shift", [-1, 1])
@pytest.mark.parametrize("method", ["ngram", "ngram_tree", "eagle"])
def test_control_a_boundary_off_by_one_changes_the_tokens(world, method, shift, fused, monkeypatch):
    def fault(mp) -> None:
        shifted_boundaries(mp, shift)

    with pytest.raises(AssertionError, match="a chunked prefill changed the (tokens|logprobs)"):
        check_chunked_equals_whole(world, method, False, "greedy", monkeypatch, fault, fused)


@pytest.mark.parametrize("budget", [0, 15, -4])
def test_a_budget_below_the_minimum_is_a_clear_error(budget):
    with pytest.raises(ConfigError, match="max_num_batched_tokens must be >= 16"):
        EngineConfig(max_num_batched_tokens=budget)


def lone_prompt_chunks(world: World, monkeypatch) -> list[tuple[int, int]]:
    """The long prompt's chunks at the small budget when no other request is there to decode."""
    run = Run(world, "ngram", False, SMALL, monkeypatch)
    run._long = run.engine.add_request("long", LONG, LONG_PARAMS["greedy"])
    while run.engine.has_work():
        run._step()
    return run.chunks


def assert_one_piece(chunks: list[tuple[int, int]]) -> None:
    assert chunks == [(0, len(LONG) - 1)], f"a lone prompt was prefilled in {len(chunks)} chunks"


def test_a_lone_prompt_prefills_in_one_piece(world, monkeypatch):
    """Nobody decodes, so nobody waits on a chunk: the prompt takes IDLE_PREFILL_TOKENS, not the budget."""
    assert_one_piece(lone_prompt_chunks(world, monkeypatch))


def test_control_without_the_idle_rule_a_lone_prompt_is_chunked(world, monkeypatch):
    monkeypatch.setattr(engine_module, "IDLE_PREFILL_TOKENS", 0)
    with pytest.raises(AssertionError, match="a lone prompt was prefilled in 5 chunks"):
        assert_one_piece(lone_prompt_chunks(world, monkeypatch))


def steps_to_a_late_prompts_first_token(world, monkeypatch) -> int:
    """Three short requests decode; the long prompt arrives; a step later (with most of it left to prefill) a
    short prompt does: the steps until that one's first token. The long prompt still ends its prefill."""
    run = Run(world, "ngram", False, SMALL, monkeypatch, max_num_seqs=5)  # a free slot for the late prompt
    engine = run.engine
    for i, (prompt, params) in enumerate(zip(SHORT, SHORT_PARAMS, strict=True)):
        engine.add_request(f"s{i}", prompt, params)
    for _ in range(3):
        run._step()
    run._long = engine.add_request("long", LONG, LONG_PARAMS["greedy"])
    run._step()
    late = engine.add_request("late", ramp(12, 3), SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    steps = 0
    while late.metrics.num_generated == 0:
        run._step()
        steps += 1
    while engine.has_work():
        run._step()
    assert run._long.finish_reason == "length" and sum(n for _, n in run.chunks) == len(LONG) - 1
    return steps


def test_a_short_prompt_does_not_wait_out_a_long_ones_prefill(world, monkeypatch):
    """The prompts with the fewest tokens left prefill first: the late prompt's 11 tokens go in the next step's
    chunk and it writes its first token the step after, where oldest-first made it wait out the ~140 tokens the
    long prompt still had (behind a 16k prompt on the Qwen2.5-Coder 1.5B, ~200 s)."""
    steps = steps_to_a_late_prompts_first_token(world, monkeypatch)
    assert steps <= 2, f"the late prompt waited {steps} steps for its first token"


def test_control_oldest_first_makes_the_short_prompt_wait(world, monkeypatch):
    monkeypatch.setattr(engine_module, "sorted", lambda seqs, key=None: list(seqs), raising=False)  # arrival order
    with pytest.raises(AssertionError, match=r"the late prompt waited [5-9] steps"):
        test_a_short_prompt_does_not_wait_out_a_long_ones_prefill(world, monkeypatch)


def long_prompt_chunk_sizes(world, monkeypatch) -> list[int]:
    run = Run(world, "ngram", False, SMALL, monkeypatch)
    run.play(LONG_PARAMS["greedy"])
    return [n for _, n in run.chunks]


def test_a_long_prompts_chunks_shrink_as_its_context_grows(world, monkeypatch):
    """Beside decoding rows a prompt token counts at its price after the context before it (prefill_price.py;
    this tiny model's attention matches its linears after 288 tokens): the long prompt's chunks get shorter as it
    is cached, where a budget counted in tokens cut them level."""
    sizes = long_prompt_chunk_sizes(world, monkeypatch)
    assert sizes[-2] <= 0.75 * sizes[0], f"chunks of {sizes} tokens"  # the last one is what was left


def test_control_unpriced_tokens_cut_level_chunks(world, monkeypatch):
    monkeypatch.setattr(engine_module, "token_price", lambda context, unit: 1.0)
    with pytest.raises(AssertionError, match="chunks of"):
        test_a_long_prompts_chunks_shrink_as_its_context_grows(world, monkeypatch)


@pytest.mark.parametrize(
    ("dims", "int8", "unit"),
    [
        ((1536, 8960, 12, 2, 128), True, 4760),  # Qwen2.5-Coder 1.5B, fast
        ((576, 1536, 9, 3, 64), False, 3072),  # SmolLM2-135M, exact
    ],
)
def test_the_context_at_which_attention_costs_what_the_linears_do(dims, int8, unit):
    from specdecode.engine.prefill_price import context_unit, token_price

    hidden, intermediate, heads, kv_heads, head_dim = dims
    cfg = SimpleNamespace(
        hidden_size=hidden, intermediate_size=intermediate, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim
    )
    assert context_unit(cfg, int8) == pytest.approx(unit, rel=0.01)
    assert token_price(0, unit) == 1.0 and token_price(2 * unit, unit) == 3.0


def test_the_default_budget_follows_the_device():
    assert EngineConfig().max_num_batched_tokens == 32
    assert EngineConfig(device="cuda:1").max_num_batched_tokens == 2048
    assert EngineConfig(max_num_batched_tokens=64).max_num_batched_tokens == 64


@pytest.mark.parametrize("command", ["generate", "serve", "bench"])
def test_the_flag_reaches_the_llm(command):
    from specdecode.cli import build_parser
    from specdecode.llm_args import llm_kwargs

    parser = build_parser()
    assert llm_kwargs(parser.parse_args([command, "--max-num-batched-tokens", "64"]))["max_num_batched_tokens"] == 64
    assert llm_kwargs(parser.parse_args([command]))["max_num_batched_tokens"] is None  # the device's default
