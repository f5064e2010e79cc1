"""The compiled step (models/compiled.py) computes what the eager step computes, writes the same cache, serves
every shape from one compiled artifact, and keeps greedy speculative decoding equal to plain decoding. Both
compilers are covered: AOTInductor packages (the CPU default) and torch.compile (CUDA, and the fallback), and
the packages with the few-rows GEMM in their linears (models/few_rows.py)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from torch._dynamo.utils import counters

from specdecode import LLM, SamplingParams
from specdecode.drafters import draft_model
from specdecode.drafters.subset_head import VOCAB_FILE
from specdecode.models import compiled as compiled_module
from specdecode.models import few_rows
from specdecode.models.compiled import COMPILED_MAX_ROWS, compile_step, load_target
from specdecode.models.llama import AttentionMetadata, load_llama
from specdecode.verify.tree_layout import tree_layout

# (slots, starts, tokens per row, real tokens per row): contiguous and scattered slots, ragged rows.
CASES = [
    ([0], [9], 1, [1]),
    ([2], [30], 9, [9]),
    ([3, 1, 0, 2], [10, 17, 24, 31], 3, [3, 3, 3, 3]),
    ([0, 1, 2, 3], [10, 17, 24, 31], 5, [5, 2, 4, 1]),
    ([5, 2, 7], [40, 3, 12], 4, [4, 1, 3]),
]


@pytest.fixture(scope="module")
def models(tiny_target):
    eager = load_llama(tiny_target, inference=False)
    compiled = load_llama(tiny_target, inference=False)
    compile_step(compiled, progress=False)  # the package test_aot_package compiled, if it ran first
    assert compiled.step.compiled and not isinstance(compiled.step.body, torch.nn.Module)  # a package, not dynamo
    return eager, compiled


@pytest.fixture(scope="module")
def jit_models(tiny_target):
    """The step under torch.compile, reached the way a failed export or AOT compile reaches it: the fallback."""
    eager = load_llama(tiny_target, inference=False)
    compiled = load_llama(tiny_target, inference=False)
    with pytest.MonkeyPatch.context() as mp, pytest.warns(UserWarning, match="using torch.compile"):
        mp.setattr(compiled_module, "load_or_compile", _refuse)
        compile_step(compiled, progress=False)
    return eager, compiled


@pytest.fixture(scope="module")
def kernel_models(tiny_target):
    """The AOT step with the few-rows GEMM in its linears, as load_target builds it on an AVX-512 CPU."""
    if not few_rows.supported():
        pytest.skip("no AVX-512 or no C++ compiler here: the few-rows GEMM is not installed")
    few_rows.require()  # a build error fails the tests (available() would fall back and they would skip)
    eager = load_llama(tiny_target, inference=False)
    compiled = load_llama(tiny_target, inference=False)
    assert few_rows.install(compiled) == 4 * compiled.cfg.num_layers + 1  # wqkv, wo, w13, w2 a layer; the LM head
    compile_step(compiled, progress=False)
    return eager, compiled


def _refuse(*args, **kwargs):
    raise RuntimeError("AOT compile refused (injected)")


def run_both(models, slots, starts, t, num_new, write_shift=0):
    eager, compiled = models
    caches = [m.new_cache(8, 64) for m in models]
    gen = torch.Generator().manual_seed(len(slots) * 100 + t)
    for c in caches:  # the same prior context in both caches
        c.k.copy_(torch.randn(c.k.shape, generator=torch.Generator().manual_seed(1)))
        c.v.copy_(torch.randn(c.v.shape, generator=torch.Generator().manual_seed(2)))
    tokens = torch.randint(0, eager.cfg.vocab_size, (len(slots), t), generator=gen)
    meta = AttentionMetadata.build(slots, starts, t, "cpu", num_new=num_new, max_len=64)
    faulty = AttentionMetadata.build(slots, [s + write_shift for s in starts], t, "cpu", num_new=num_new, max_len=64)
    faulty.positions = meta.positions  # the fault moves only where the compiled step writes (and what it reads)
    with torch.inference_mode():
        want = eager(tokens, meta, caches[0])
        got = compiled(tokens, faulty if write_shift else meta, caches[1])
    real = torch.arange(t)[None] < torch.tensor(num_new)[:, None]  # [num_seqs, T] padding is junk in both
    return (got - want)[real].abs().max().item(), (caches[1].k - caches[0].k)[..., :64, :].abs().max().item()


@pytest.mark.parametrize(("slots", "starts", "t", "num_new"), CASES)
@pytest.mark.parametrize("compiler", ["models", "jit_models", "kernel_models"])
def test_compiled_equals_eager(compiler, slots, starts, t, num_new, request):
    logits_diff, cache_diff = run_both(request.getfixturevalue(compiler), slots, starts, t, num_new)
    assert logits_diff < 1e-4 and cache_diff < 1e-5


def test_control_misplaced_cache_writes_are_caught(models):
    """Negative control: the compiled step writing one position late fails the same check by far."""
    logits_diff, cache_diff = run_both(models, *CASES[3], write_shift=1)
    assert logits_diff > 1e-2 or cache_diff > 1e-2


def test_tree_step_equals_eager(models):
    eager, compiled = models
    parents = torch.tensor([[-1, 0, 0, 1, 2], [-1, 0, 1, -2, -2]])  # [2, 5] two trees, the second padded
    depth, mask = tree_layout(parents, torch.tensor([5, 3]))
    tokens = torch.randint(0, eager.cfg.vocab_size, (2, 6))
    meta = AttentionMetadata.build([1, 4], [12, 20], 6, "cpu", depth, mask, torch.tensor([6, 4]), 64)
    with torch.inference_mode():
        want = eager(tokens, meta, eager.new_cache(8, 64))
        got = compiled(tokens, meta, compiled.new_cache(8, 64))
    assert (got - want)[:, :4].abs().max().item() < 1e-4


def test_new_shapes_reuse_the_one_graph(jit_models):
    """After the warm-up, batch and token counts never seen (and batch 1 x 1 token) compile nothing new."""
    _, compiled = jit_models
    before = counters["stats"]["unique_graphs"]
    cache = compiled.new_cache(8, 64)
    with torch.inference_mode():
        for b, t in [(1, 1), (7, 13), (1, 30), (6, 1)]:
            meta = AttentionMetadata.build(list(range(b)), [b] * b, t, "cpu")
            compiled(torch.zeros((b, t), dtype=torch.long), meta, cache)
    assert counters["stats"]["unique_graphs"] == before


@pytest.mark.parametrize(("b", "t", "slots", "length"), [(1, 1, 1, 8), (7, 13, 9, 40), (1, 30, 2, 300), (6, 1, 6, 20)])
def test_the_package_serves_shapes_and_caches_it_was_not_exported_at(models, b, t, slots, length):
    """Batch, tokens, attended length and the cache's slots and length all differ from the export's example
    (2 x 3 tokens on a 3 x 16 cache), and the package still computes what the eager step does."""
    eager, compiled = models
    caches = [m.new_cache(slots, length) for m in models]
    tokens = torch.randint(0, eager.cfg.vocab_size, (b, t), generator=torch.Generator().manual_seed(b * t))
    starts = [min(length - t, 3 + i) for i in range(b)]
    meta = AttentionMetadata.build(list(range(b)), starts, t, "cpu", max_len=length)
    with torch.inference_mode():
        want, got = eager(tokens, meta, caches[0]), compiled(tokens, meta, caches[1])
    assert (got - want).abs().max().item() < 1e-4
    assert (caches[1].k - caches[0].k).abs().max().item() < 1e-5


GREEDY = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
PROMPTS = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [11, 12, 13], [20, 21, 22, 23, 20, 21, 22, 23, 24, 20, 21], [3, 4]]


@pytest.fixture(scope="module")
def plain_tokens(tiny_target):
    llm = LLM(target=str(tiny_target), method="none", max_num_seqs=4, enforce_eager=True)
    return [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]


@pytest.mark.parametrize("method", ["ngram", "ngram_tree", "draft"])  # chain, tree, sampled-draft model
def test_compiled_engine_greedy_equals_eager_plain(method, tiny_target, tiny_draft, plain_tokens):
    llm = LLM(
        target=str(tiny_target),
        draft=str(tiny_draft) if method == "draft" else None,
        method=method,
        num_speculative_tokens=4,
        controller="fixed",
        max_num_seqs=4,
        enforce_eager=False,
    )
    assert llm.target.step.compiled and (method != "draft" or llm.draft_model.step.compiled)
    kernel = few_rows.supported()  # then load_target installed it, unless it failed to build: that fails here
    if kernel:
        few_rows.require()
    assert isinstance(llm.target.lm_head, few_rows.FewRowsLinear) is kernel
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == plain_tokens


def test_large_forwards_run_on_the_eager_twin(tiny_target, monkeypatch):
    """Without the few-rows GEMM, load_target sends forwards over COMPILED_MAX_ROWS tokens to the packed eager
    twin, with the same result."""
    monkeypatch.setattr(compiled_module.few_rows, "available", lambda device, dtype: False)
    model = load_target(tiny_target, "cpu", torch.float32, enforce_eager=False, progress=False)  # models' package
    eager = load_llama(tiny_target)
    rows = COMPILED_MAX_ROWS + 1
    assert model.step.for_rows(rows) is model.step.large and model.step.for_rows(rows - 1) is model.step
    tokens = torch.randint(0, eager.cfg.vocab_size, (1, rows))
    meta = AttentionMetadata.build([0], [0], rows, "cpu")
    with torch.inference_mode():
        got, want = model(tokens, meta, model.new_cache(1, 64)), eager(tokens, meta, eager.new_cache(1, 64))
    assert (got - want).abs().max().item() < 1e-4


def test_with_the_few_rows_gemm_every_forward_is_compiled(tiny_target):
    if not few_rows.supported():
        pytest.skip("no AVX-512 or no C++ compiler here: the few-rows GEMM is not installed")
    few_rows.require()  # a build error fails the tests (available() would fall back and they would skip)
    model = load_target(tiny_target, "cpu", torch.float32, enforce_eager=False, progress=False)
    eager = load_llama(tiny_target)
    assert model.step.large is None and isinstance(model.lm_head, few_rows.FewRowsLinear)
    for rows in (COMPILED_MAX_ROWS + 1, 60):  # a prefill chunk's worth of rows through the compiled step
        assert model.step.for_rows(rows) is model.step
        tokens = torch.randint(0, eager.cfg.vocab_size, (1, rows))
        meta = AttentionMetadata.build([0], [0], rows, "cpu")
        with torch.inference_mode():
            got, want = model(tokens, meta, model.new_cache(1, 64)), eager(tokens, meta, eager.new_cache(1, 64))
        assert (got - want).abs().max().item() < 1e-4


@pytest.mark.parametrize("fault", [False, True])
def test_a_compiled_draft_scores_only_its_drafting_vocabulary(fault, tiny_draft, tmp_path, monkeypatch):
    """load_draft compiles the draft's step and keeps its drafting vocabulary: logits equal the eager draft's on
    the subset and are -inf elsewhere, at one row and past COMPILED_MAX_ROWS. The fault, the compiled step's own
    head left in place, scores the whole vocabulary, and the same check fails."""
    shutil.copytree(tiny_draft, tmp_path / "d")
    subset = np.arange(0, 90, 3)  # token ids the draft may propose (the tiny vocabulary is 96)
    np.save(tmp_path / "d" / VOCAB_FILE, subset)
    if fault:
        monkeypatch.setattr(draft_model, "with_head", lambda step, head: step)
    vocab = tmp_path / "d" / VOCAB_FILE
    model = draft_model.load_draft(tmp_path / "d", "cpu", torch.float32, enforce_eager=False, vocab=vocab)
    eager = draft_model.load_draft(tmp_path / "d", "cpu", torch.float32, enforce_eager=True, vocab=vocab)
    assert model.step.compiled and not eager.step.compiled
    outside = torch.ones(model.cfg.vocab_size, dtype=torch.bool)
    outside[torch.from_numpy(subset)] = False
    worst = 0.0
    for rows in (1, COMPILED_MAX_ROWS + 1):
        tokens = torch.randint(0, model.cfg.vocab_size, (1, rows))
        meta = AttentionMetadata.build([0], [0], rows, "cpu")
        with torch.inference_mode():
            got, want = model(tokens, meta, model.new_cache(1, 64)), eager(tokens, meta, eager.new_cache(1, 64))
        assert torch.isinf(want[..., outside]).all()
        worst = max(worst, (got[..., ~outside] - want[..., ~outside]).abs().max().item())
        worst = max(worst, float(torch.isfinite(got[..., outside]).any()))  # 1.0: a token outside is scored
    assert (worst > 0.5) if fault else (worst < 1e-4), worst
