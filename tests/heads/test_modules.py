"""Head modules on a tiny in-memory target (no files, no engine): untrained Medusa heads echo the LM head,
save -> load gives the same outputs, files for another target or of an unknown kind are ConfigErrors, the EAGLE
layer's gradients are exact through its KV-cache writes, its rows are independent in a ragged batch, and
token-by-token decoding equals the whole-window forward that training uses."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from torch import nn

from specdecode.config import ConfigError
from specdecode.heads import HeadConfig, build_heads, load_heads, save_heads
from specdecode.models.llama import AttentionMetadata, LlamaConfig, LlamaModel

TINY = LlamaConfig(
    model_type="llama",
    vocab_size=96,
    hidden_size=32,
    intermediate_size=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    rope_theta=10000.0,
    rms_eps=1e-5,
    max_position=512,
    tie_embeddings=False,
    qkv_bias=False,
    o_bias=False,
    qk_norm=False,
)


def random_heads(kind: str, num_heads: int = 3, seed: int = 0) -> tuple[nn.Module, HeadConfig]:
    cfg = HeadConfig(kind, 1 if kind == "eagle" else num_heads, TINY)
    torch.manual_seed(seed)
    heads = build_heads(cfg)
    with torch.no_grad():  # move off the zero/identity start so every weight matters
        for p in heads.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return heads.eval(), cfg


def outputs(kind: str, heads: nn.Module, embed: nn.Embedding) -> list[torch.Tensor]:
    """Every output the drafters read, on fixed random inputs."""
    g = torch.Generator().manual_seed(3)
    feats = torch.randn(2, 6, TINY.hidden_size, generator=g)  # [B, T, H]
    tokens = torch.randint(0, TINY.vocab_size, (2, 6), generator=g)  # [B, T]
    with torch.no_grad():
        if kind == "medusa":
            return [heads(feats)]  # [B, T, K, H]
        if kind == "mtp":
            return [heads.forward_step(d, feats, tokens, embed) for d in range(len(heads.modules_by_depth))]
        meta = AttentionMetadata.build([0, 1], [0, 0], 6, "cpu")
        return [heads(feats, tokens, embed, meta, heads.new_cache(2, 16))]  # [B, T, H]


def test_untrained_medusa_heads_echo_the_feature():
    heads = build_heads(HeadConfig("medusa", 4, TINY))
    h = torch.randn(5, TINY.hidden_size)  # [N, H]
    out = heads(h)  # [N, 4, H]
    assert out.shape == (5, 4, TINY.hidden_size)
    assert torch.equal(out, h[:, None].expand(-1, 4, -1))  # so lm_head(head k) == lm_head(feature) at the start


@pytest.mark.parametrize("kind", ["eagle", "medusa", "mtp"])
def test_save_load_gives_the_same_outputs(kind, tmp_path):
    torch.manual_seed(1)
    target = LlamaModel(TINY)
    heads, cfg = random_heads(kind)
    save_heads(heads, cfg, tmp_path / kind, {"note": "test"})
    loaded, loaded_cfg, manifest = load_heads(tmp_path / kind, target, "cpu", torch.float32)
    assert loaded_cfg == cfg and manifest == {"note": "test"}
    for a, b in zip(outputs(kind, heads, target.embed), outputs(kind, loaded, target.embed), strict=True):
        assert torch.equal(a, b)
    fresh, _ = random_heads(kind, seed=1)  # control: other weights give other outputs
    assert not torch.equal(outputs(kind, fresh, target.embed)[0], outputs(kind, loaded, target.embed)[0])


@pytest.mark.parametrize(
    "change", [{"vocab_size": 128}, {"hidden_size": 48}, {"num_layers": 3}], ids=["vocab", "hidden", "layers"]
)
def test_heads_for_another_target_are_a_config_error(change, tmp_path):
    heads, cfg = random_heads("mtp")
    save_heads(heads, cfg, tmp_path / "mtp", {})
    with pytest.raises(ConfigError, match="trained for a target"):
        load_heads(tmp_path / "mtp", LlamaModel(replace(TINY, **change)), "cpu", torch.float32)


def test_bad_head_files_are_config_errors(tmp_path):
    target = LlamaModel(TINY)
    with pytest.raises(ConfigError, match="not a head directory"):
        load_heads(tmp_path / "missing", target, "cpu", torch.float32)
    heads, cfg = random_heads("medusa")
    out = save_heads(heads, cfg, tmp_path / "medusa", {})
    data = json.loads((out / "head.json").read_text())
    data["config"]["kind"] = "hydra"
    (out / "head.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="unknown head kind 'hydra'"):
        load_heads(out, target, "cpu", torch.float32)
    data["config"]["kind"], data["config"]["num_heads"] = "medusa", 5  # more heads than the weights hold
    (out / "head.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="weights do not fit"):
        load_heads(out, target, "cpu", torch.float32)
    (out / "heads.safetensors").unlink()
    with pytest.raises(ConfigError, match="not a head directory"):
        load_heads(out, target, "cpu", torch.float32)
    with pytest.raises(ConfigError, match="unknown head kind"):
        HeadConfig("hydra", 1, TINY)
    with pytest.raises(ConfigError, match="num_heads"):
        HeadConfig("medusa", 0, TINY)


def test_eagle_gradients_are_exact_through_the_cache_writes():
    """Training runs the decode forward, which writes K/V into the cache by index assignment and attends to the
    cache: autograd must flow through those writes. Checked against central differences in float64 along random
    directions (eps 3e-3, not smaller: RMSNorm rounds through float32 on purpose, ~1e-3 noise at eps 1e-3).
    With the K/V written detached the two disagree by ~10%, far outside the tolerance."""
    heads, _ = random_heads("eagle")
    heads = heads.double()
    embed = nn.Embedding(TINY.vocab_size, TINY.hidden_size).double()
    g = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, TINY.vocab_size, (2, 4), generator=g)  # [B, T]
    meta = AttentionMetadata.build([0, 1], [0, 0], 4, "cpu")
    feats = torch.randn(2, 4, TINY.hidden_size, dtype=torch.float64, generator=g, requires_grad=True)  # [B, T, H]
    weights = torch.randn(2, 4, TINY.hidden_size, dtype=torch.float64, generator=g)  # [B, T, H] a random loss

    def loss(f: torch.Tensor) -> torch.Tensor:
        return (heads(f, tokens, embed, meta, heads.new_cache(2, 4)) * weights).sum()

    (grad,) = torch.autograd.grad(loss(feats), feats)  # [B, T, H]
    eps = 3e-3
    for _ in range(3):
        d = torch.randn(feats.shape, dtype=torch.float64, generator=g)  # [B, T, H]
        with torch.no_grad():
            numeric = (loss(feats + eps * d) - loss(feats - eps * d)) / (2 * eps)
        assert torch.allclose((grad * d).sum(), numeric, rtol=1e-3, atol=5e-3), ((grad * d).sum(), numeric)


def test_eagle_ragged_batch_rows_equal_rows_alone():
    """Two slots with different cached lengths, continued in one call, equal each row's own whole window."""
    heads, _ = random_heads("eagle")
    embed = nn.Embedding(TINY.vocab_size, TINY.hidden_size)
    g = torch.Generator().manual_seed(4)
    lens = [5, 3]
    feats = [torch.randn(1, n + 2, TINY.hidden_size, generator=g) for n in lens]  # [1, n + 2, H] per row
    tokens = [torch.randint(0, TINY.vocab_size, (1, n + 2), generator=g) for n in lens]  # [1, n + 2]
    cache = heads.new_cache(2, 16)
    with torch.no_grad():
        alone = [
            heads(f, t, embed, AttentionMetadata.build([0], [0], f.shape[1], "cpu"), heads.new_cache(1, 16))
            for f, t in zip(feats, tokens, strict=True)
        ]
        for slot, (f, t, n) in enumerate(zip(feats, tokens, lens, strict=True)):
            heads(f[:, :n], t[:, :n], embed, AttentionMetadata.build([slot], [0], n, "cpu"), cache)
        new_f = torch.cat([f[:, n:] for f, n in zip(feats, lens, strict=True)])  # [2, 2, H]
        new_t = torch.cat([t[:, n:] for t, n in zip(tokens, lens, strict=True)])  # [2, 2]
        batched = heads(new_f, new_t, embed, AttentionMetadata.build([0, 1], lens, 2, "cpu"), cache)  # [2, 2, H]
    for row, n in enumerate(lens):
        assert torch.allclose(batched[row], alone[row][0, n:], atol=1e-5), row


@pytest.mark.parametrize("batch", [1, 2])
def test_eagle_token_by_token_equals_whole_window(batch):
    """Drafting feeds one token per call (at batch 1 with no mask at all); training feeds the whole window."""
    heads, _ = random_heads("eagle")
    embed = nn.Embedding(TINY.vocab_size, TINY.hidden_size)
    g = torch.Generator().manual_seed(6)
    feats = torch.randn(batch, 7, TINY.hidden_size, generator=g)  # [B, T, H]
    tokens = torch.randint(0, TINY.vocab_size, (batch, 7), generator=g)  # [B, T]
    slots = list(range(batch))
    with torch.no_grad():
        whole = heads(
            feats, tokens, embed, AttentionMetadata.build(slots, [0] * batch, 7, "cpu"), heads.new_cache(batch, 16)
        )
        cache = heads.new_cache(batch, 16)
        steps = [
            heads(
                feats[:, i : i + 1],
                tokens[:, i : i + 1],
                embed,
                AttentionMetadata.build(slots, [i] * batch, 1, "cpu"),
                cache,
            )
            for i in range(7)
        ]  # each [B, 1, H]
    assert torch.allclose(torch.cat(steps, 1), whole, atol=1e-5)
