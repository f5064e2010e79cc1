"""Tensor parallelism at the model: two gloo ranks give the single process's logits (fp32, < 1e-4) on every
family and on SmolLM2, step after step over one cache (ragged prefill, a tree batch and its compaction, a
forward over a subset of layers scored by rank 0's whole LM head, slot reuse); faults injected into the real
sharding and mirroring code fail the same check by far.

All cases run in one group, the test process as rank 0 beside one spawned worker (tests/ranks.py): starting
a process is most of the cost.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from specdecode.config import ConfigError
from specdecode.models.llama import AttentionMetadata, load_llama
from specdecode.models.tensor_parallel import check_shardable, shard_config, shard_llama, shard_range
from specdecode.step.runner import forward_ragged
from specdecode.verify.tree_layout import tree_layout
from tests.ranks import DRIVER_FAULTS, FAULTS, driven, run_on_ranks
from tests.tiny import FAMILIES, write_tiny_model

TOLERANCE = 1e-4
# A tiny model that splits unevenly over two ranks: 3 kv heads (2 + 1), 91 MLP columns, a vocabulary of 97.
UNEVEN = dict(num_attention_heads=6, num_key_value_heads=3, hidden_size=48, intermediate_size=91, vocab_size=97)
PROMPTS = [[5, 6, 7, 8, 5, 6, 7], [11, 12, 13], [20, 21, 22, 23, 24]]
SLOTS = [2, 0, 3]  # scattered: attention takes its per-row path
SKIP_STEP = 3  # the script's forward over a subset of layers


def _prefill(model, cache, slots: list[int], prompts: list[list[int]]) -> torch.Tensor:
    """Logits of the real tokens of a ragged prefill, flattened [sum of lengths, vocab]; lengths committed."""
    logits = forward_ragged(model, cache, slots, prompts, last_only=False)  # [num_seqs, longest, vocab]
    for s, p in zip(slots, prompts, strict=True):
        cache.set_length(s, cache.lengths[s] + len(p))
    return torch.cat([logits[b, : len(p)] for b, p in enumerate(prompts)])


def _tree_step(model, cache, slots: list[int]) -> torch.Tensor:
    """One tree per row (ragged: 4, 2 and 3 nodes below the pending token), scored in one forward; each row
    then keeps a path that is not the first nodes (so the K/V really move) and commits it."""
    parents = torch.tensor([[0, 0, 1, 2], [0, 1, -1, -1], [0, 0, 2, -1]])  # [num_seqs, N]; -1 = padding
    num_nodes = torch.tensor([4, 2, 3])
    depth, mask = tree_layout(parents, num_nodes)  # [num_seqs, N + 1], [num_seqs, N + 1, N + 1]
    tokens = torch.tensor([[30, 31, 32, 33, 34], [40, 41, 42, 0, 0], [50, 51, 52, 53, 0]])
    starts = [cache.lengths[s] for s in slots]
    meta = AttentionMetadata.build(slots, starts, 5, "cpu", depth, mask, num_nodes + 1, cache.max_len)
    logits = model(tokens, meta, cache)  # [num_seqs, N + 1, vocab]
    paths = [[0, 2, 4], [0, 2], [0, 3]]  # root, then accepted nodes (tree positions)
    for s, start, path in zip(slots, starts, paths, strict=True):
        cache.compact(s, start, path)
        cache.set_length(s, start + len(path))
    return torch.cat([logits[b, : n + 1] for b, n in enumerate(num_nodes.tolist())])


def _skip_step(model, cache, slots: list[int]) -> torch.Tensor:
    """A layer-skip draft: one token per row through the first layer only, on the full model's cached context,
    not committed (the next forward overwrites its K/V). Its final hidden states are scored as a feature drafter
    scores them, by `lm_head` and by `lm_head_weight()` (on a sharded target: rank 0's whole head, no collective).
    Returns both scores [2, num_seqs, 1, vocab]."""
    meta = AttentionMetadata.build(slots, [cache.lengths[s] for s in slots], 1, "cpu", max_len=cache.max_len)
    tokens = torch.tensor([[65], [66], [67]])  # [num_seqs, 1]
    none = torch.zeros((len(slots), 0), dtype=torch.long)  # no logits from the forward: the head runs below
    _, hidden = model(tokens, meta, cache, none, return_hidden=True, layer_ids=[0])  # [num_seqs, 1, hidden]
    return torch.stack([model.lm_head(hidden).float(), hidden @ model.lm_head_weight().T])


@torch.inference_mode()
def _script(model, cache) -> list[torch.Tensor]:
    """The same steps on any model and its cache; the logits of every step."""
    steps = [_prefill(model, cache, SLOTS, PROMPTS)]
    steps.append(_tree_step(model, cache, SLOTS))
    steps.append(_prefill(model, cache, SLOTS, [[60, 61], [62], [63, 64]]))  # a ragged chain after the tree
    steps.append(_skip_step(model, cache, SLOTS))
    cache.set_length(SLOTS[1], 0)  # the slot goes to a new request: its stale K/V stay and must never be read
    steps.append(_prefill(model, cache, SLOTS[1:2], [[70, 71, 72, 73, 74, 75]]))
    steps.append(_prefill(model, cache, SLOTS, [[80], [81], [82]]))
    n = cache.lengths[SLOTS[0]]
    cache.copy_prefix(SLOTS[0], 1, n)  # a second sample of slot 2's prompt continues from a copy of its K/V
    cache.set_length(1, n)
    steps.append(_prefill(model, cache, [1], [[90, 91]]))
    return steps


@dataclass
class Comparison:
    steps: list[float]  # max |logits TP - logits single process| at each step of the script
    scale: float  # the single process's largest |logit| of the whole model (not the skip step's draft)


def _compare(model_dir: str, fault: str | None = None) -> Comparison:
    """The script on the single process and on two ranks (runs on rank 0)."""
    single = load_llama(model_dir)
    want = _script(single, single.new_cache(4, 64))
    with driven(model_dir, fault) as target:
        got = _script(target, target.new_cache(4, 64))
    diffs = [(g - w).abs().max().item() for g, w in zip(got, want, strict=True)]
    scale = max(w.abs().max().item() for i, w in enumerate(want) if i != SKIP_STEP)
    return Comparison(diffs, scale)


def _all_cases(model_dirs: dict[str, str]) -> dict[str, Comparison]:
    """Rank 0: every model, then every fault on the first tiny model."""
    result = {name: _compare(d) for name, d in model_dirs.items()}
    for fault in [*FAULTS, *DRIVER_FAULTS]:
        result[f"fault:{fault}"] = _compare(model_dirs["llama"], fault)
    return result


@pytest.fixture(scope="module")
def diffs(tmp_path_factory, smollm2_dir) -> dict[str, Comparison]:
    root = tmp_path_factory.mktemp("tp_models")
    dirs = {f: str(write_tiny_model(root / f, f)) for f in FAMILIES}
    dirs["uneven"] = str(write_tiny_model(root / "uneven", "llama", **UNEVEN))
    dirs["smollm2"] = str(smollm2_dir)
    return run_on_ranks(_all_cases, dirs)


@pytest.mark.parametrize("name", [*FAMILIES, "uneven"])
def test_tiny_logits_equal_single_process(diffs, name):
    assert max(diffs[name].steps) < TOLERANCE, diffs[name]


@pytest.mark.slow
def test_smollm2_logits_equal_single_process(diffs):
    """The real model: 3 kv heads over two ranks (2 + 1), a tied LM head split by vocabulary.

    Held to 1e-4 of the logits' scale (max |logit| ~31), not 1e-4 absolute: the shards' partial sums are
    reordered fp32 sums over 30 layers, and they moved the logits by up to 5.4e-4 with MKL-packed linears and
    1.5e-3 with oneDNN ones (the kind this machine's timing probe picks), the size of fp32's own rounding here:
    the single process is 1.4e-3 (MKL) and 7.2e-4 (oneDNN) from its fp64 logits. With fp64 weights TP and the
    single process gave identical logits (this script's steps, 2-core AMD EPYC, 2026-11-24).
    """
    real = diffs["smollm2"]
    assert 10 < real.scale < 100 and max(real.steps) < TOLERANCE * real.scale, real


@pytest.mark.parametrize("fault", [*FAULTS, *DRIVER_FAULTS])
def test_control_faults_are_caught(diffs, fault):
    """Negative controls: a skipped all-reduce, every rank slicing rank 0's heads and columns, a compaction or a
    prefix copy the workers never hear of, and workers running other layers than rank 0's layer skip each fail
    the same check by orders of magnitude."""
    assert max(diffs[f"fault:{fault}"].steps) > 1000 * TOLERANCE, diffs[f"fault:{fault}"]


def test_unmirrored_compact_shows_only_after_the_tree(diffs):
    """The tree step itself is right (the fault is in the commit after it): the check sees the cache, not luck."""
    per_step = diffs["fault:unmirrored_compact"].steps
    assert max(per_step[:2]) < TOLERANCE and max(per_step[2:]) > 1000 * TOLERANCE


def test_wrong_layer_ids_show_only_at_the_skip_step(diffs):
    """Workers that run other layers than rank 0 (as many: the collectives stay in step) spoil that forward's
    features; every other step is right, since nothing commits the draft's K/V."""
    per_step = diffs["fault:wrong_layer_ids"].steps
    assert per_step[SKIP_STEP] > 1000 * TOLERANCE
    assert max(per_step[:SKIP_STEP] + per_step[SKIP_STEP + 1 :]) < TOLERANCE


def test_unmirrored_copy_shows_only_at_the_copy(diffs):
    """Every step before the copy is right; the one that reads the copied K/V is not."""
    per_step = diffs["fault:unmirrored_copy_prefix"].steps
    assert max(per_step[:-1]) < TOLERANCE and per_step[-1] > 1000 * TOLERANCE


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
