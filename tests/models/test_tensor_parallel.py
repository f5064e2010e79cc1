"""Tensor parallelism at the model: how a LlamaModel is split across ranks, and what can't be split."""

from __future__ import annotations

from pathlib import Path

import pytest

from specdecode.config import ConfigError
from specdecode.models.llama import load_llama
from specdecode.models.tensor_parallel import check_shardable, shard_config, shard_llama, shard_range
from tests.tiny import write_tiny_model

# A tiny model that splits unevenly over two ranks: 3 kv heads (2 + 1), 91 MLP columns, a vocabulary of 97.
UNEVEN = dict(num_attention_heads=6, num_key_value_heads=3, hidden_size=48, intermediate_size=91, vocab_size=97)


def test_shard_ranges_cover_everything_once():
    for n in (1, 3, 9, 91, 1536):
        for world in range(1, min(n, 5) + 1):
            ranges = [shard_range(n, r, world) for r in range(world)]
            assert ranges[0][0] == 0 and ranges[-1][1] == n
            assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
            assert max(hi - lo for lo, hi in ranges) - min(hi - lo for lo, hi in ranges) <= 1


def test_shard_config_splits_heads_by_kv_group(tmp_path):
    cfg = load_llama(write_tiny_model(tmp_path, "llama", **UNEVEN)).cfg
    shards = [shard_config(cfg, r, 2) for r in range(2)]
    assert [(c.num_heads, c.num_kv_heads, c.intermediate_size) for c in shards] == [(2, 1, 45), (4, 2, 46)]
    assert all(c.vocab_size == cfg.vocab_size and c.hidden_size == cfg.hidden_size for c in shards)


@pytest.mark.parametrize(("world", "message"), [(0, "must be >= 1"), (-1, "must be >= 1"), (3, "key/value heads")])
def test_unshardable_worlds_are_refused(tmp_path, world, message):
    model = load_llama(write_tiny_model(Path(tmp_path), "llama"), inference=False)  # 2 kv heads
    with pytest.raises(ConfigError, match=message):
        check_shardable(model.cfg, world)
    with pytest.raises(ConfigError, match=message):
        shard_llama(model, 0, world)
