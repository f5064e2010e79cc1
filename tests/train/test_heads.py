"""Training draft heads on the tiny target: each kind learns, saves, reloads and drafts losslessly; resume is
exact; the EAGLE head's cached, step-by-step and tree forwards equal its whole-window training forward."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from specdecode import LLM, SamplingParams
from specdecode.config import ConfigError
from specdecode.heads import HeadConfig, build_heads, load_heads
from specdecode.models.llama import AttentionMetadata, load_llama
from specdecode.train.distill import DistillConfig, distill
from specdecode.verify.tree_layout import tree_layout
from tests.train.conftest import crash_after_checkpoint

SMALL = dict(batch_size=4, seq_len=24, warmup=3, progress=False)


def _cfg(target, data, out, kind, **kw) -> DistillConfig:
    return DistillConfig(
        target=str(target), data=[str(d) for d in data], out=str(out), head=kind, num_head_tokens=2, **{**SMALL, **kw}
    )


@pytest.mark.parametrize("kind", ["medusa", "mtp", "eagle"])
def test_heads_learn_and_reload(kind, tiny_target, train_npz, eval_npz, tmp_path):
    result = distill(_cfg(tiny_target, [train_npz], tmp_path / kind, kind, steps=40, lr=3e-3, eval_data=str(eval_npz)))
    first, last = np.mean(result.losses[:5]), np.mean(result.losses[-5:])
    assert last < 0.8 * first, (first, last)
    assert result.manifest["eval"]["tokens"] > 0
    target = load_llama(tiny_target)
    module, cfg, manifest = load_heads(result.out, target, "cpu", torch.float32)
    assert cfg.kind == kind and manifest["steps"] == 40
    reloaded = load_file(result.out / "heads.safetensors")
    for name, p in module.state_dict().items():
        assert torch.equal(p, reloaded[name]), name
    # the trained heads draft through the engine without changing greedy output
    prompts = [[5, 6, 7, 8, 9, 10], [20, 21, 22]]
    greedy = SamplingParams(max_tokens=20, ignore_eos=True)
    plain = LLM(target=str(tiny_target), method="none").generate(prompts, greedy)
    spec = LLM(
        target=str(tiny_target), draft=str(result.out), method=kind, num_speculative_tokens=6, controller="fixed"
    )
    assert [o.token_ids for o in spec.generate(prompts, greedy)] == [o.token_ids for o in plain]


def test_head_resume_matches_uninterrupted_run(tiny_target, train_npz, tmp_path, monkeypatch):
    straight = distill(_cfg(tiny_target, [train_npz], tmp_path / "a", "medusa", steps=8, save_every=100)).out
    with crash_after_checkpoint(monkeypatch):
        distill(_cfg(tiny_target, [train_npz], tmp_path / "b", "medusa", steps=8, save_every=4))
    resumed = distill(_cfg(tiny_target, [train_npz], tmp_path / "b", "medusa", steps=8, save_every=4, resume=True))
    a, b = load_file(straight / "heads.safetensors"), load_file(resumed.out / "heads.safetensors")
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-6), k
    short = distill(_cfg(tiny_target, [train_npz], tmp_path / "c", "medusa", steps=7, save_every=100)).out
    assert not all(torch.allclose(a[k], load_file(short / "heads.safetensors")[k]) for k in a)  # control


@pytest.fixture(scope="module")
def eagle(tiny_target):
    target = load_llama(tiny_target, inference=False)
    torch.manual_seed(0)
    head = build_heads(HeadConfig("eagle", 1, target.cfg)).eval()
    return target, head


def run_head(head, target, feats, tokens, start, tree=None):
    cache = head.new_cache(1, 64)
    ctx = 5  # the committed context: positions 0..4
    with torch.no_grad():
        meta = AttentionMetadata.build([0], [0], ctx, "cpu")
        head(feats[:, :ctx], tokens[:, :ctx], target.embed, meta, cache)
        if tree is None:
            meta = AttentionMetadata.build([0], [ctx], feats.shape[1] - ctx, "cpu")
            return head(feats[:, ctx:], tokens[:, ctx:], target.embed, meta, cache)
        depth, mask = tree
        meta = AttentionMetadata.build([0], [ctx], depth.shape[1], "cpu", depth, mask)
        return head(feats[:, ctx:], tokens[:, ctx:], target.embed, meta, cache)


def test_eagle_cached_equals_whole_window(eagle):
    target, head = eagle
    g = torch.Generator().manual_seed(1)
    feats = torch.randn(1, 9, target.cfg.hidden_size, generator=g)
    tokens = torch.randint(3, 96, (1, 9), generator=g)
    with torch.no_grad():
        whole = head(feats, tokens, target.embed, AttentionMetadata.build([0], [0], 9, "cpu"), head.new_cache(1, 64))
    assert torch.allclose(run_head(head, target, feats, tokens, 5), whole[:, 5:], atol=1e-5)


def test_eagle_tree_nodes_equal_their_paths(eagle):
    """Tree nodes after a committed context: each equals the chain of its own root-to-node path."""
    target, head = eagle
    g = torch.Generator().manual_seed(2)
    ctx_feats = torch.randn(1, 5, target.cfg.hidden_size, generator=g)
    ctx_tokens = torch.randint(3, 96, (1, 5), generator=g)
    parents = torch.tensor([[0, 0, 1, 2]])  # nodes at tree positions 1..4: 1, 2 under root; 3 under 1; 4 under 2
    node_feats = torch.randn(1, 4, target.cfg.hidden_size, generator=g)
    node_tokens = torch.randint(3, 96, (1, 4), generator=g)
    depth, mask = tree_layout(parents, torch.tensor([4]))
    tree_out = run_head(
        head,
        target,
        torch.cat([ctx_feats, node_feats], 1),
        torch.cat([ctx_tokens, node_tokens], 1),
        5,
        tree=(depth[:, 1:] - 1, mask[:, 1:, 1:]),
    )
    for node, path in {0: [0], 1: [1], 2: [0, 2], 3: [1, 3]}.items():
        f = torch.cat([ctx_feats, node_feats[:, path]], 1)
        t = torch.cat([ctx_tokens, node_tokens[:, path]], 1)
        chain = run_head(head, target, f, t, 5)
        assert torch.allclose(tree_out[0, node], chain[0, -1], atol=1e-5), node


def _drafted_chain(head, target, feats, input_ids, i, steps):
    """What drafting computes behind a committed context ending at i: the head over (f_0..f_i, t_1..t_{i+1}), then
    a chain of nodes each fed its parent's guess and the true next token (as a tree path, see above)."""
    f, tokens, out = feats[:, : i + 1], input_ids[:, 1 : i + 2], []
    for s in range(1, steps + 1):
        meta = AttentionMetadata.build([0], [0], f.shape[1], "cpu")
        guess = head(f, tokens, target.embed, meta, head.new_cache(1, 64))[:, -1:]  # [1, 1, H]
        out.append(guess[0, 0])
        f, tokens = torch.cat([f, guess], 1), torch.cat([tokens, input_ids[:, i + s + 1 : i + s + 2]], 1)
    return out


@pytest.mark.parametrize("fault", [None, "causal levels"])
def test_eagle_unrolled_levels_equal_drafted_chains(fault, eagle, monkeypatch):
    """Training's level s at row i (eagle_steps > 1) is exactly the depth-(s - 1) draft node behind a context
    ending at i. Control: levels that see every earlier level's keys (a plain causal mask) are caught."""
    from specdecode.train import head_objective

    target, head = eagle
    if fault:
        real = head_objective._unrolled_mask

        def causal(n, s, device):
            key = torch.arange(s * n)[None]
            return real(n, s, device) | (((key % n) <= torch.arange(n)[:, None]) & (key < (s - 1) * n))

        monkeypatch.setattr(head_objective, "_unrolled_mask", causal)
    g = torch.Generator().manual_seed(3)
    t, steps = 12, 3
    feats = torch.randn(2, t, target.cfg.hidden_size, generator=g)  # [B, T, H]
    input_ids = torch.randint(3, 96, (2, t), generator=g)  # [B, T]
    with torch.no_grad():
        levels = head_objective.eagle_unrolled(head, feats, input_ids, target.embed, steps)  # steps x [B, T - 1, H]
        worst = 0.0
        for b in range(2):
            for i in range(t - steps):
                chain = _drafted_chain(head, target, feats[b : b + 1], input_ids[b : b + 1], i, steps)
                for s in range(steps):
                    worst = max(worst, (levels[s][b, i] - chain[s]).abs().max().item())
    if fault:
        assert worst > 1e-2, worst
    else:
        assert worst < 1e-5, worst


def test_eagle_steps_train_and_record(tiny_target, train_npz, tmp_path):
    """--eagle-steps 3 trains (the loss falls) and reports a top-1 agreement per level; --init-heads starts from
    trained heads, so its first steps' loss is far below a cold start's (which is its control)."""
    first = distill(_cfg(tiny_target, [train_npz], tmp_path / "a", "eagle", steps=30, lr=3e-3, eagle_steps=3))
    first_loss, last_loss = np.mean(first.losses[:5]), np.mean(first.losses[-5:])
    assert last_loss < 0.8 * first_loss, (first_loss, last_loss)
    assert len(first.manifest["final_accuracy"]) == 3 and first.manifest["eagle_steps"] == 3
    init = dict(steps=5, lr=3e-3, eagle_steps=3, bf16=True)  # the levels under autocast too
    warm = distill(_cfg(tiny_target, [train_npz], tmp_path / "b", "eagle", init_heads=str(first.out), **init))
    cold = distill(_cfg(tiny_target, [train_npz], tmp_path / "c", "eagle", **init))
    assert np.mean(warm.losses) < 0.8 * np.mean(cold.losses), (np.mean(warm.losses), np.mean(cold.losses))
    with pytest.raises(ConfigError, match="holds 1 eagle head"):
        distill(_cfg(tiny_target, [train_npz], tmp_path / "d", "medusa", steps=1, init_heads=str(first.out)))
