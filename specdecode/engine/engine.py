"""The step loop. A decode step reads as four verbs: propose -> verify -> commit -> control.

Requests wait in a queue, take a cache slot when one is free, are prefilled in chunks, then decode together in
a ragged batch and leave as they finish. K = 0 is plain autoregressive decoding through the same path. A step
runs at most `max_num_batched_tokens` target tokens (vLLM's chunked prefill): the running requests' decode and
verify tokens first, then prompt chunks from the rest, so a long prompt arriving never freezes the others; with
nobody decoding, prompts prefill IDLE_PREFILL_TOKENS (or the budget, if larger) a step. The chunks ride in the
verify forward as rows of its width (`chunk_rows`, `_verify`): each step reads the weights once, not once for the
decoding rows and again for the prompts.

A failure that belongs to one request fails that request alone (finish reason "error", the message on
`Sequence.error`) and releases its state; the others of the step go on with the tokens they would have had
without it. The stages a request can break on its own (its sampling parameters and logit adjustments, its
drafts, its scoring and verification, its commit: grammar, stop strings, detokenization, and non-finite
values in its own rows of logits) run for the batch, and when a batched stage raises it is run again row by
row to find the rows it fails for. Only an error that every row hits alone (the shared forward itself)
leaves the step, and then the caller fails the batch (server/async_engine.py) or aborts its requests (llm.py).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, replace

import torch

from specdecode.config import IDLE_PREFILL_TOKENS, MIN_PREFILL_TOKENS, ConfigError, EngineConfig, SamplingParams
from specdecode.control.base import Controller, StepStats
from specdecode.detokenize import IncrementalDetokenizer, find_stop, stop_holdback
from specdecode.drafters.base import Drafter, Proposal
from specdecode.engine.logprobs import emitted_logprobs
from specdecode.engine.prefill_price import context_unit, has_int8_linears, token_price
from specdecode.models.llama import AttentionMetadata, LlamaModel, packs_rows
from specdecode.models.ragged import pad_groups, verify_tokens
from specdecode.step.runner import PAD_SLACK, forward_ragged
from specdecode.step.sequence import Sequence, Status, TokenLogprob, mean_context
from specdecode.verify.chain import VerifyResult, verify
from specdecode.verify.logits_adjust import LogitAdjuster, chain_paths, tree_paths
from specdecode.verify.sampling import SamplingTensors, non_finite_flags, processed_logprobs
from specdecode.verify.tree import verify_tree
from specdecode.verify.tree_layout import tree_layout


@dataclass
class Verified:
    """The verify step's result, plus what commit needs: where each row started and the target's features."""

    result: VerifyResult
    starts: list[int]  # target-cache length of each row before the step
    hidden: torch.Tensor | None  # [num_seqs, k + 1, hidden] post-norm features, when the drafter reads them
    logprobs: list[list[TokenLogprob] | None]  # per row, of each emitted token, when the request asked
    broken: torch.Tensor  # [num_seqs] bool: the row's own logits held NaN or +inf (verified as zeros, not kept)
    chunk_hidden: torch.Tensor | None = None  # [chunk rows, k + 1, hidden] of the prompt chunks that rode along


Chunk = tuple[Sequence, list[int]]  # a prompt chunk to cache this step: its request, and the tokens from num_prefilled


def chunk_rows(chunks: list[Chunk], width: int) -> list[tuple[Sequence, int, list[int]]]:
    """Each chunk cut into rows of `width` tokens on its request's slot, (request, first position, tokens) each: in
    one forward a row attends to the rows before it on the same slot, whose K/V the attention op writes first."""
    return [
        (seq, seq.num_prefilled + i, tokens[i : i + width])
        for seq, tokens in chunks
        for i in range(0, len(tokens), width)
    ]


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's parameters and buffers (a quantized model's blocks are buffers): what a forward of its
    own reads again."""
    tensors = {id(t): t for t in [*model.parameters(), *model.buffers()]}  # tied tensors once
    return sum(t.numel() * t.element_size() for t in tensors.values())


def quarantine(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [num_seqs, n, vocab] with every row that holds NaN or +inf set to zeros, and those rows [num_seqs].

    Such a row is one request's failure (its own logit bias, say), not the batch's: the others verify as they
    would have, and the engine fails that request alone. -inf is a token that may not follow (a grammar's mask).
    """
    flags = non_finite_flags(logits)
    broken = torch.tensor(flags, dtype=torch.bool, device=logits.device)  # [num_seqs]
    return (logits.masked_fill(broken[:, None, None], 0.0) if any(flags) else logits), broken


@dataclass
class SeqUpdate:
    """What one step produced for one sequence (streaming consumers read these)."""

    seq: Sequence
    new_token_ids: list[int]
    new_text: str
    finished: bool
    new_logprobs: list[TokenLogprob] | None = None  # one per new token, when the request asked for logprobs


def sampling_tensors(seqs: list[Sequence], device: torch.device | str, vocab: int) -> SamplingTensors:
    # Each row's pending-token position keys its seeded random streams (specdecode/verify/streams.py).
    params = [s.params for s in seqs]
    st = SamplingTensors.from_params(params, device, [s.num_cached for s in seqs])
    prompts, outputs = [s.prompt_ids for s in seqs], [s.output_ids for s in seqs]
    st.adjust = LogitAdjuster.build(params, prompts, outputs, [s.grammar for s in seqs], vocab, device)
    return st


def check_params(params: SamplingParams, vocab: int, tokenizer, eos_ids: list[int], grammars=None):
    """What a request's sampling parameters need of the model: bias keys in the vocabulary, a schema that compiles
    (into `grammars`, a GrammarCompiler made here on first use and returned, so the schema is compiled once)."""
    if params.logit_bias and max(params.logit_bias) >= vocab:
        raise ConfigError(f"logit_bias keys must be token ids in 0..{vocab - 1}, got {max(params.logit_bias)}")
    so = params.structured_outputs
    if so is not None:
        if grammars is None:
            from specdecode.grammar import GrammarCompiler  # the grammar library loads on first use

            grammars = GrammarCompiler(tokenizer, vocab, eos_ids)
        grammars.compile_json(None if so.json_object else so.json)  # an invalid schema fails here
    return grammars


class Engine:
    def __init__(
        self,
        target: LlamaModel,
        tokenizer,
        drafter: Drafter,
        controller: Controller,
        config: EngineConfig,
        k_max: int,
        max_model_len: int,
        eos_token_ids: set[int],
    ) -> None:
        self.target = target
        self.tokenizer = tokenizer
        self.drafter = drafter
        self.controller = controller
        controller.bind_drafter(drafter)
        self.config = config
        self.k_max = k_max
        self.max_model_len = max_model_len
        self.eos_token_ids = eos_token_ids
        self.device = target.device
        self.cache = target.new_cache(config.max_num_seqs, max_model_len)
        # Feature drafters (eagle, medusa, mtp) read the target's hidden states through observe_features().
        self._needs_features = drafter.needs_features
        # Prompt chunks ride in the verify forward (`_verify`), unless switched off or the target is sharded: the
        # tensor-parallel workers repeat LlamaModel forwards, not a body whose rows are scored apart.
        self._fused_prefill = config.fused_prefill and isinstance(target, LlamaModel)
        self._weight_bytes = weight_bytes(target) if self._fused_prefill else 0
        # beside decoding rows a prompt token counts at its price (prefill_price.py); the sharded target: unpriced
        self._context_unit = context_unit(target.cfg, has_int8_linears(target)) if isinstance(target, LlamaModel) else 0
        drafter.bind_target_cache(self.cache)  # drafters that read the target's own K/V (layer_skip)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._detok: dict[str, IncrementalDetokenizer] = {}
        self.last_step: StepStats | None = None
        self._grammars = None  # a GrammarCompiler, made on the first structured request (grammar.py)
        self.num_prefill_tokens = 0  # prompt tokens run through the target
        self.num_shared_prefill_tokens = 0  # prompt tokens a sample copied from its request's first sample

    # ---- requests -------------------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt_ids: list[int], params: SamplingParams) -> Sequence:
        """One request of one sample (n = 1); add_samples takes any n."""
        if params.n != 1:
            raise ConfigError(f"add_request takes n = 1 (got {params.n}); use add_samples")
        return self.add_samples(request_id, prompt_ids, params)[0]

    def add_samples(self, request_id: str, prompt_ids: list[int], params: SamplingParams) -> list[Sequence]:
        """params.n samples of one prompt, which share its prefill: samples 1..n-1 copy sample 0's prompt K/V.

        With a seed, sample i draws as a single request with seed + i would, so each is reproducible alone.
        """
        self.check_request(prompt_ids, params)  # compiles a schema into self._grammars, once per request
        so = params.structured_outputs
        grammar = None if so is None else self._grammars.compile_json(None if so.json_object else so.json)
        seqs = []
        for i in range(params.n):
            sample_params = replace(params, n=1, seed=None if params.seed is None else params.seed + i)
            rid = request_id if params.n == 1 else f"{request_id}/{i}"
            seq = Sequence(rid, list(prompt_ids), sample_params, self.max_model_len, group=request_id, index=i)
            seq.parent = seqs[0] if seqs else None
            if grammar is not None:
                seq.grammar = self._grammars.matcher(grammar)  # each sample walks the grammar on its own
            self._detok[rid] = IncrementalDetokenizer(self.tokenizer, prompt_ids)
            seqs.append(seq)
        self.waiting.extend(seqs)
        return seqs

    def check_request(self, prompt_ids: list[int], params: SamplingParams) -> None:
        """Everything add_samples refuses, refused here first (a server calls it before it answers 200)."""
        if not prompt_ids:
            raise ConfigError("empty prompt")
        if len(prompt_ids) >= self.max_model_len:
            raise ConfigError(
                f"prompt has {len(prompt_ids)} tokens but the context is {self.max_model_len}; "
                "shorten it or raise max_model_len"
            )
        vocab = self.target.cfg.vocab_size
        if min(prompt_ids) < 0 or max(prompt_ids) >= vocab:
            raise ConfigError(f"prompt token ids must be in 0..{vocab - 1}")
        self._grammars = check_params(params, vocab, self.tokenizer, sorted(self.eos_token_ids), self._grammars)

    def abort(self, request_id: str) -> None:
        """Abort a request: every sample of it (request_id is what add_request/add_samples were given)."""
        for seq in list(self.waiting):
            if seq.group == request_id:
                self.waiting.remove(seq)
                self._finish(seq, "abort")
                self._release(seq)
        for seq in self.running:
            if seq.group == request_id:
                self._finish(seq, "abort")
        self._retire_finished()

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def num_running(self) -> int:
        return len(self.running)

    # ---- the step -------------------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> list[SeqUpdate]:
        """One step within the token budget: the running requests decode and verify, and prompts are prefilled
        with the budget's rest, in the same target forward (or one of their own with nobody decoding, or with
        fused_prefill off). A request whose prefill ends here gets its first token next step."""
        self._failed: list[SeqUpdate] = []
        self._admit()
        decoding = [s for s in self.running if s.status is Status.RUNNING]
        self._verified_tokens = 0  # set by _decode: the target tokens its verify forward ran
        self._chunks_taken = False  # set by _decode when this step's prompt chunks rode in its forward
        updates = self._decode(decoding) if decoding else []
        if not self._chunks_taken:
            budget = self.config.max_num_batched_tokens - self._verified_tokens
            if not decoding:  # no stream waits on this step: prompts take the larger of the budget and an idle chunk
                budget = max(budget, IDLE_PREFILL_TOKENS)
            self._prefill_chunks(max(budget, MIN_PREFILL_TOKENS), priced=bool(decoding))
        self._retire_finished()  # after the controller observed the step, so nothing re-creates their state
        return self._failed + updates

    def _fail(self, seq: Sequence, error: BaseException | str) -> None:
        """Fail one request alone: finished with reason "error"; its state is released with the step's others."""
        seq.error = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        self._finish(seq, "error")
        self._failed.append(SeqUpdate(seq, [], "", True))

    def _isolated(self, seqs: list[Sequence], stage):
        """`stage(seqs)`, or when it raises: the rows it raises for alone are failed, and it runs again for the
        rest. Returns (the rows kept, its result for them; None when none is kept). The stages run here are the
        requests' own (sampling tensors, drafts): when every row fails alone each fails with its own error,
        and the requests not in the stage (waiting, prefilling) go on; a shared target forward is not run here."""
        try:
            return seqs, stage(seqs)
        except Exception:  # noqa: BLE001 - attributed to its rows below
            kept = []
            for seq in seqs:
                try:
                    stage([seq])
                    kept.append(seq)
                except Exception as e:  # noqa: BLE001 - this row's own failure
                    self._fail(seq, e)
            return (kept, stage(kept)) if kept else ([], None)

    def _admit(self) -> None:
        """Take waiting sequences into free slots, in order. A later sample of a request waits for sample 0's
        prefill, then copies its prompt K/V instead of computing it again."""
        for seq in list(self.waiting):
            if not self.cache.num_free:
                return
            parent = seq.parent
            if parent is not None and parent.status in (Status.WAITING, Status.PREFILLING):
                continue
            self.waiting.remove(seq)
            seq.slot = self.cache.allocate()
            seq.status = Status.PREFILLING
            self.running.append(seq)
            if parent is not None and parent.slot >= 0 and not self._needs_features:
                self._fork(parent, seq)

    def _fork(self, parent: Sequence, seq: Sequence) -> None:
        """seq starts decoding from a copy of parent's prompt K/V. Feature drafters (eagle, medusa, mtp) need the
        prompt's features too, which are consumed as they go: their samples prefill on their own."""
        n = seq.num_cached
        self.cache.copy_prefix(parent.slot, seq.slot, n)
        seq.num_prefilled = n
        self.cache.set_length(seq.slot, n)
        self.num_shared_prefill_tokens += n
        seq.status = Status.RUNNING
        self._add_to_drafter(seq)

    def _add_to_drafter(self, seq: Sequence) -> None:
        """The drafter's state for a request whose prompt is cached; its failure is this request's alone."""
        try:
            self.drafter.add_sequence(seq)
        except Exception as e:  # noqa: BLE001 - its drafter state: this request alone
            self._fail(seq, e)

    def _next_chunks(self, budget: int, priced: bool = True) -> list[Chunk]:
        """The next chunk of prompt[:-1] of each prefilling sequence, at most `budget` tokens in all, the prompts
        with the fewest tokens left first, then the oldest (a chunk may be empty: a prompt with nothing left to
        cache, which `_prefilled` starts decoding). Oldest-first kept a chat that arrived behind a long prompt
        waiting out all of its prefill: behind 16k tokens on the Qwen2.5-Coder 1.5B, ~200 s to its first token,
        and short streams that ended then were not replaced. A short prompt's few chunks delay the long one by
        as many tokens, and only the slots free for new requests bound how many there are.

        `priced` (requests decode beside the chunks): each token counts at its price after the context cached
        before its chunk (prefill_price.py), so a long prompt's late chunks are shorter and a step's prefill work
        stays about level; a chunk still takes one token at least."""
        picked = []
        prefilling = [s for s in self.running if s.status is Status.PREFILLING]
        for seq in sorted(prefilling, key=lambda s: s.num_cached - s.num_prefilled):  # stable: oldest among equals
            if budget <= 0:
                continue
            price = token_price(seq.num_prefilled, self._context_unit) if priced and self._context_unit else 1.0
            take = max(int(budget / price), 1)
            chunk = seq.prompt_ids[seq.num_prefilled : min(seq.num_prefilled + take, seq.num_cached)]
            budget -= len(chunk) * price
            picked.append((seq, chunk))
        return picked

    def _prefill_chunks(self, budget: int, priced: bool) -> None:
        """Cache the next prompt chunks (`_next_chunks`) in forwards of their own. A prompt cut anywhere gives the
        K/V it gives whole: each chunk attends to the cached ones.

        The last prompt token stays pending: the first decode step feeds it with the first drafts, so every
        output token, the first included, comes from one verification path. The drafter gets the request
        (add_sequence) once its whole prompt is cached; feature drafters see each chunk's features as it runs.
        """
        picked = self._next_chunks(budget, priced)
        chunks = [(seq, c) for seq, c in picked if c]
        hidden: list[torch.Tensor | None] = [None] * len(chunks)  # [len(chunk), hidden] each, for feature drafters
        for group in pad_groups([len(c) for _, c in chunks], PAD_SLACK):  # chunks of unlike lengths: separate forwards
            g_chunks = [chunks[i] for i in group]
            out = forward_ragged(
                self.target,
                self.cache,
                [s.slot for s, _ in g_chunks],
                [c for _, c in g_chunks],
                True,
                self._needs_features,
            )
            if self._needs_features:
                for b, i in enumerate(group):
                    hidden[i] = out[1][b, : len(chunks[i][1])]  # out[1]: [len(group), longest chunk, hidden]
        self._prefilled(picked, dict(zip((id(s) for s, _ in chunks), hidden, strict=True)))

    def _prefilled(self, chunks: list[Chunk], hidden: dict[int, torch.Tensor | None]) -> None:
        """Bookkeeping once `chunks` are cached: features to the drafter (hidden, by id of the request: [len(chunk),
        hidden] each), the cache lengths, and requests whose prompt is whole start decoding."""
        for seq, chunk in chunks:
            if chunk:
                self.num_prefill_tokens += len(chunk)
                if self._needs_features:
                    self.drafter.observe_features(seq, seq.num_prefilled, hidden[id(seq)])
            seq.num_prefilled += len(chunk)
            self.cache.set_length(seq.slot, seq.num_prefilled)
            if seq.num_prefilled == seq.num_cached:
                seq.status = Status.RUNNING
                self._add_to_drafter(seq)

    def _decode(self, seqs: list[Sequence]) -> list[SeqUpdate]:
        t0 = time.perf_counter()
        vocab = self.target.cfg.vocab_size
        seqs, st = self._isolated(seqs, lambda rows: sampling_tensors(rows, self.device, vocab))
        if not seqs:  # every row failed alone
            return []
        chosen = self._clamp_k(seqs, self.controller.choose(seqs, self.k_max))
        ks = {id(s): k for s, k in zip(seqs, chosen, strict=True)}
        batch = seqs

        def propose(rows: list[Sequence]) -> Proposal:
            rows_st = st if rows is batch else sampling_tensors(rows, self.device, vocab)  # seeded rows draw alike
            return self.drafter.propose(rows, [ks[id(s)] for s in rows], rows_st)

        if self.drafter.retryable_propose:  # propose
            seqs, proposal = self._isolated(seqs, propose)
            if not seqs:
                return []
        else:
            proposal = propose(seqs)
        if seqs is not batch:  # a row failed: the survivors' sampling tensors, without it
            st = sampling_tensors(seqs, self.device, vocab)
        proposal = self.controller.truncate(seqs, proposal)  # draft-side only: verification stays lossless
        t1 = time.perf_counter()
        chunks = self._riding_chunks(len(seqs), proposal.token_ids.shape[1] + 1)
        verified = self._verify(seqs, proposal, st, chunks)  # verify (and cache the prompt chunks)
        result = verified.result
        num_proposed = proposal.num_tokens.tolist()
        num_accepted = result.num_accepted.tolist()
        rows = result.output_token_ids.tolist()
        broken = verified.broken.tolist()  # rows whose own logits were not finite
        t2 = time.perf_counter()  # after the .tolist() syncs, so queued device work is counted
        context = mean_context(seqs)
        updates = []
        for b, (seq, row, k, a) in enumerate(zip(seqs, rows, num_proposed, num_accepted, strict=True)):  # commit
            if broken[b]:
                self._fail(seq, "the model's logits for this request were not finite (NaN or +inf)")
                continue
            seq.metrics.num_drafted += k
            seq.metrics.trees |= k > 0 and proposal.parents is not None
            seq.metrics.num_accepted += a
            seq.metrics.num_target_forwards += 1
            try:
                updates.append(self._append(seq, row[: a + 1], verified.logprobs[b]))
            except Exception as e:  # noqa: BLE001 - its grammar, stop strings or detokenizer: this request alone
                self._fail(seq, e)
        self._after_commit(seqs, verified)
        if self._chunks_taken:
            self._prefilled(
                chunks, self._chunk_features(chunks, verified.chunk_hidden if self._needs_features else None)
            )
        self._verified_tokens = verify_tokens(num_proposed, proposal.token_ids.shape[1], packs_rows(self.device))
        self.last_step = StepStats(
            seqs,
            num_proposed,
            num_accepted,
            time.perf_counter() - t0,
            self._verified_tokens,
            mean_context_len=context,
            propose_time_s=t1 - t0,
            verify_time_s=t2 - t1,
            prefill_tokens=sum(len(c) for _, c in chunks),
        )
        self.controller.observe(self.last_step)  # control
        return updates

    def _riding_chunks(self, num_seqs: int, width: int) -> list[Chunk]:
        """The prompt chunks this step's verify forward of `num_seqs` rows of `width` caches too: the budget its
        decode and verify tokens leave, as a forward of their own would have had. None with fused_prefill off,
        or where riding costs more than it saves (`_rides`): the step then runs them in a forward of their own."""
        if not self._fused_prefill:
            return []
        chunks = self._next_chunks(max(self.config.max_num_batched_tokens - num_seqs * width, MIN_PREFILL_TOKENS))
        if not all(self._rides(seq, len(chunk), width) for seq, chunk in chunks):
            return []
        self._chunks_taken = True
        return chunks

    def _rides(self, seq: Sequence, length: int, width: int) -> bool:
        """Whether a chunk of `length` tokens of `seq` is cheaper in rows of `width` in the verify forward than in a
        forward of its own. Each row reads the prompt's cached K/V before it (the attention op reads a row's
        cache once for all its queries), so rows of one or two tokens read them length / width times; a forward
        of its own reads every weight again. The chunk rides while the extra K/V reads are fewer bytes: beside
        one-token steps, the first ~120 tokens of a SmolLM2 prompt and ~800 of a Qwen2.5-Coder 1.5B one (their
        weights' 92 MB and 1.1 GB against 45 and 56 KB of K/V a token), more beside wider verify steps."""
        rows = -(-length // width)
        return (rows - 1) * (seq.num_prefilled + length) * self._kv_bytes_per_token() <= self._weight_bytes

    def _kv_bytes_per_token(self) -> int:
        layers, _, kv_heads, _, head_dim = self.cache.k.shape  # [layers, slots, kv_heads, len + 1, head_dim]
        return 2 * layers * kv_heads * head_dim * self.cache.k.element_size()  # K and V

    def _chunk_features(self, chunks: list[Chunk], hidden: torch.Tensor | None) -> dict[int, torch.Tensor | None]:
        """Each chunk's features [len(chunk), hidden] by id of its request, from its rows of the verify forward
        (hidden [chunk rows, width, hidden], in `chunk_rows` order); Nones without a feature drafter."""
        if hidden is None:
            return {id(seq): None for seq, _ in chunks}
        features, row = {}, 0
        for seq, tokens in chunks:
            rows = -(-len(tokens) // hidden.shape[1])
            features[id(seq)] = hidden[row : row + rows].flatten(0, 1)[: len(tokens)]  # [len(chunk), hidden]
            row += rows
        return features

    def _clamp_k(self, seqs: list[Sequence], ks: list[int]) -> list[int]:
        # Never draft past the context, nor more than the request can still emit (one token is always the bonus).
        return [
            max(0, min(k, s.room, s.params.max_tokens - s.metrics.num_generated - 1))
            for s, k in zip(seqs, ks, strict=True)
        ]

    def _verify(
        self, seqs: list[Sequence], proposal: Proposal, st: SamplingTensors, chunks: list[Chunk] | None = None
    ) -> Verified:
        """Score (pending, drafts) for every row in one target forward, then accept or reject; prompt `chunks` ride
        in the same forward as rows of its width (`chunk_rows`), scored by nobody.

        A chain is scored causally; a tree with its ancestor mask and positions by depth (verify/tree_layout.py).
        Penalties, logit_bias and grammars adjust the logits at each position for the drafts on its path.
        """
        # A tree's depths and ancestor mask, [num_seqs, k + 1] and [num_seqs, k + 1, k + 1]: for attention and paths.
        depth, mask = (None, None) if proposal.parents is None else tree_layout(proposal.parents, proposal.num_tokens)
        proposal, paths, allowed = self._paths(proposal, mask, st)
        pending = torch.tensor([[s.token_ids[-1]] for s in seqs], dtype=torch.long, device=self.device)
        tokens = torch.cat([pending, proposal.token_ids.clamp(min=0)], dim=1)  # [num_seqs, k + 1]
        slots, starts = [s.slot for s in seqs], [s.num_cached for s in seqs]
        num_new = proposal.num_tokens + 1  # [num_seqs]
        rows = chunk_rows([c for c in chunks or [] if c[1]], tokens.shape[1])
        if rows:
            tokens, depth, mask, num_new = self._with_chunk_rows(tokens, depth, mask, num_new, rows)
            slots += [seq.slot for seq, _, _ in rows]
            starts += [start for _, start, _ in rows]
        meta = AttentionMetadata.build(
            slots, starts, tokens.shape[1], self.device, depth, mask, num_new, self.cache.max_len
        )
        chunk_hidden = None
        if rows:  # the body over every row, the head over the verified ones only
            hidden = self.target(tokens, meta, self.cache, tokens.new_empty(len(tokens), 0), return_hidden=True)[1]
            scored, chunk_hidden = hidden[: len(seqs)], hidden[len(seqs) :]  # [num_seqs, k + 1, hidden], [rows, ..]
            head = self.target.step.for_rows(tokens.numel()).head
            logits = head(scored.flatten(0, 1)).view(*scored.shape[:2], -1)  # [num_seqs, k + 1, vocab]
            hidden = scored if self._needs_features else None
        else:
            out = self.target(tokens, meta, self.cache, return_hidden=self._needs_features)
            logits, hidden = out if self._needs_features else (out, None)  # [num_seqs, k + 1, vocab], [.., hidden]
        if st.adjust is not None:
            logits = st.adjust(logits, paths, allowed)  # [num_seqs, k + 1, vocab]
        logits, broken = quarantine(logits)
        if proposal.parents is None:
            result = verify(logits, proposal.token_ids, proposal.num_tokens, proposal.probs, st)
        else:
            result = verify_tree(logits, proposal.token_ids, proposal.parents, proposal.num_tokens, proposal.probs, st)
        wanted = [s.params.logprobs for s in seqs]
        logprobs = [None] * len(seqs)
        if any(n is not None for n in wanted):
            logprobs = emitted_logprobs(processed_logprobs(logits, st), result, wanted)
        return Verified(result, starts[: len(seqs)], hidden, logprobs, broken, chunk_hidden)

    def _with_chunk_rows(
        self,
        tokens: torch.Tensor,  # [num_seqs, width] int64
        depth: torch.Tensor | None,  # [num_seqs, width] a tree's depths, or None
        mask: torch.Tensor | None,  # [num_seqs, width, width] bool a tree's ancestor mask, or None
        num_new: torch.Tensor,  # [num_seqs] int64 real tokens per row
        rows: list[tuple[Sequence, int, list[int]]],
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor]:
        """The verify batch with the chunk rows below it: tokens padded to the width, causal (a chain's depths
        and mask) where the batch is a tree, and their real token counts."""
        width, device = tokens.shape[1], self.device
        extra = torch.zeros((len(rows), width), dtype=torch.long, device=device)  # [rows, width]
        for i, (_, _, piece) in enumerate(rows):
            extra[i, : len(piece)] = torch.tensor(piece, dtype=torch.long, device=device)
        counts = torch.tensor([len(piece) for _, _, piece in rows], dtype=torch.long, device=device)  # [rows]
        if depth is not None:
            chain = torch.arange(width, device=device).expand(len(rows), -1)  # [rows, width]
            causal = torch.ones((width, width), dtype=torch.bool, device=device).tril().expand(len(rows), -1, -1)
            depth, mask = torch.cat([depth, chain]), torch.cat([mask, causal])
        return torch.cat([tokens, extra]), depth, mask, torch.cat([num_new.to(counts.dtype), counts])

    def _paths(
        self, proposal: Proposal, tree_mask: torch.Tensor | None, st: SamplingTensors
    ) -> tuple[Proposal, torch.Tensor | None, torch.Tensor | None]:
        """Each verify position's drafted path [num_seqs, k + 1, k] and its grammar masks [num_seqs, k + 1, vocab]
        (None when nothing adjusts). A tree's paths come from its ancestor mask (None for a chain), and a tree is
        never cut. A chain is cut before its first draft outside the grammar: the target could never accept it,
        so scoring it and what follows would be wasted."""
        if st.adjust is None:
            return proposal, None, None
        drafts = proposal.token_ids
        if tree_mask is not None:
            paths = tree_paths(drafts, tree_mask)
            return proposal, paths, st.adjust.grammar_masks(paths)[0]
        paths = chain_paths(drafts)  # [num_seqs, k + 1, k]
        allowed, valid = st.adjust.grammar_masks(paths)  # valid [num_seqs, k + 1]
        if allowed is not None and not bool(valid.all()):
            keep = valid.long().cumprod(-1).sum(-1) - 1  # [num_seqs] drafts before the first one that left
            proposal = proposal.truncated(keep)
            width = proposal.token_ids.shape[1]
            paths, allowed = paths[:, : width + 1, :width], allowed[:, : width + 1]
        return proposal, paths, allowed

    # ---- commit ---------------------------------------------------------------------------------------
    def _append(self, seq: Sequence, tokens: list[int], logprobs: list[TokenLogprob] | None = None) -> SeqUpdate:
        """Append verified tokens, honouring EOS, max_tokens, the context, stop strings and a finished grammar."""
        detok = self._detok[seq.request_id]
        old_text_len = len(seq.text)
        stops = seq.params.stop
        new_ids: list[int] = []
        cut = False
        for tok in tokens:
            seq.token_ids.append(tok)
            seq.metrics.num_generated += 1
            new_ids.append(tok)
            if seq.grammar is not None:
                seq.grammar.advance([tok])
            if stops:  # text after every token, so that tokens after a stop string are dropped
                detok.add([tok])
                cut = self._stopped_by_string(seq, detok.text, stops)
                if cut:
                    break
            reason = self._finish_reason(seq, tok)
            if reason:
                self._finish(seq, reason)
                break
        if not stops:
            detok.add(new_ids)
        if not cut:
            # Sent text is never taken back: while the request runs, text that could begin a stop string waits.
            held = stop_holdback(detok.text, stops) if stops and seq.status is not Status.FINISHED else 0
            seq.text = detok.text[: len(detok.text) - held]
        if seq.metrics.first_token_time is None:
            seq.metrics.first_token_time = time.perf_counter()
        new_logprobs = None if logprobs is None else logprobs[: len(new_ids)]
        if new_logprobs is not None and seq.logprobs is not None:
            seq.logprobs.extend(new_logprobs)
        return SeqUpdate(seq, new_ids, seq.text[old_text_len:], seq.status is Status.FINISHED, new_logprobs)

    def _finish_reason(self, seq: Sequence, tok: int) -> str | None:
        if tok in self.eos_token_ids and not seq.params.ignore_eos:
            return "stop"
        if seq.grammar is not None and seq.grammar.is_terminated:  # the structured output is complete
            return "stop"
        if seq.metrics.num_generated >= seq.params.max_tokens or len(seq.token_ids) >= seq.max_len:
            return "length"
        return None

    def _stopped_by_string(self, seq: Sequence, text: str, stops: list[str]) -> bool:
        """Finish at the earliest stop string in the text; the text is cut before it."""
        at = find_stop(text, stops, len(seq.text))
        if at is None:
            return False
        seq.text = text[:at]
        self._finish(seq, "stop")
        return True

    def _after_commit(self, seqs: list[Sequence], verified: Verified) -> None:
        """Only commit touches the cache: keep pending + accepted tokens, forget the rest.

        A tree's accepted path is first moved to sit right after the pending token. Drafters that read the
        target's features get those of the tokens just cached.
        """
        result = verified.result
        num_accepted = result.num_accepted.tolist()
        paths = None if result.path is None else result.path.tolist()
        for b, s in enumerate(seqs):
            if s.status is Status.FINISHED:
                continue
            # tree positions of the kept tokens: the root (pending), then each accepted node
            kept = (
                list(range(num_accepted[b] + 1))
                if paths is None
                else [0] + [j + 1 for j in paths[b][: num_accepted[b]]]
            )
            self.cache.compact(s.slot, verified.starts[b], kept)
            self.cache.set_length(s.slot, s.num_cached)
            if verified.hidden is not None:
                index = torch.tensor(kept, device=self.device)
                self.drafter.observe_features(s, verified.starts[b], verified.hidden[b, index])  # [kept, hidden]
        self.drafter.commit([s for s in seqs if s.status is not Status.FINISHED])

    def _finish(self, seq: Sequence, reason: str) -> None:
        """Mark the sequence finished; its state is released when it leaves the batch (`_retire_finished`)."""
        if seq.status is Status.FINISHED:
            return
        seq.status = Status.FINISHED
        seq.finish_reason = reason
        seq.metrics.end_time = time.perf_counter()

    def _retire_finished(self) -> None:
        finished = [s for s in self.running if s.status is Status.FINISHED]
        self.running = [s for s in self.running if s.status is not Status.FINISHED]
        for seq in finished:
            self._release(seq)

    def _release(self, seq: Sequence) -> None:
        """The one place a request's per-request state is freed: cache slot, drafter, controller, detokenizer."""
        if seq.slot >= 0:
            self.cache.free(seq.slot)
            self.drafter.remove_sequence(seq)
            seq.slot = -1
        self.controller.forget(seq)
        self._detok.pop(seq.request_id, None)
