"""Tensor parallelism for the Llama family: one model split across ranks (Megatron-style, as gpt-fast's tp.py).

`shard_llama` turns a loaded `LlamaModel` into this rank's shard, in place, without another model class:

- attention: q/k/v (fused `wqkv`) is column-parallel by key/value head group: a rank keeps its kv heads and
  the query heads that read them, so grouped-query attention stays local and the KV cache holds only the
  rank's kv heads. `o_proj` (`wo`) is row-parallel: each rank multiplies its heads' slice of the input
  features, one all-reduce sums the partial outputs, and the bias (if any) is added once, after the sum;
- MLP: gate/up (fused `w13`) column-parallel by intermediate columns, `down_proj` (`w2`) row-parallel with one
  all-reduce;
- LM head: vocab-parallel (each rank scores a contiguous block of vocabulary rows) and gathered on rank 0,
  the only rank that samples; the embedding, norms and RoPE table stay whole on every rank. Drafters on rank 0
  that score features themselves get `whole_lm_head`, beside the shard and free of collectives.

The modules read their sizes from the config they are given, so the shard's `cfg` describes the shard: its
query heads, kv heads and intermediate size are this rank's, while hidden and vocabulary sizes stay whole
(the logits come back whole). Attention and MLP code is untouched; the collectives live in two small wrapper
modules at the row-parallel linears and the head.

Heads and columns are split as evenly as the model allows rather than only when they divide: SmolLM2-135M has
3 kv heads, so at two ranks one rank holds 2 kv heads (6 query heads) and the other 1 (3). Each rank needs at
least one kv head. Uneven ranks compute uneven shares of attention; pick a rank count that divides the kv
heads where speed matters.

Each rank reads the whole checkpoint on the CPU and keeps its slice (fine at these sizes; reading only the
slices from safetensors would bound peak memory for big models). A world of one is never sharded: the
single-process path does no extra work.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors import safe_open
from torch import nn

from specdecode.config import ConfigError
from specdecode.models import fp32_linears
from specdecode.models.llama import LlamaConfig, LlamaModel, UnsupportedModelError, load_llama

LM_HEAD = "lm_head.weight"  # an untied head's name in a Hugging Face checkpoint


def shard_range(n: int, rank: int, world: int) -> tuple[int, int]:
    """[lo, hi) of `n` items for this rank: contiguous blocks whose sizes differ by at most one."""
    return n * rank // world, n * (rank + 1) // world


def check_shardable(cfg: LlamaConfig, world: int) -> None:
    """A clear error before any process starts when the model can't be split `world` ways."""
    if world < 1:
        raise ConfigError(f"tensor_parallel_size must be >= 1, got {world}")
    if cfg.num_kv_heads < world:
        raise ConfigError(
            f"tensor_parallel_size {world} is more than the model's {cfg.num_kv_heads} key/value heads: "
            "each rank needs at least one"
        )


def shard_config(cfg: LlamaConfig, rank: int, world: int) -> LlamaConfig:
    """This rank's config: its query heads, kv heads and intermediate size; the rest whole."""
    kv_lo, kv_hi = shard_range(cfg.num_kv_heads, rank, world)
    group = cfg.num_heads // cfg.num_kv_heads  # query heads per kv head
    lo, hi = shard_range(cfg.intermediate_size, rank, world)
    return dataclasses.replace(
        cfg, num_heads=(kv_hi - kv_lo) * group, num_kv_heads=kv_hi - kv_lo, intermediate_size=hi - lo
    )


class RowParallelLinear(nn.Module):
    """A linear over this rank's slice of the input features: the partial outputs are summed across ranks
    (one all-reduce) and the bias is added once, after the sum."""

    def __init__(self, linear: nn.Linear, bias: torch.Tensor | None, group: dist.ProcessGroup | None) -> None:
        super().__init__()
        self.linear = linear  # bias-free; its inference kernel may replace it (models/fp32_linears.py)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)  # [out]
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.linear(x)  # [..., out] this rank's share of the sum
        dist.all_reduce(out, group=self.group)
        return out if self.bias is None else out + self.bias


class VocabParallelHead(nn.Module):
    """The LM head by vocabulary blocks of equal size (the last padded with zero rows): rank 0 gathers the
    blocks into the full logits; the other ranks return their own block (only rank 0 samples)."""

    def __init__(self, weight: torch.Tensor, rank: int, world: int, group: dist.ProcessGroup | None) -> None:
        super().__init__()
        vocab, hidden = weight.shape
        rows = -(-vocab // world)  # ceil: gather needs equal blocks
        block = weight[rank * rows : (rank + 1) * rows]  # [<= rows, hidden]
        padded = torch.zeros(rows, hidden, dtype=weight.dtype, device=weight.device)
        padded[: block.shape[0]] = block
        self.linear = _linear(padded)  # [rows, hidden]
        self.vocab_size, self.rank, self.world, self.group = vocab, rank, world, group

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        local = self.linear(hidden)  # [rows, vocab block]
        blocks = [torch.empty_like(local) for _ in range(self.world)] if self.rank == 0 else None
        dist.gather(local, blocks, dst=0, group=self.group)
        return local if blocks is None else torch.cat(blocks, dim=-1)[:, : self.vocab_size]  # [rows, vocab]


def _linear(weight: torch.Tensor, bias: torch.Tensor | None = None) -> nn.Linear:
    """An nn.Linear holding exactly these (sliced) tensors (built on the meta device: no wasted init)."""
    out_features, in_features = weight.shape
    lin = nn.Linear(in_features, out_features, bias=bias is not None, device="meta")
    lin.weight = nn.Parameter(weight.contiguous(), requires_grad=False)
    if bias is not None:
        lin.bias = nn.Parameter(bias.contiguous(), requires_grad=False)
    return lin


def _query_range(cfg: LlamaConfig, rank: int, world: int) -> tuple[int, int]:
    """[lo, hi) of this rank's query features (the q rows of wqkv, the input columns of wo): the query heads
    that read its kv heads."""
    kv_lo, kv_hi = shard_range(cfg.num_kv_heads, rank, world)
    per_kv = cfg.num_heads // cfg.num_kv_heads * cfg.head_dim  # query features per kv head
    return kv_lo * per_kv, kv_hi * per_kv


def _qkv_rows(cfg: LlamaConfig, rank: int, world: int) -> torch.Tensor:
    """Indices of this rank's rows of the fused [q; k; v] weight: its query heads' rows, its kv heads' k and v."""
    kv_lo, kv_hi = shard_range(cfg.num_kv_heads, rank, world)
    q_dim, kv_dim = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    kv = torch.arange(kv_lo * cfg.head_dim, kv_hi * cfg.head_dim)
    return torch.cat([torch.arange(*_query_range(cfg, rank, world)), q_dim + kv, q_dim + kv_dim + kv])


def _shard_attention(attn: nn.Module, cfg: LlamaConfig, rank: int, world: int, group) -> None:
    qkv = _qkv_rows(cfg, rank, world)  # [rows of wqkv kept]
    q_lo, q_hi = _query_range(cfg, rank, world)
    bias = None if attn.wqkv.bias is None else attn.wqkv.bias[qkv]
    attn.wqkv = _linear(attn.wqkv.weight[qkv], bias)  # [this rank's q + 2 kv rows, hidden]
    wo_bias = None if attn.wo.bias is None else attn.wo.bias.detach()
    attn.wo = RowParallelLinear(_linear(attn.wo.weight[:, q_lo:q_hi]), wo_bias, group)  # [hidden, its q features]
    attn.cfg = shard = shard_config(cfg, rank, world)  # forward reads its head counts from here
    q_dim, kv_dim = shard.num_heads * shard.head_dim, shard.num_kv_heads * shard.head_dim
    attn.split = (q_dim, kv_dim, kv_dim)


def _shard_mlp(mlp: nn.Module, cfg: LlamaConfig, rank: int, world: int, group) -> None:
    lo, hi = shard_range(cfg.intermediate_size, rank, world)
    inner = cfg.intermediate_size
    w13 = mlp.w13.weight  # [gate; up] = [2 * inner, hidden]
    mlp.w13 = _linear(torch.cat([w13[lo:hi], w13[inner + lo : inner + hi]]))  # [2 * its columns, hidden]
    mlp.w2 = RowParallelLinear(_linear(mlp.w2.weight[:, lo:hi]), None, group)  # [hidden, its columns]


@torch.no_grad()
def shard_llama(model: LlamaModel, rank: int, world: int, group: dist.ProcessGroup | None = None) -> LlamaModel:
    """Keep this rank's shard of every layer and of the LM head, in place; returns the model.

    The model must hold plain nn.Linear layers (load it with `inference=False`; pack after sharding).
    `group` is the process group the collectives run on (None: the default group).
    """
    cfg = model.cfg
    check_shardable(cfg, world)
    for layer in model.layers:
        _shard_attention(layer.attn, cfg, rank, world, group)
        _shard_mlp(layer.mlp, cfg, rank, world, group)
    # A tied head gets its own block: the embedding stays whole (every rank embeds every token).
    model.lm_head = VocabParallelHead(model.lm_head.weight.detach(), rank, world, group)
    model.cfg = shard_config(cfg, rank, world)  # new_cache sizes the rank's KV cache from this
    return model


def load_sharded_llama(
    model_dir: str | Path,
    rank: int,
    world: int,
    device: str | torch.device,
    dtype: torch.dtype,
    group: dist.ProcessGroup | None = None,
) -> LlamaModel:
    """This rank's shard, on `device`: loaded on the CPU, sliced there (so a GPU never holds the whole model),
    moved, then given fp32 CPU linears' inference kernels as `load_llama` does."""
    model = shard_llama(load_llama(model_dir, "cpu", dtype, inference=False), rank, world, group)
    model.to(device)  # no dtype: the RoPE table stays fp32
    fp32_linears.install(model, torch.device(device), dtype)
    return model.requires_grad_(False)


@torch.no_grad()
def whole_lm_head(shard: LlamaModel, model_dir: str | Path, tied: bool) -> nn.Module:
    """The unsharded LM head [vocab, hidden] beside a shard, with no collective, with the kernel `load_llama` gives the
    single process's: the shard's embedding when the model ties them (it is whole on every rank), else the
    checkpoint's head, read alone and cast to the shard's device and dtype."""
    like = shard.embed.weight  # [vocab, hidden]
    weight = like if tied else _read_tensor(Path(model_dir), LM_HEAD).to(device=like.device, dtype=like.dtype)
    holder = nn.Sequential(_linear(weight))
    fp32_linears.install(holder, like.device, like.dtype)
    return holder[0].requires_grad_(False)


def _read_tensor(model_dir: Path, name: str) -> torch.Tensor:
    """One tensor of a (possibly multi-file) safetensors checkpoint, without reading the others."""
    for path in sorted(model_dir.glob("*.safetensors")):
        with safe_open(path, framework="pt") as f:
            if name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                return f.get_tensor(name)
    raise UnsupportedModelError(f"{model_dir}: missing weight {name}")
