"""The Llama family in plain PyTorch: Llama/SmolLM2, Mistral, Qwen2 (q/k/v bias) and Qwen3 (q/k norm).

One `forward` serves a ragged batch: row b holds `num_new[b]` new tokens (padded to T) that continue slot
`slots[b]` of the KV cache from `start[b]`. Positions and the optional tree mask come in explicitly with
`AttentionMetadata`; nothing is stored on the model between calls except the cache it is given.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from specdecode.kv import KVCache
from specdecode.models import fp32_linears
from specdecode.models.attention import attend_fn

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


class UnsupportedModelError(ValueError):
    """The checkpoint's architecture or options are outside what this runtime implements."""


@dataclass(frozen=True)
class LlamaConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rms_eps: float
    max_position: int
    tie_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    qk_norm: bool
    sliding_window: int | None = None
    eos_token_id: int | list[int] | None = None

    @classmethod
    def from_dir(cls, model_dir: Path) -> LlamaConfig:
        """The config of a Hugging Face directory's config.json."""
        return cls.from_hf(json.loads((Path(model_dir) / "config.json").read_text()))

    @classmethod
    def from_hf(cls, cfg: dict) -> LlamaConfig:
        model_type = cfg.get("model_type", "")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedModelError(
                f"unsupported architecture {model_type!r}; expected one of {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise UnsupportedModelError(f"unsupported rope type {rope_type!r}; only the default RoPE is implemented")
        heads = cfg["num_attention_heads"]
        attention_bias = bool(cfg.get("attention_bias", False))
        use_window = cfg.get("use_sliding_window", model_type == "mistral")
        return cls(
            model_type=model_type,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rope_theta=float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))),
            rms_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            max_position=cfg.get("max_position_embeddings", 2048),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=model_type == "qwen2" or attention_bias,
            o_bias=attention_bias,
            qk_norm=model_type == "qwen3",
            sliding_window=cfg.get("sliding_window") if use_window else None,
            eos_token_id=cfg.get("eos_token_id"),
        )

    @property
    def context_limit(self) -> int:
        """Longest exact context: full attention equals sliding-window attention only inside the window."""
        return min(self.max_position, self.sliding_window or self.max_position)


@dataclass
class AttentionMetadata:
    """Where a ragged batch of new tokens sits in the cache. Built by the engine, passed explicitly."""

    slots: torch.Tensor  # [num_seqs] int64 cache slot of each row
    start: torch.Tensor  # [num_seqs] int64 cached tokens before this call; new token i is written at start + i
    positions: torch.Tensor  # [num_seqs, T] int64 RoPE positions (start + i for chains, start + depth for trees)
    kv_len: int  # keys attended: max over rows of start + T (a python int, so no host sync), capped by the cache
    # [num_seqs, T] int64 cache index each new token's K/V is written at; -1 for a row's padding, which lands in
    # the cache's scratch column (KVCache keeps one past max_len) so padding never writes past a slot.
    write_pos: torch.Tensor
    tree_mask: torch.Tensor | None = None  # [num_seqs, T, T] bool: new token i may attend to new token j

    @classmethod
    def build(
        cls,
        slots: list[int],
        start: list[int],
        num_tokens: int,
        device: torch.device | str,
        tree_depth: torch.Tensor | None = None,
        tree_mask: torch.Tensor | None = None,
        num_new: torch.Tensor | list[int] | None = None,
        max_len: int | None = None,
        shift: list[int] | None = None,
    ) -> AttentionMetadata:
        """Metadata for `num_tokens` new tokens per row (rows are padded to that many by the caller).

        num_new: real tokens per row ([num_seqs]; None = all `num_tokens`); the rest is padding, written to the
        scratch column. max_len: the cache's length; keys past it are never attended (only padding sits there).
        shift: per row, a token's position less its cache index (a windowed draft's cache; None = 0): only RoPE
        sees positions, the causal mask orders cache indices.
        """
        start_t = torch.tensor(start, dtype=torch.long, device=device)
        steps = torch.arange(num_tokens, device=device)  # [T]
        offsets = steps if tree_depth is None else tree_depth
        write_pos = start_t[:, None] + steps  # [num_seqs, T]
        if num_new is not None:
            num_new_t = torch.as_tensor(num_new, dtype=torch.long, device=device)  # [num_seqs]
            write_pos = torch.where(steps[None] < num_new_t[:, None], write_pos, -1)
        kv_len = max(start) + num_tokens
        first = start_t if shift is None else start_t + torch.tensor(shift, dtype=torch.long, device=device)
        return cls(
            slots=torch.tensor(slots, dtype=torch.long, device=device),
            start=start_t,
            positions=first[:, None] + offsets,
            kv_len=kv_len if max_len is None else min(kv_len, max_len),
            write_pos=write_pos,
            tree_mask=tree_mask,
        )

    def additive_mask(self, num_tokens: int, dtype: torch.dtype) -> torch.Tensor:
        """[num_seqs, 1, T, kv_len] 0 where a query attends, -inf where not: built once per forward.

        Its last dimension is the attended length, so the attention op needs no host integer (models/attention.py).
        """
        return additive(self.attention_mask(num_tokens), dtype)  # [num_seqs, 1, T, kv_len]

    def attention_mask(self, num_tokens: int) -> torch.Tensor:
        """[num_seqs, 1, T, kv_len] bool, True = attend."""
        key_pos = torch.arange(self.kv_len, device=self.start.device)  # [kv_len]
        query_pos = self.start[:, None] + torch.arange(num_tokens, device=self.start.device)  # [num_seqs, T]
        mask = key_pos[None, None, :] <= query_pos[:, :, None]  # [num_seqs, T, kv_len] causal by cache index
        if self.tree_mask is not None:
            rel = key_pos[None, :] - self.start[:, None]  # [num_seqs, kv_len] index among the new tokens
            in_new = (rel >= 0) & (rel < num_tokens)
            tree = torch.gather(
                self.tree_mask, 2, rel.clamp(0, num_tokens - 1)[:, None, :].expand(-1, num_tokens, -1)
            )  # [num_seqs, T, kv_len]
            mask = torch.where(in_new[:, None, :], tree, mask)
        return mask[:, None]


def additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A bool attention mask (True = attend) as an additive one in `dtype`: 0 where allowed, -inf elsewhere."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, float("-inf"))


@dataclass
class StepFunctions:
    """The two halves of a forward: `body` (tokens to normed hidden states) and `head` (hidden to logits),
    eager methods or their compiled versions. Chosen once when the model is loaded, never per call."""

    body: Callable[..., torch.Tensor]
    head: Callable[[torch.Tensor], torch.Tensor]
    compiled: bool = False
    # Forwards over more than `max_rows` tokens (big batches, prefill chunks) go to `large` instead: past a few
    # dozen rows the GEMM is compute-bound and the eager packed linears win (models/compiled.py).
    max_rows: int | None = None
    large: StepFunctions | None = None

    def for_rows(self, rows: int) -> StepFunctions:
        return self.large if self.large is not None and rows > self.max_rows else self


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:  # one op, bitwise the reference below in fp32
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        # Normalise in fp32 like the reference implementation, so bf16 runs don't drift.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rope_inv_freq(cfg: LlamaConfig) -> torch.Tensor:
    return 1.0 / cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float32) / cfg.head_dim)


def rope_tables(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sign-folded sin [num_seqs, T, 1, head_dim] for `apply_rope`, built once per forward.

    positions: [num_seqs, T] int64; inv_freq: [head_dim / 2] float32.
    """
    freqs = positions[..., None].float() * inv_freq  # [num_seqs, T, head_dim / 2]
    cos, sin = freqs.cos(), freqs.sin()
    cos = torch.cat((cos, cos), dim=-1)[:, :, None]  # [num_seqs, T, 1, head_dim]
    sin = torch.cat((-sin, sin), dim=-1)[:, :, None]  # rotate_half's sign folded in
    return cos.to(dtype), sin.to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [num_seqs, T, heads, head_dim] rotated: x * cos + rotate_half(x) * sin, in three ops.

    Swapping the two halves (a roll by head_dim / 2) with the sign in `sin` is rotate_half.
    """
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), sin)


def packs_rows(device: torch.device) -> bool:
    """Whether a forward runs its linears on the real tokens alone (`real_rows`): on CPU, where a padded token
    costs what a real one does (a verify padded to its widest row: one row's draft at batch 8 verified 16 tokens
    where 9 are real, ~1.8x the step); not on CUDA, whose graphs are captured for padded shapes."""
    return device.type == "cpu"


def real_rows(write_pos: torch.Tensor) -> torch.Tensor:
    """write_pos [num_seqs, T] (-1: padding) -> [N] int64 flat indices b * T + i of the real tokens, in order."""
    return (write_pos.flatten() >= 0).nonzero().squeeze(1)


def to_rows(x: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
    """x [num_seqs, T, ...] -> [N, ...] its real tokens (rows: their flat indices b * T + i; None: all of them)."""
    flat = x.flatten(0, 1)  # [num_seqs * T, ...]
    return flat if rows is None else flat.index_select(0, rows)


def to_batch(x: torch.Tensor, rows: torch.Tensor | None, num_seqs: int, num_tokens: int) -> torch.Tensor:
    """x [N, ...] real tokens -> [num_seqs, T, ...] with zeros at the padding (the inverse of `to_rows`)."""
    if rows is not None:
        x = x.new_zeros(num_seqs * num_tokens, *x.shape[1:]).index_copy(0, rows, x)  # [num_seqs * T, ...]
    return x.view(num_seqs, num_tokens, *x.shape[1:])


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.cfg = cfg
        q_dim, kv_dim = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        # q, k and v in one matmul: one weight read instead of three (gpt-fast's wqkv).
        self.wqkv = nn.Linear(cfg.hidden_size, q_dim + 2 * kv_dim, bias=cfg.qkv_bias)
        self.wo = nn.Linear(q_dim, cfg.hidden_size, bias=cfg.o_bias)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_eps) if cfg.qk_norm else None
        self.split = (q_dim, kv_dim, kv_dim)

    def forward(
        self,
        x: torch.Tensor,  # [N, hidden] the real tokens (`rows`), or [num_seqs, T, hidden] (rows None)
        cos: torch.Tensor,  # [num_seqs, T, 1, head_dim]
        sin: torch.Tensor,  # [num_seqs, T, 1, head_dim] sign-folded (rope_tables)
        cache_k: torch.Tensor,  # [layers, slots, kv_heads, len + 1, head_dim] the whole cache
        cache_v: torch.Tensor,  # [layers, slots, kv_heads, len + 1, head_dim]
        layer: int,  # this layer's index into the cache
        slots: torch.Tensor,  # [num_seqs] int64
        write_pos: torch.Tensor,  # [num_seqs, T] int64
        mask: torch.Tensor,  # [num_seqs, 1, T, kv_len] additive float (0 or -inf)
        rows: torch.Tensor | None = None,  # [N] int64 flat indices (b * T + i) of x's tokens; None: x is padded
    ) -> torch.Tensor:
        """[N, hidden] (or [num_seqs, T, hidden], as x). The projections run on the real tokens only; RoPE and
        attention on the padded batch, whose padding (zeros) writes the scratch column and is dropped."""
        cfg = self.cfg
        b, t = write_pos.shape
        heads, kv_heads = cfg.num_heads, cfg.num_kv_heads
        qkv = to_batch(self.wqkv(x.reshape(-1, x.shape[-1])), rows, b, t)  # [num_seqs, T, q + 2 kv dims]
        qkv = qkv.view(b, t, heads + 2 * kv_heads, cfg.head_dim)  # [num_seqs, T, all heads, head_dim]
        if self.q_norm is None:
            qk = apply_rope(qkv[:, :, : heads + kv_heads], cos, sin)  # q and k rotated in one go
            q, k = qk[:, :, :heads], qk[:, :, heads:]
        else:  # Qwen3 normalises each head of q and k (own weights) before RoPE
            q = apply_rope(self.q_norm(qkv[:, :, :heads]), cos, sin)
            k = apply_rope(self.k_norm(qkv[:, :, heads : heads + kv_heads]), cos, sin)
        v = qkv[:, :, heads + kv_heads :]  # [num_seqs, T, kv_heads, head_dim]
        out = attend_fn()(q, k, v, cache_k, cache_v, layer, slots, write_pos, mask)  # [num_seqs, T, heads * head_dim]
        return self.wo(to_rows(out, rows)).view(x.shape)  # as x


class MLP(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.w13 = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)  # gate and up fused
        self.w2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w13(x).chunk(2, dim=-1)
        return self.w2(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, *attn_args) -> torch.Tensor:
        """x [N, hidden] real tokens (attn_args end with their `rows`) or [num_seqs, T, hidden]; the same out."""
        x = x + self.attn(self.attn_norm(x), *attn_args)
        return x + self.mlp(self.mlp_norm(x))


class LlamaModel(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        self.register_buffer("inv_freq", rope_inv_freq(cfg), persistent=False)  # [head_dim / 2]
        # The KV cache's dtype where it is not the activations' (models/kv_dtype.py: bf16 under the fast arithmetic)
        self.kv_dtype: torch.dtype | None = None
        self.step = StepFunctions(self.body, self.head)  # eager until models/compiled.py swaps in compiled ones

    @property
    def device(self) -> torch.device:
        """Where the model's activations live: its final norm's (a dense vector in every form of the model, where
        the embedding may be GGUF blocks, models/quant_rows.QuantEmbedding, with no dense `weight`)."""
        return self.norm.weight.device

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the model's activations and KV cache (its final norm's)."""
        return self.norm.weight.dtype

    def lm_head_weight(self) -> torch.Tensor:
        """[vocab, hidden] the LM head as a dense tensor (on CPU the runtime may also keep a packed copy)."""
        if hasattr(self.lm_head, "dequantized"):  # GGUF blocks (models/gguf_quantized.py): dense on demand
            return self.lm_head.dequantized()
        w = self.lm_head.weight
        return w.to_dense() if w.is_mkldnn else w

    def new_cache(self, num_slots: int, max_len: int) -> KVCache:
        cfg = self.cfg
        dtype = self.kv_dtype or self.dtype
        shape = (cfg.num_layers, num_slots, max_len, cfg.num_kv_heads, cfg.head_dim)
        return KVCache(*shape, device=self.device, dtype=dtype)

    def forward(
        self,
        tokens: torch.Tensor,  # [num_seqs, T] int64, rows padded past their new tokens
        meta: AttentionMetadata,
        cache: KVCache,
        logits_index: torch.Tensor | None = None,  # [num_seqs, n] which of the T positions need logits
        return_hidden: bool = False,
        layer_ids: Sequence[int] | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Logits [num_seqs, n or T, vocab] in fp32 (and final hidden states [num_seqs, T, hidden]).

        layer_ids runs only those layers (in order), each on its own slice of `cache`: self-speculation by
        layer skipping drafts this way through the target's weights and K/V (always eager).
        """
        mask = meta.additive_mask(tokens.shape[1], self.dtype)  # [num_seqs, 1, T, kv_len]
        args = (tokens, meta.positions, meta.slots, meta.write_pos, mask, cache.k, cache.v)
        rows = real_rows(meta.write_pos) if packs_rows(self.device) else None  # [N]
        args += () if rows is None else (rows,)
        step = self.step.for_rows(tokens.numel() if rows is None else len(rows))
        if layer_ids is None:
            hidden = step.body(*args)  # [num_seqs, T, hidden]
        else:
            hidden = self.body(*args, layer_ids=layer_ids)
        picked = (
            hidden
            if logits_index is None
            else torch.gather(hidden, 1, logits_index[..., None].expand(-1, -1, hidden.shape[-1]))
        )  # [num_seqs, n, hidden]
        b, n, _ = picked.shape
        if n == 0:  # the caller scores hidden states itself (layer-skip probes)
            logits = picked.new_empty(b, 0, self.cfg.vocab_size, dtype=torch.float32)
        elif rows is not None and logits_index is None and len(rows) < b * n:  # the padding's logits are zeros
            logits = to_batch(step.head(to_rows(picked, rows)), rows, b, n)  # [num_seqs, T, vocab]
        else:
            logits = step.head(picked.reshape(b * n, -1)).view(b, n, -1)  # [num_seqs, n, vocab]
        return (logits, hidden) if return_hidden else logits

    def body(
        self,
        tokens: torch.Tensor,  # [num_seqs, T] int64
        positions: torch.Tensor,  # [num_seqs, T] int64 RoPE positions
        slots: torch.Tensor,  # [num_seqs] int64
        write_pos: torch.Tensor,  # [num_seqs, T] int64 cache index of each new token (-1: scratch)
        mask: torch.Tensor,  # [num_seqs, 1, T, kv_len] additive
        k: torch.Tensor,  # [layers, slots, kv_heads, len + 1, head_dim] the whole cache
        v: torch.Tensor,  # [layers, slots, kv_heads, len + 1, head_dim]
        rows: torch.Tensor | None = None,  # [N] int64 flat indices of the real tokens (`real_rows`); None: all
        layer_ids: Sequence[int] | None = None,
    ) -> torch.Tensor:
        """Final (normed) hidden states [num_seqs, T, hidden]: everything but the LM head, tensors in and out,
        so that a compiled step (models/compiled.py) can take it whole. With `rows`, the linears and norms run
        on the real tokens alone ([N, hidden]) and the padding's hidden states are zeros."""
        b, t = tokens.shape
        x = to_rows(self.embed(tokens), rows)  # [N, hidden]
        cos, sin = rope_tables(positions, self.inv_freq, x.dtype)  # [num_seqs, T, 1, head_dim] each
        for i in range(len(self.layers)) if layer_ids is None else layer_ids:
            x = self.layers[i](x, cos, sin, k, v, i, slots, write_pos, mask, rows)
        return to_batch(self.norm(x), rows, b, t)  # [num_seqs, T, hidden]

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [rows, hidden] -> fp32 logits [rows, vocab]."""
        return self.lm_head(hidden).float()


def _hf_to_ours(cfg: LlamaConfig, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename Hugging Face weights to this module's names, fusing q/k/v and gate/up."""
    embed = tensors["model.embed_tokens.weight"]
    out = {"embed.weight": embed, "norm.weight": tensors["model.norm.weight"]}
    out["lm_head.weight"] = embed if cfg.tie_embeddings else tensors["lm_head.weight"]
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        out[f"layers.{i}.attn.wqkv.weight"] = torch.cat([tensors[a + f"{n}_proj.weight"] for n in "qkv"])
        if cfg.qkv_bias:
            out[f"layers.{i}.attn.wqkv.bias"] = torch.cat([tensors[a + f"{n}_proj.bias"] for n in "qkv"])
        out[f"layers.{i}.attn.wo.weight"] = tensors[a + "o_proj.weight"]
        if cfg.o_bias:
            out[f"layers.{i}.attn.wo.bias"] = tensors[a + "o_proj.bias"]
        if cfg.qk_norm:
            out[f"layers.{i}.attn.q_norm.weight"] = tensors[a + "q_norm.weight"]
            out[f"layers.{i}.attn.k_norm.weight"] = tensors[a + "k_norm.weight"]
        gate, up = tensors[p + "mlp.gate_proj.weight"], tensors[p + "mlp.up_proj.weight"]
        out[f"layers.{i}.mlp.w13.weight"] = torch.cat([gate, up])
        out[f"layers.{i}.mlp.w2.weight"] = tensors[p + "mlp.down_proj.weight"]
        out[f"layers.{i}.attn_norm.weight"] = tensors[p + "input_layernorm.weight"]
        out[f"layers.{i}.mlp_norm.weight"] = tensors[p + "post_attention_layernorm.weight"]
    return out


def load_llama(
    model_dir: str | Path,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    inference: bool = True,
) -> LlamaModel:
    """Build the model from a Hugging Face directory (config.json + *.safetensors).

    inference=True freezes the weights and gives fp32 CPU linears their inference kernels (the few-rows GEMM,
    else a packing: models/fp32_linears.py); training wants False. Frozen whatever the kernel: the packing is
    timed at first use, and a busy machine choosing plain F.linear left weights that required grad (`.numpy()` on
    the head failed, in the suite only).
    """
    model_dir = Path(model_dir)
    cfg = LlamaConfig.from_dir(model_dir)
    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(model_dir.glob("*.safetensors")):
        tensors.update(load_file(shard))
    with torch.device("meta"):
        model = LlamaModel(cfg)
    try:
        state = _hf_to_ours(cfg, tensors)
    except KeyError as e:
        raise UnsupportedModelError(f"{model_dir}: missing weight {e.args[0]}") from None
    model.load_state_dict(state, strict=True, assign=True)
    if cfg.tie_embeddings:
        model.lm_head.weight = model.embed.weight
    model.inv_freq = torch.empty(0)  # the meta-device buffer can't move; it is rebuilt below
    model = model.to(device=device, dtype=dtype).eval()
    model.inv_freq = rope_inv_freq(cfg).to(device)  # stays fp32 whatever the weights' dtype
    if inference:
        model.requires_grad_(False)
        fp32_linears.install(model, torch.device(device), dtype)
    return model
