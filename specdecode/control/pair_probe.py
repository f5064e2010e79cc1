"""A draft-model pair priced at load: what `goodput` cannot learn cheaply once requests run.

Online, a fresh controller knows neither how often a draft model agrees with its target nor what a steady draft
step costs. Its acceptance prior (0.5, 0.45, ...) does not pay for drafts that cost a third of a target step, and
the probes that would show otherwise are dear (a draft model idle for a while first catches up on every token
since), so `goodput` kept the Qwen2.5-Coder pair at K = 0 although the 0.5B is right ~75% of the time on code.

The probe: the target writes `new_tokens` tokens greedily after a prompt (its own text, as in service); the draft
reads the prompt and that text teacher-forced, in one forward, and the share of written positions where its top
token is the target's is its greedy acceptance rate on that text; that forward's time per token prices a catch-up
(the draft reading a prompt). A few one-token draft forwards after it time a steady draft step, and as many,
taking turns with them, as if LONG_CONTEXT tokens were cached (the cache's values do not change what attention
costs) price what each cached token adds to a drafted one. About a second on the 1.5B pair;
`GoodputController.seed_pair` takes the result as a prior that the requests' own outcomes soon outweigh.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from specdecode.models.llama import AttentionMetadata, LlamaModel

# Cached tokens of the second steady-step timing (or the draft's limit, where smaller): the default draft window,
# and far enough out that the draft's attention stands clear of the machine's noise (the 0.5B: 10.9 ms a step after
# the probe's 86 tokens, 21.9 after 8,192; at 2,048 the difference is a quarter of that).
LONG_CONTEXT = 8192


@dataclass(frozen=True)
class PairPrice:
    acceptance: float  # the share of the target's greedy tokens that are also the draft's top token
    draft_step_s: float  # median seconds of one steady one-token draft forward after the probe's text
    positions: int  # how many target tokens the acceptance was measured on
    draft_read_s: float = 0.0  # seconds a token costs the draft in one forward over the prompt and text (a catch-up)
    context: int = 0  # cached tokens of the draft_step_s timing (the probe's prompt and text)
    long_context: int = 0  # cached tokens of the draft_step_long_s timing (0: not timed)
    draft_step_long_s: float = 0.0  # median seconds of a steady one-token draft forward after long_context tokens

    @property
    def steps(self) -> tuple[tuple[int, float], ...]:
        """(cached tokens, seconds) of each steady draft step timed: `GoodputController.seed_pair`'s `steps`."""
        long = ((self.long_context, self.draft_step_long_s),) if self.long_context else ()
        return ((self.context, self.draft_step_s), *long)


def forward_one_row(model: LlamaModel, cache, tokens: list[int], start: int) -> torch.Tensor:
    """Cache `tokens` after `start` cached ones in slot 0; logits [len(tokens), vocab]."""
    ids = torch.tensor([tokens], dtype=torch.long, device=model.device)  # [1, T]
    meta = AttentionMetadata.build([0], [start], len(tokens), model.device)
    return model(ids, meta, cache)[0]  # [T, vocab]


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
    cache = draft.new_cache(1, max(len(text), long_context) + repeats + 1)
    t0 = time.perf_counter()
    logits = forward_one_row(draft, cache, text[:-1], 0)  # [P + N - 1, vocab]: position i predicts token i + 1
    read_s = (time.perf_counter() - t0) / (len(text) - 1)
    guesses = logits[len(prompt_ids) - 1 :].argmax(-1).tolist()  # [N] the draft's guess at each written token
    agree = sum(g == w for g, w in zip(guesses, written, strict=True))
    # A draft whose context is no longer than the probe's text is timed there only.
    starts = [len(text) - 1] + ([long_context] if long_context > len(text) else [])
    step_s, *long_s = steady_steps(draft, cache, written[-1], starts, repeats)
    long = (long_context, long_s[0]) if long_s else (0, 0.0)
    return PairPrice(agree / len(written), step_s, len(written), read_s, len(text), *long)


def steady_steps(draft: LlamaModel, cache, token: int, starts: list[int], repeats: int) -> list[float]:
    """Median seconds of a one-token draft forward after each of `starts` cached tokens, the contexts taking
    turns (a machine's drift then hits them alike), after one untimed warm-up forward at each."""
    times: list[list[float]] = [[] for _ in starts]
    for r in range(repeats + 1):
        for i, start in enumerate(starts):
            t0 = time.perf_counter()
            forward_one_row(draft, cache, [token], start + r)
            times[i].append(time.perf_counter() - t0)
    return [statistics.median(ts[1:]) for ts in times]
