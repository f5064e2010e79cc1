"""A draft-model pair priced at load: what `goodput` cannot learn cheaply once requests run.

Online, a fresh controller knows neither how often a draft model agrees with its target nor what a steady draft
step costs. Its acceptance prior (0.5, 0.45, ...) does not pay for drafts that cost a third of a target step, and
the probes that would show otherwise are dear (a draft model idle for a while first catches up on every token
since), so `goodput` kept the Qwen2.5-Coder pair at K = 0 although the 0.5B is right ~75% of the time on code.

The probe: the target writes `new_tokens` tokens greedily after a prompt (its own text, as in service); the draft
reads the prompt and that text teacher-forced, in one forward, and the share of written positions where its top
token is the target's is its greedy acceptance rate on that text (kept too, position by position, with the draft's
top probability there: where a drafter that stops when unsure would have stopped, which `goodput` would otherwise
learn only from its own drafts); that forward's time per token prices a catch-up
(the draft reading a prompt). A few one-token draft forwards after it time a steady draft step, and as many,
taking turns with them, as if LONG_CONTEXT tokens were cached (the cache's values do not change what attention
costs) price what each cached token adds to a drafted one. Two more timings, after the same trick: a steady step
of PROBE_ROWS rows at once prices what each row adds to a draft step (timed at batch 1 only, the 0.5B was priced
at ~32 ms a step of 8 rows at 2,048 tokens where it took ~68, and `goodput` had all 8 rows of a batch draft at
once); and READ_TOKENS tokens read after READ_CONTEXT cached ones price what each cached token adds to a token
read (a catch-up's queries attend to the whole cache: the probe's ~1.1 ms a token, read after ~100 tokens, was
~3.3 ms at 2,048). About a second and a half on the 1.5B pair; `GoodputController.seed_pair` takes the result as
a prior that the requests' own outcomes soon outweigh.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from specdecode.models.llama import AttentionMetadata, LlamaModel

# Cached tokens of the second steady-step timing (or the draft's limit, where smaller): the default draft window,
# and far enough out that the draft's attention stands clear of the machine's noise (the 0.5B: 10.9 ms a step after
# the probe's 86 tokens, 21.9 after 8,192; at 2,048 the difference is a quarter of that).
LONG_CONTEXT = 8192
PROBE_ROWS = 4  # rows of the batched steady-step timing
READ_TOKENS = 32  # tokens of the long-context read timing (about a catch-up's: ~45 tokens a row on the pair)
READ_CONTEXT = 2048  # cached tokens before them (or the draft's limit, where smaller)


@dataclass(frozen=True)
class PairPrice:
    acceptance: float  # the share of the target's greedy tokens that are also the draft's top token
    draft_step_s: float  # median seconds of one steady one-token draft forward after the probe's text
    positions: int  # how many target tokens the acceptance was measured on
    # Seconds a token costs the draft to read (a catch-up): READ_TOKENS after the probe's text where read_context is
    # set, else its one forward over the prompt and text (a first timing of its shape: ~2.4 ms a token on the 0.5B
    # against ~1.1 once warm).
    draft_read_s: float = 0.0
    context: int = 0  # cached tokens of the draft_step_s timing (the probe's prompt and text)
    long_context: int = 0  # cached tokens of the draft_step_long_s timing (0: not timed)
    draft_step_long_s: float = 0.0  # median seconds of a steady one-token draft forward after long_context tokens
    rows: int = 0  # rows of the draft_step_rows_s timing (0: not timed)
    draft_step_rows_s: float = 0.0  # seconds of a steady draft forward of one token in each of `rows` rows (at
    # draft_step_s times what `rows_ratio` measured: never less than one row's)
    read_context: int = 0  # cached tokens before the draft_read_long_s timing (0: not timed)
    draft_read_long_s: float = 0.0  # seconds a token costs the draft to read after read_context cached tokens
    # At each written token: the draft's top probability there, and whether its top token was the target's (what
    # a confidence stop would do with its drafts: `GoodputController.bind_drafter`)
    confidences: tuple[float, ...] = ()
    agreed: tuple[bool, ...] = ()

    @property
    def steps(self) -> tuple[tuple[int, int, float], ...]:
        """(rows, cached tokens, seconds) of each steady draft step timed: `GoodputController.seed_pair`'s `steps`."""
        long = ((1, self.long_context, self.draft_step_long_s),) if self.long_context else ()
        rows = ((self.rows, self.context, self.draft_step_rows_s),) if self.rows else ()
        return ((1, self.context, self.draft_step_s), *long, *rows)

    @property
    def reads(self) -> tuple[tuple[int, float], ...]:
        """(cached tokens a token read sees on average, seconds a token) of each reading timed:
        `GoodputController.seed_pair`'s `reads`."""
        if not self.read_context:
            return ((self.context // 2, self.draft_read_s),)
        half = READ_TOKENS // 2
        return ((self.context + half, self.draft_read_s), (self.read_context + half, self.draft_read_long_s))


def forward_one_row(model: LlamaModel, cache, tokens: list[int], start: int) -> torch.Tensor:
    """Cache `tokens` after `start` cached ones in slot 0; logits [len(tokens), vocab]."""
    ids = torch.tensor([tokens], dtype=torch.long, device=model.device)  # [1, T]
    meta = AttentionMetadata.build([0], [start], len(tokens), model.device)
    return model(ids, meta, cache)[0]  # [T, vocab]


def forward_rows(model: LlamaModel, cache, token: int, rows: int, start: int) -> None:
    """Cache `token` after `start` cached tokens in each of slots 0..rows-1 (one forward of [rows, 1])."""
    ids = torch.full((rows, 1), token, dtype=torch.long, device=model.device)  # [rows, 1]
    model(ids, AttentionMetadata.build(list(range(rows)), [start] * rows, 1, model.device), cache)


def greedy_continuation(target: LlamaModel, prompt_ids: list[int], new_tokens: int) -> list[int]:
    """The target's greedy next `new_tokens` tokens after prompt_ids, one forward each after the prompt's."""
    cache = target.new_cache(1, len(prompt_ids) + new_tokens + 1)
    out = [int(forward_one_row(target, cache, prompt_ids, 0)[-1].argmax())]
    while len(out) < new_tokens:
        out.append(int(forward_one_row(target, cache, out[-1:], len(prompt_ids) + len(out) - 1)[-1].argmax()))
    return out


@torch.inference_mode()
def probe_pair(
    target: LlamaModel, draft: LlamaModel, prompt_ids: list[int], new_tokens: int = 32, repeats: int = 7
) -> PairPrice:
    """Price the pair on prompt_ids (see the module's docstring)."""
    if not prompt_ids or new_tokens < 1:
        raise ValueError("probe_pair needs a prompt and at least one new token")
    written = greedy_continuation(target, prompt_ids, new_tokens)
    text = prompt_ids + written
    limit = getattr(getattr(draft, "cfg", None), "context_limit", LONG_CONTEXT + repeats + 1)
    long_context = min(LONG_CONTEXT, limit - repeats - 1)
    read_context = min(READ_CONTEXT, limit - READ_TOKENS)
    cache = draft.new_cache(1, max(len(text), long_context + repeats, read_context + READ_TOKENS) + 1)
    t0 = time.perf_counter()
    logits = forward_one_row(draft, cache, text[:-1], 0)  # [P + N - 1, vocab]: position i predicts token i + 1
    read_s = (time.perf_counter() - t0) / (len(text) - 1)
    top, guess = logits[len(prompt_ids) - 1 :].float().softmax(-1).max(-1)  # [N] each, at each written token
    agreed = tuple(g == w for g, w in zip(guess.tolist(), written, strict=True))
    # A draft whose context is no longer than the probe's text is timed there only.
    starts = [len(text) - 1] + ([long_context] if long_context > len(text) else [])
    step_s, *long_s = steady_steps(draft, cache, written[-1], starts, repeats)
    long = (long_context, long_s[0]) if long_s else (0, 0.0)
    rows_s = step_s * max(rows_ratio(draft, written[-1], PROBE_ROWS, len(text), repeats), 1.0)
    reading = (0, 0.0)
    if read_context > len(text):  # timed as the long one is, so that only the context differs between the two
        read_s = read_after(draft, cache, text, len(text))
        reading = (read_context, read_after(draft, cache, text, read_context))
    return PairPrice(
        sum(agreed) / len(written),
        step_s,
        len(written),
        read_s,
        len(text),
        *long,
        PROBE_ROWS,
        rows_s,
        *reading,
        confidences=tuple(top.tolist()),
        agreed=agreed,
    )


def rows_ratio(draft: LlamaModel, token: int, rows: int, start: int, repeats: int) -> float:
    """How many times a one-row step a one-token draft forward in each of `rows` rows costs, after `start` cached
    tokens: the medians of the two, timed in turns (timed apart, a machine's drift put four rows at 1.2x one in one
    probe and 1.7x in the next); in a cache of its own, left at zeros (what a step costs does not depend on the
    cached values)."""
    cache = draft.new_cache(rows, start + repeats + 2)
    one, many = medians_in_turns(
        [lambda r, n=n: forward_rows(draft, cache, token, n, start + r) for n in (1, rows)], repeats
    )
    return many / one


def read_after(draft: LlamaModel, cache, text: list[int], context: int) -> float:
    """Seconds a token costs the draft to read READ_TOKENS of `text`'s tokens after `context` cached ones (the
    cache past the probe's text holds whatever the steady steps left: its values do not change the cost)."""
    tokens = (text * (READ_TOKENS // len(text) + 1))[:READ_TOKENS]
    times = []
    for _ in range(2):  # the faster of two: the first may build the kernels for a forward of this many tokens
        t0 = time.perf_counter()
        forward_one_row(draft, cache, tokens, context)
        times.append(time.perf_counter() - t0)
    return min(times) / READ_TOKENS


def steady_steps(draft: LlamaModel, cache, token: int, starts: list[int], repeats: int) -> list[float]:
    """Median seconds of a one-token draft forward after each of `starts` cached tokens, the contexts taking
    turns (`medians_in_turns`)."""
    return medians_in_turns([lambda r, s=s: forward_one_row(draft, cache, [token], s + r) for s in starts], repeats)


def medians_in_turns(forwards: list[Callable[[int], object]], repeats: int) -> list[float]:
    """Median seconds of each forward(r) for r = 1..repeats, the forwards taking turns (a machine's drift then
    hits them alike), after one untimed forward(0) of each (a warm-up)."""
    times: list[list[float]] = [[] for _ in forwards]
    for r in range(repeats + 1):
        for i, forward in enumerate(forwards):
            t0 = time.perf_counter()
            forward(r)
            times[i].append(time.perf_counter() - t0)
    return [statistics.median(ts[1:]) for ts in times]
