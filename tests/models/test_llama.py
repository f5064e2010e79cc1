"""Our runtime's logits equal transformers' for the same weights, for each family and for ragged batches."""

import pytest
import torch
import transformers

from specdecode.models import llama
from specdecode.models.llama import AttentionMetadata, LlamaConfig, UnsupportedModelError, load_llama
from tests.tiny import FAMILIES, write_tiny_model

TOL = 1e-3


@pytest.fixture(scope="module", params=FAMILIES)
def pair(request, tmp_path_factory):
    d = write_tiny_model(tmp_path_factory.mktemp(request.param), request.param)
    hf = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    return hf, load_llama(d)


def hf_logits(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0]  # [len, vocab]


def test_prefill_matches_transformers(pair):
    hf, ours = pair
    ids = torch.randint(3, 96, (1, 37), generator=torch.Generator().manual_seed(1))
    cache = ours.new_cache(1, 64)
    meta = AttentionMetadata.build([0], [0], 37, "cpu")
    with torch.no_grad():
        got = ours(ids, meta, cache)[0]
    assert (got - hf_logits(hf, ids[0].tolist())).abs().max() < TOL


def test_ragged_batch_matches_transformers(pair):
    """Rows with different cached lengths and different numbers of new tokens, in one call."""
    hf, ours = pair
    g = torch.Generator().manual_seed(2)
    seqs = [torch.randint(3, 96, (n,), generator=g).tolist() for n in (20, 9, 31)]
    cached = [15, 4, 30]  # tokens already in the cache per row
    new = [5, 5, 1]  # valid new tokens per row; row 2 is padded from 1 to 5
    cache = ours.new_cache(4, 64)
    slots = [3, 0, 1]  # not contiguous: exercises the per-row views
    with torch.no_grad():
        for s, seq, c in zip(slots, seqs, cached, strict=True):
            ours(torch.tensor([seq[:c]]), AttentionMetadata.build([s], [0], c, "cpu"), cache)
        t = max(new)
        tokens = torch.tensor([seq[c : c + n] + [0] * (t - n) for seq, c, n in zip(seqs, cached, new, strict=True)])
        logits = ours(tokens, AttentionMetadata.build(slots, cached, t, "cpu"), cache)
    for row, (seq, c, n) in enumerate(zip(seqs, cached, new, strict=True)):
        want = hf_logits(hf, seq[: c + n])[c:]
        assert (logits[row, :n] - want).abs().max() < TOL


def rows_through_the_linears(ours, monkeypatch, packs: bool) -> tuple[list[int], torch.Tensor]:
    """A batch of rows with 5, 2 and 1 new tokens padded to 5: the rows each linear of the first layer and the LM
    head took, and the final hidden states [3, 5, hidden] and logits [3, 5, vocab] (padding included)."""
    monkeypatch.setattr(llama, "packs_rows", lambda device: packs)
    seen: list[int] = []
    layer = ours.layers[0]
    hooks = [
        m.register_forward_hook(lambda m, x, out: seen.append(x[0].numel() // x[0].shape[-1]))
        for m in (layer.attn.wqkv, layer.attn.wo, layer.mlp.w13, layer.mlp.w2, ours.lm_head)
    ]
    cache = ours.new_cache(3, 32)
    tokens = torch.randint(3, 96, (3, 5), generator=torch.Generator().manual_seed(4))
    meta = AttentionMetadata.build([0, 1, 2], [3, 0, 7], 5, "cpu", num_new=[5, 2, 1])
    try:
        with torch.no_grad():
            logits, hidden = ours(tokens, meta, cache, return_hidden=True)
    finally:
        for h in hooks:
            h.remove()
    return seen, hidden, logits


def test_the_linears_run_the_real_tokens_alone(pair, monkeypatch):
    """On the CPU a padded batch's projections, MLP and LM head take its 8 real tokens, not 15: one row's draft at
    batch 8 verified 16 tokens where 9 were real. The real tokens' hidden states and logits are those of the padded
    computation (test_ragged_batch_matches_transformers checks them against transformers); the padding's are zeros.
    Control: padded, 15."""
    _, ours = pair
    seen, hidden, logits = rows_through_the_linears(ours, monkeypatch, packs=True)
    padded_seen, padded, padded_logits = rows_through_the_linears(ours, monkeypatch, packs=False)
    assert seen == [8] * 5 and padded_seen == [15] * 5
    real = torch.tensor([[True] * 5, [True] * 2 + [False] * 3, [True] + [False] * 4])  # [3, 5]
    assert (hidden[real] - padded[real]).abs().max() < 1e-5
    assert (logits[real] - padded_logits[real]).abs().max() < 1e-5
    assert not hidden[~real].any() and not logits[~real].any()


def test_tree_mask_equals_separate_paths(pair):
    """Two branches scored together under a tree mask equal each branch scored alone."""
    _, ours = pair
    prefix, a, b = [5, 6, 7, 8], [10, 11], [20]
    cache = ours.new_cache(2, 32)
    with torch.no_grad():
        ours(torch.tensor([prefix]), AttentionMetadata.build([0], [0], 4, "cpu"), cache)
        tokens = torch.tensor([a + b])  # nodes: a0 (depth 0), a1 (depth 1, child of a0), b0 (depth 0)
        mask = torch.tensor([[[1, 0, 0], [1, 1, 0], [0, 0, 1]]], dtype=torch.bool)
        depth = torch.tensor([0, 1, 0])
        tree = ours(tokens, AttentionMetadata.build([0], [4], 3, "cpu", tree_depth=depth, tree_mask=mask), cache)
        ours(torch.tensor([prefix]), AttentionMetadata.build([1], [0], 4, "cpu"), cache)
        path_a = ours(torch.tensor([a]), AttentionMetadata.build([1], [4], 2, "cpu"), cache)
        path_b = ours(torch.tensor([b]), AttentionMetadata.build([1], [4], 1, "cpu"), cache)
    assert (tree[0, :2] - path_a[0]).abs().max() < TOL
    assert (tree[0, 2] - path_b[0, 0]).abs().max() < TOL
    # Negative control: the same tree under a plain causal mask lets b0 see a0, a1 and changes its logits.
    with torch.no_grad():
        causal = ours(tokens, AttentionMetadata.build([0], [4], 3, "cpu"), cache)
    assert (causal[0, 2] - path_b[0, 0]).abs().max() > 10 * TOL


def test_logits_index_picks_positions(pair):
    _, ours = pair
    ids = torch.randint(3, 96, (2, 8), generator=torch.Generator().manual_seed(3))
    cache = ours.new_cache(2, 32)
    with torch.no_grad():
        full = ours(ids, AttentionMetadata.build([0, 1], [0, 0], 8, "cpu"), cache)
        last = ours(ids, AttentionMetadata.build([0, 1], [0, 0], 8, "cpu"), cache, torch.tensor([[7], [3]]))
    assert torch.allclose(last[:, 0], torch.stack([full[0, 7], full[1, 3]]), atol=1e-5)


def test_unsupported_architecture_is_refused():
    with pytest.raises(UnsupportedModelError, match="unsupported architecture 'gpt2'"):
        LlamaConfig.from_hf({"model_type": "gpt2"})
