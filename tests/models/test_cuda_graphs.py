"""The CUDA-graph step's padding (models/cuda_graphs.py), checked on the CPU: a call padded up to its bucket gives
every real row the result it has unpadded, and the grouped attention used on accelerators equals SDPA's own
grouped-query attention. The graphs themselves are captured only on a GPU (tools/gpu_check.py)."""

from __future__ import annotations

import pytest
import torch

from specdecode.models import cuda_graphs
from specdecode.models.attention import _sdpa, _sdpa_grouped
from specdecode.models.cuda_graphs import GraphedBody, PaddedInputs, bucket
from specdecode.models.llama import AttentionMetadata, load_llama
from tests.tiny import write_tiny_model


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return load_llama(write_tiny_model(tmp_path_factory.mktemp("graphs"), seed=3), inference=False)


def body_args(model, b: int, t: int, cache, starts: list[int]):
    """Inputs of one [b, t] forward whose rows sit at `starts` in slots 1..b (slot 0 stays free)."""
    torch.manual_seed(b * 100 + t)
    tokens = torch.randint(0, model.cfg.vocab_size, (b, t))  # [b, t]
    meta = AttentionMetadata.build(list(range(1, b + 1)), starts, t, "cpu", max_len=cache.max_len)
    mask = meta.additive_mask(t, torch.float32)  # [b, 1, t, kv_len]
    return tokens, meta.positions, meta.slots, meta.write_pos, mask


def prefilled_cache(model):
    cache = model.new_cache(8, 48)
    torch.manual_seed(0)
    cache.k.normal_()  # every slot holds keys and values, past each row's length too: the mask must hide them
    cache.v.normal_()
    return cache


CASES = [(1, 1, [5]), (3, 2, [7, 0, 20]), (5, 7, [1, 30, 2, 9, 16])]  # padded to (1, 1), (4, 2), (8, 8)


def max_error(model, padded_body) -> float:
    worst = 0.0
    with torch.inference_mode():
        for b, t, starts in CASES:
            args = body_args(model, b, t, prefilled_cache(model), starts)
            want = model.body(*args[:5], *cache_of(prefilled_cache(model)))
            got = padded_body(*args[:5], *cache_of(prefilled_cache(model)))
            assert got.shape == want.shape
            worst = max(worst, float((got - want).abs().max()))
    return worst


def cache_of(cache):
    return cache.k, cache.v


def test_padding_to_a_bucket_leaves_every_row_unchanged(model):
    assert max_error(model, GraphedBody(model.body, capture=False)) < 1e-5


def test_control_keys_past_a_row_unmasked_are_caught(model, monkeypatch):
    """Fault: the padded mask attends to every key of the cache (keys past a row's own are stale values)."""
    load = PaddedInputs.load

    def leaky(self, *args):
        load(self, *args)
        self.mask.zero_()

    monkeypatch.setattr(PaddedInputs, "load", leaky)
    assert max_error(model, GraphedBody(model.body, capture=False)) > 1e-2


def test_buckets():
    assert [bucket(n, cuda_graphs.TOKEN_BUCKETS) for n in (1, 5, 7, 17, 33)] == [1, 5, 8, 17, None]
    assert bucket(3, cuda_graphs.BATCH_BUCKETS) == 4


def grouped_error(fold) -> float:
    torch.manual_seed(1)
    worst = 0.0
    for n, heads, kv_heads, t, length in [(3, 8, 2, 5, 40), (2, 6, 3, 3, 9), (1, 4, 4, 1, 7)]:
        q = torch.randn(n, heads, t, 16)
        k, v = torch.randn(n, kv_heads, length, 16), torch.randn(n, kv_heads, length, 16)
        mask = torch.zeros(n, 1, t, length)
        mask[..., length - 2 :] = float("-inf")
        mask[0, 0, 0, 3:] = float("-inf")
        worst = max(worst, float((fold(q, k, v, mask) - _sdpa(q, k, v, mask)).abs().max()))
    return worst


def test_grouped_attention_equals_sdpa_gqa():
    assert grouped_error(_sdpa_grouped) < 1e-5


def test_control_query_heads_grouped_the_wrong_way_are_caught():
    """Fault: query heads taken round-robin over the key heads (i % kv_heads) instead of in blocks."""

    def round_robin(q, k, v, mask):
        n, heads, t, d = q.shape
        g = heads // k.shape[1]
        order = torch.arange(heads).view(g, -1).t().reshape(-1)  # head order that groups i % kv_heads together
        out = _sdpa_grouped(q[:, order], k, v, mask)
        return out[:, torch.argsort(order)]

    assert grouped_error(round_robin) > 0.1
