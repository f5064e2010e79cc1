"""An independent draft model sharing the target's vocabulary, drafting autoregressively on its own cache."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from specdecode.config import MAX_SPECULATIVE_TOKENS, ConfigError
from specdecode.drafters.base import DrafterBase, Proposal
from specdecode.drafters.catch_up import share_budget
from specdecode.drafters.draft_window import SINK, DraftWindow
from specdecode.drafters.lookup_first import merge
from specdecode.drafters.ngram import NgramDrafter
from specdecode.drafters.subset_head import VOCAB_FILE, SubsetLMHead, load_subset
from specdecode.models.attention import kernel_piece
from specdecode.models.compiled import load_target
from specdecode.models.llama import LlamaModel, StepFunctions
from specdecode.models.shipped_draft import DRAFT_ASSETS
from specdecode.step.runner import forward_ragged
from specdecode.step.sequence import Sequence
from specdecode.verify.sampling import PAD_TOKEN_ID, SamplingTensors, draft_probs
from specdecode.verify.streams import Purpose, sample


def draft_confidence(logits: torch.Tensor, q: torch.Tensor, st: SamplingTensors) -> torch.Tensor:
    """[num_seqs] the draft's top probability for the next token, before it is drawn.

    For greedy rows that is the proposed token's probability under the raw softmax (q itself is one-hot). For
    sampled rows it is max q, not q(drawn token): a cut that looked at the drawn token would bias which drafts
    reach verification and break losslessness; one decided from q alone does not.
    logits: [num_seqs, vocab], q: [num_seqs, vocab] processed.
    """
    top_raw = logits.float().softmax(-1).amax(-1)  # [num_seqs]
    return top_raw if st.all_greedy else torch.where(st.temperature == 0.0, top_raw, q.amax(-1))


def subset_drafts(small: torch.Tensor, subset: torch.Tensor) -> torch.Tensor:
    """Greedy drafts [num_seqs] from a drafting vocabulary's logits [num_seqs, S]: the token ids of their argmax."""
    return subset[small.argmax(-1)]


def load_draft(
    draft_dir: Path,
    device: str | torch.device,
    dtype: torch.dtype,
    enforce_eager: bool,
    gguf: Path | None = None,
    arithmetic: str = "fast",
    vocab: Path | None = None,
    weights: str = "q4_0",
    kv_cache_dtype: str = "auto",
) -> LlamaModel:
    """The draft model as the engine runs it: on a compiled step like the target's (models/compiled.py; a small
    draft's eager step is mostly call overhead: SmolLM2's 2-layer draft took 4.8 ms eager, 3.0 ms compiled on
    a 2-core AMD EPYC), and with a drafting vocabulary (`vocab`, a .npy of token ids; see drafting_vocabulary)
    scoring only that subset. gguf: load it from this file with its blocks kept (as load_target), in
    `arithmetic` (fast by default, as SpeculativeConfig.draft_arithmetic), its linears requantized to Q4_0 where
    that reads fewer bytes (`weights`, as SpeculativeConfig.draft_weights; models/requantize.py)."""
    model = load_target(
        draft_dir,
        device,
        dtype,
        enforce_eager,
        role="draft",
        gguf=gguf,
        arithmetic=arithmetic,
        weights=weights,
        kv_cache_dtype=kv_cache_dtype,
    )
    if vocab is not None:
        use_subset(model, load_subset(vocab, model.cfg.vocab_size))
    return model


def use_subset(model: LlamaModel, subset: torch.Tensor) -> None:
    """Make `model` score only the token ids `subset` [S], in its eager and compiled forwards alike."""
    SubsetLMHead.install(model, subset)
    model.step = with_head(model.step, model.head)  # a compiled head scores the whole vocabulary


def drafting_vocabulary(draft: str, draft_dir: Path, setting: str | None) -> Path | None:
    """The .npy of token ids the draft `draft` (a name or path, loaded from draft_dir) drafts from, or None for
    the whole vocabulary. setting (SpeculativeConfig.draft_vocab): a path, or "full"; None takes the vocab.npy
    beside the draft (a distilled draft's, train/export.py), else the one shipped for a built-in draft
    (assets/drafts/NAME.vocab.npy), else the whole vocabulary."""
    if setting == "full":
        return None
    if setting is not None:
        if not Path(setting).is_file():
            raise ConfigError(f"--draft-vocab {setting}: no such file (a .npy of token ids, or 'full')")
        return Path(setting)
    for path in (draft_dir / VOCAB_FILE, DRAFT_ASSETS / f"{draft}.{VOCAB_FILE}"):
        if path.is_file():
            return path
    return None


def with_head(step: StepFunctions, head) -> StepFunctions:
    """`step` with `head` in place of its LM head, in its large-forward twin too."""
    large = None if step.large is None else with_head(step.large, head)
    return dataclasses.replace(step, head=head, large=large)


class DraftModelDrafter(DrafterBase):
    """Proposes k tokens by sampling the draft's processed distribution q (argmax for greedy rows)."""

    retryable_propose = True  # propose starts from the committed cache (drafters/base.py)

    def __init__(
        self,
        model: LlamaModel,
        max_num_seqs: int,
        max_len: int,
        prefill_budget: int = 512,
        stop_below: float = 0.0,
        window: int = 0,
        lookup: NgramDrafter | None = None,
    ) -> None:
        self.model = model
        self.lookup = lookup  # rows whose own text predicts them draft from it instead (lookup_first.py)
        self.held: set[str] = set()  # rows whose drafts come from the lookup alone this step (`hold_model`)
        self.stop_below = stop_below  # a row stops drafting after a draft whose confidence is below this
        # window: recent tokens the draft attends to besides the sink (draft_window.py); 0, or a window whose
        # cache would be no shorter than the whole context, reads everything
        self.window = DraftWindow(window, MAX_SPECULATIVE_TOKENS, prefill_budget) if window else None
        if self.window is not None and self.window.capacity >= max_len:
            self.window = None
        self.cache = model.new_cache(max_num_seqs, max_len if self.window is None else self.window.capacity)
        self.prefill_budget = prefill_budget
        self.slots: dict[str, int] = {}
        self.shift = [0] * max_num_seqs  # per slot: a cached token's position less its cache index, past the sink
        # A drafting vocabulary's head can score its tokens alone: greedy drafts need only its argmax and top
        # probability, not the full vocabulary's logits and one-hot q (compact_drafts)
        self.subset_head = model.lm_head if isinstance(model.lm_head, SubsetLMHead) else None

    def add_sequence(self, seq: Sequence) -> None:
        slot = self.slots[seq.request_id] = self.cache.allocate()  # the prompt is fed by _catch_up, a chunk a step
        self.shift[slot] = 0
        if self.lookup is not None:
            self.lookup.add_sequence(seq)

    def hold_model(self, request_ids: set[str]) -> None:
        """Until the step's commit, the rows of `request_ids` draft from the lookup alone: the model neither reads nor
        drafts for them, and a row the lookup finds nothing for has no drafts. A controller holds the rows whose
        reading would cost the draft model more than its drafts could save (a long prompt it has not read), so that
        their lookups, free, still run. Needs a lookup."""
        if self.lookup is None:
            raise ValueError("hold_model needs a draft model with a prompt lookup")
        self.held = set(request_ids)

    def remove_sequence(self, seq: Sequence) -> None:
        self.held.discard(seq.request_id)
        if self.lookup is not None:
            self.lookup.remove_sequence(seq)
        slot = self.slots.pop(seq.request_id, None)
        if slot is not None:
            self.cache.free(slot)

    def live_request_ids(self) -> set[str]:
        return set(self.slots) | self.held | (self.lookup.live_request_ids() if self.lookup is not None else set())

    def _backlog(self, seq: Sequence, slot: int) -> int:
        """Tokens of seq past what the slot's cache covers (its cached tokens, and those a window skipped)."""
        return len(seq.token_ids) - min(self.cache.lengths[slot] + self.shift[slot], len(seq.token_ids))

    def unread(self, seq: Sequence) -> int:
        slot = self.slots.get(seq.request_id)
        if slot is None:
            return len(seq.token_ids)
        backlog = self._backlog(seq, slot)
        return backlog if self.window is None else self.window.to_read(self.cache.lengths[slot], backlog)

    def commit(self, seqs: list[Sequence]) -> None:
        self.held = set()  # a hold lasts one step (`hold_model`): a controller that never holds finds none
        self._keep_verified(seqs)

    def _keep_verified(self, seqs: list[Sequence]) -> None:
        # The draft cached pending + its own drafts; only those the target kept stay valid.
        for s in seqs:
            slot = self.slots[s.request_id]
            kept = min(self.cache.lengths[slot], s.num_cached - self.shift[slot])
            if self.shift[slot] and kept < SINK:  # cut back past a skip (a rewind): read the row afresh
                kept, self.shift[slot] = 0, 0
            self.cache.set_length(slot, kept)

    def _feed(self, slots: list[int], rows: list[int], tokens: list[list[int]]) -> torch.Tensor:
        """Cache tokens[i] after row rows[i]'s cached ones; the logits after each row's last token [rows, 1, vocab]."""
        picked = [slots[b] for b in rows]
        shift = None if self.window is None else [self.shift[s] for s in picked]
        logits = forward_ragged(self.model, self.cache, picked, tokens, last_only=True, shift=shift)
        for slot, t in zip(picked, tokens, strict=True):
            self.cache.set_length(slot, self.cache.lengths[slot] + len(t))
        return logits

    def _feed_pieces(self, slots: list[int], rows: list[int], tokens: list[list[int]]) -> torch.Tensor:
        """`_feed` in forwards of at most `kernel_piece` tokens a row, where the attention kernel serves: a
        catch-up's reading then goes through the few-queries kernel rather than SDPA, at ~half the price a token
        after thousands of cached tokens (models/attention.py). Returns each row's logits after its last token
        [rows, 1, vocab]. A draft's logits need no exactness: the target verifies every draft."""
        piece = kernel_piece(self.model.device, self.model.dtype) or max(map(len, tokens))
        out: list[torch.Tensor | None] = [None] * len(rows)
        for start in range(0, max(map(len, tokens)), piece):
            part = [i for i, t in enumerate(tokens) if len(t) > start]  # rows with tokens left
            logits = self._feed(slots, [rows[i] for i in part], [tokens[i][start : start + piece] for i in part])
            for j, i in enumerate(part):
                out[i] = logits[j]
        return torch.stack(out)  # [rows, 1, vocab]

    def _skip_and_cap(self, seqs: list[Sequence], slots: list[int], num_tokens: list[int]) -> list[int]:
        """Each row's backlog to read this step (0 for rows not asked to draft); a window first skips what it
        will never read and holds a row short of its sink to the sink."""
        backlogs = []
        for seq, slot, k in zip(seqs, slots, num_tokens, strict=True):
            backlog = self._backlog(seq, slot) if k else 0
            if self.window is not None and backlog:
                length = self.cache.lengths[slot]
                skipped = self.window.skip(length, backlog)
                self.shift[slot] += skipped
                backlog = self.window.feed_cap(length, backlog - skipped)
            backlogs.append(backlog)
        return backlogs

    def _make_room(self, slots: list[int], feeds: list[int]) -> None:
        """Slide every slot that could not take its feed (catch-up and drafts) down to its sink and last window."""
        if self.window is None:
            return
        window = self.window.window
        for slot, feed in zip(slots, feeds, strict=True):
            length = self.cache.lengths[slot]
            if feed and self.window.needs_slide(length, feed):
                first = length - window - SINK  # the window's first token, counted from the sink's end
                self.cache.compact(slot, SINK, list(range(first, first + window)))
                self.shift[slot] += length - window - SINK
                self.cache.set_length(slot, SINK + window)

    def _catch_up(
        self, seqs: list[Sequence], slots: list[int], num_tokens: list[int], width: int | None = None
    ) -> tuple[torch.Tensor, list[int]]:
        """Feed the rows asked to draft what the draft has not seen (the prompt, the pending token, the bonus token
        after a full accept), within one prefill chunk (catch_up.py). Returns the logits after each row's last
        token [num_seqs, 1, width] (width: a compact head's subset, by default the vocabulary) and the drafts each
        row may make: 0 for rows still catching up."""
        width = width or self.model.cfg.vocab_size
        backlogs = self._skip_and_cap(seqs, slots, num_tokens)
        take = share_budget(backlogs, self.prefill_budget)
        self._make_room(slots, [n + k for n, k in zip(take, num_tokens, strict=True)])
        rows = [b for b, n in enumerate(take) if n]
        logits = torch.zeros((len(seqs), 1, width), device=self.model.device)  # [num_seqs, 1, width]
        if rows:
            starts = [self.cache.lengths[slots[b]] + self.shift[slots[b]] for b in rows]  # first unread token
            feed = [seqs[b].token_ids[n : n + take[b]] for b, n in zip(rows, starts, strict=True)]
            logits[rows] = self._feed_pieces(slots, rows, feed).float()
        # A row drafts once it has read everything: its whole backlog fed, and nothing held back behind its sink.
        read = [self._backlog(s, slot) == 0 for s, slot in zip(seqs, slots, strict=True)]
        return logits, [k if done else 0 for k, done in zip(num_tokens, read, strict=True)]

    def _stop_unsure(self, num_tokens: list[int], confidence: torch.Tensor, j: int) -> list[int]:
        """Rows whose draft j has confidence [num_seqs] below `stop_below` keep it and draft no further: the
        forwards a doubtful continuation would cost are saved (HF's assistant_confidence_threshold). Draft j is
        verified either way; only whether drafts past it are made depends on it, so the rejection sampling of
        every draft made stays exact."""
        unsure = (confidence < self.stop_below).tolist()
        return [min(n, j + 1) if u else n for n, u in zip(num_tokens, unsure, strict=True)]

    def compact_drafts(self, st: SamplingTensors) -> bool:
        """Whether this batch drafts from the subset's logits alone: a drafting vocabulary, every row greedy and
        nothing adjusting the logits (penalties, logit_bias, grammars see the whole vocabulary). The drafts are
        the ones the full logits give (the subset is ascending, so ties break to the lowest id alike); the
        subset's softmax is the full one's (exp(-inf) = 0), summed over fewer terms."""
        return self.subset_head is not None and st.all_greedy and st.adjust is None

    def _next_draft(
        self, logits: torch.Tensor, tokens: list[torch.Tensor], st: SamplingTensors, j: int, compact: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """From the logits after each row's last token [num_seqs, 1, width]: the next drafts [num_seqs], the q they
        were drawn from [num_seqs, vocab] (None when compact) and their confidences [num_seqs]."""
        if compact:
            small = logits[:, 0]  # [num_seqs, S]
            return subset_drafts(small, self.subset_head.head.subset), None, small.softmax(-1).amax(-1)
        q = draft_probs(logits, tokens, st)  # [num_seqs, vocab], penalties etc. as the target's
        tok = q.argmax(-1) if st.all_greedy else sample(q, st, Purpose.DRAFT, j)  # [num_seqs]
        return tok, q, draft_confidence(logits[:, 0], q, st)

    @torch.inference_mode()
    def propose(self, seqs: list[Sequence], num_tokens: list[int], st: SamplingTensors) -> Proposal:
        compact = self.compact_drafts(st)
        if self.subset_head is not None:
            self.subset_head.compact = compact
        try:
            return self._propose(seqs, num_tokens, st, compact)
        finally:
            if self.subset_head is not None:
                self.subset_head.compact = False  # the model's other callers (the load probe) see full logits

    def _propose(self, seqs: list[Sequence], num_tokens: list[int], st: SamplingTensors, compact: bool) -> Proposal:
        if self.lookup is None:
            return self._propose_model(seqs, num_tokens, st, compact)
        found = self.lookup.propose(seqs, num_tokens, st)
        hits = found.num_tokens.tolist()  # [num_seqs] the model's rows: no lookup hit, not held
        asked = [0 if n or s.request_id in self.held else k for s, n, k in zip(seqs, hits, num_tokens, strict=True)]
        return merge(self._propose_model(seqs, asked, st, compact), found, self.model.cfg.vocab_size)

    def _propose_model(
        self, seqs: list[Sequence], num_tokens: list[int], st: SamplingTensors, compact: bool
    ) -> Proposal:
        device = self.model.device
        slots = [self.slots[s.request_id] for s in seqs]
        self._keep_verified(seqs)  # drafts of a proposal never committed (the engine retried the step) are forgotten
        width = len(self.subset_head.head.subset) if compact else self.model.cfg.vocab_size
        logits, num_tokens = self._catch_up(seqs, slots, num_tokens, width)  # [num_seqs, 1, width]
        k = max(num_tokens, default=0)
        if k == 0:
            return Proposal.from_lists([[] for _ in seqs], 0, device)
        tokens, probs, confidence = [], [], []
        for j in range(k):
            tok, q, conf = self._next_draft(logits, tokens, st, j, compact)
            tokens.append(tok)
            probs.append(q)
            confidence.append(conf)
            if self.stop_below > 0.0:
                num_tokens = self._stop_unsure(num_tokens, confidence[-1], j)
            # Only rows that still draft feed their draft: each row's cache grows by its own count, never past it.
            rows = [b for b, n in enumerate(num_tokens) if j + 1 < n]
            if not rows:
                break
            logits[rows] = self._feed(slots, rows, [[t] for t in tok[rows].tolist()]).float()
        k = len(tokens)  # fewer than asked when every row stopped early
        token_ids = torch.stack(tokens, dim=1)  # [num_seqs, k]
        num = torch.tensor(num_tokens, dtype=torch.long, device=device)  # [num_seqs]
        token_ids = token_ids.masked_fill(torch.arange(k, device=device)[None] >= num[:, None], PAD_TOKEN_ID)
        q_all = None if st.all_greedy else torch.stack(probs, dim=1)  # [num_seqs, k, vocab]
        return Proposal(token_ids, num, q_all, torch.stack(confidence, dim=1))  # confidence [num_seqs, k]
