"""Driver and workers of a tensor-parallel target (vLLM's design): rank 0 runs the whole engine, the other ranks
only repeat its target forwards on their shards.

Rank 0 (the driver) holds a `TensorParallelTarget`: it looks like a `LlamaModel` to the engine, the drafters and
the controllers, and before each forward it broadcasts that forward's inputs (tokens, attention metadata, which
logits to compute, which layers to run) to the workers, then runs its own shard; the shards meet in the layers'
all-reduces and the LM head's gather, and only rank 0 gets the logits, verifies and samples. The next step's
tokens reach the workers as the next forward's inputs. The KV cache a driver hands out (`MirroredCache`)
repeats its K/V moves, `compact` (a tree's accepted path) and `copy_prefix` (n samples of one prompt), on every
rank; lengths, slots and rollback are rank 0's bookkeeping alone, since the workers get each forward's
positions and write indices explicitly.

Workers (`serve`) take orders only from rank 0's broadcasts, in order, and decide nothing themselves, so
nothing that differs between processes (timing-based controllers, drafters' state, random streams) can make
ranks diverge. Orders are a fixed-size int64 header on a CPU (gloo) group, then the order's tensors on the
device group (gloo on CPU, NCCL on CUDA): an idle worker waits on the CPU, not in a GPU kernel, and the control
group's long timeout lets a server sit idle for days. Nothing crossing ranks is pickled: the launch spec is
JSON bytes in a uint8 tensor, so a worker never unpickles what it receives.

A worker that dies (engine/launch.py watches them) fails rank 0's next order, or the collective it is in, with
`WorkerLostError`, which says which worker and how.

Drafting happens on rank 0 alone (vLLM's spirit): a forward over a subset of layers (layer skipping) is a target
forward like any other, its layer ids carried in the order, so the workers run the same layers on their shards
of the same cache. Feature heads (EAGLE, Medusa, MTP) read the last layer's hidden states, which are whole on
rank 0 (the row-parallel outputs are all-reduced), and score them with `lm_head`, a whole LM head on rank 0: the
shard's own head is vocab-parallel and gathers across ranks, a collective the workers would never join.
"""

from __future__ import annotations

import functools
import itertools
import json
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from specdecode.kv import KVCache
from specdecode.models.llama import AttentionMetadata, LlamaConfig, StepFunctions
from specdecode.models.tensor_parallel import load_sharded_llama, whole_lm_head

CONTROL_TIMEOUT = timedelta(days=365)  # a worker waits for the next order as long as the driver stays idle
HEADER = 8  # int64 slots of an order's header: [op, cache id, up to 6 arguments]
ALL_LAYERS = -1  # a forward's layer count in its header when it runs every layer
FORWARD, COMPACT, NEW_CACHE, FREE_CACHE, STOP, COPY_PREFIX = range(6)  # the orders
NOTICE_S = 5.0  # how long a failed collective waits for the watch to say whether a worker died


class WorkerLostError(RuntimeError):
    """A tensor-parallel worker died: the group can't run any more."""


def _nobody_lost(wait: float) -> str | None:
    return None


@dataclass
class TensorParallelGroup:
    """This process's place in the tensor-parallel group and the two process groups it talks on."""

    rank: int
    world: int
    device: torch.device
    control: dist.ProcessGroup  # gloo, CPU: headers and launch specs
    group: dist.ProcessGroup | None = None  # the device's collectives (None: the default group)
    # Rank 0's word on dead workers (engine/launch.py's watch): how one died, waiting up to `wait` s to know.
    lost: Callable[[float], str | None] = _nobody_lost

    @contextmanager
    def watched(self) -> Iterator[None]:
        """Collectives of rank 0 that fail because a worker died raise `WorkerLostError` saying so; a worker
        known dead fails the next one before it starts."""
        if (failure := self.lost(0.0)) is not None:
            raise WorkerLostError(failure)
        try:
            yield
        except WorkerLostError:
            raise
        except RuntimeError as e:  # gloo: a peer's connection closed
            if (failure := self.lost(NOTICE_S)) is not None:
                raise WorkerLostError(failure) from e
            raise

    @classmethod
    def join(cls, device: torch.device) -> TensorParallelGroup:
        """Open the control group over the initialised default group (every rank calls this, in step)."""
        control = dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)
        return cls(dist.get_rank(), dist.get_world_size(), device, control)

    def close(self) -> None:
        dist.destroy_process_group(self.control)

    def send_header(self, op: int, *args: int) -> None:
        header = torch.zeros(HEADER, dtype=torch.long)
        header[: 1 + len(args)] = torch.tensor([op, *args])
        with self.watched():
            dist.broadcast(header, src=0, group=self.control)

    def receive_header(self) -> list[int]:
        header = torch.empty(HEADER, dtype=torch.long)
        dist.broadcast(header, src=0, group=self.control)
        return header.tolist()

    def broadcast(self, flat: torch.Tensor) -> torch.Tensor:
        """An order's tensors, flattened into one int64 tensor on the device (rank 0 sends, the others fill)."""
        with self.watched():
            dist.broadcast(flat, src=0, group=self.group)
        return flat

    def send_text(self, text: str) -> None:
        """A string to every worker as UTF-8 bytes in a uint8 tensor, its length first (no pickle)."""
        data = torch.frombuffer(bytearray(text.encode()), dtype=torch.uint8)  # [n]
        self.send_header(len(data))
        with self.watched():
            dist.broadcast(data, src=0, group=self.control)

    def receive_text(self) -> str:
        data = torch.empty(self.receive_header()[0], dtype=torch.uint8)  # [n]
        dist.broadcast(data, src=0, group=self.control)
        return bytes(data.tolist()).decode()


def send_launch_spec(tp: TensorParallelGroup, model_dir: Path, dtype: torch.dtype) -> None:
    """Rank 0 names the checkpoint and dtype, so every rank loads the same shards whatever its own arguments."""
    tp.send_text(json.dumps({"model_dir": str(model_dir), "dtype": str(dtype).removeprefix("torch.")}))


def receive_launch_spec(tp: TensorParallelGroup) -> tuple[Path, torch.dtype]:
    """The launch spec as plain data: a path, and a dtype that must name one of torch's."""
    spec = json.loads(tp.receive_text())
    dtype = getattr(torch, str(spec["dtype"]), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"launch spec names no torch dtype: {spec['dtype']!r}")
    return Path(spec["model_dir"]), dtype


class MirroredCache(KVCache):
    """Rank 0's shard of a KV cache whose every K/V move is repeated on the workers' shards."""

    def __init__(self, tp: TensorParallelGroup, cache_id: int, released: list[int], *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.tp, self.cache_id = tp, cache_id
        # The workers free their copy at the driver's next order: a finalizer may run mid-broadcast, so it
        # only notes the id.
        weakref.finalize(self, released.append, cache_id)

    def compact(self, slot: int, start: int, offsets: list[int]) -> None:
        if offsets != list(range(len(offsets))):  # a move at all (KVCache.compact skips the rest too)
            self.tp.send_header(COMPACT, self.cache_id, slot, start, len(offsets))
            self.tp.broadcast(torch.tensor(offsets, dtype=torch.long, device=self.tp.device))
        super().compact(slot, start, offsets)

    def copy_prefix(self, src: int, dst: int, length: int) -> None:
        self.tp.send_header(COPY_PREFIX, self.cache_id, src, dst, length)  # n samples sharing a prompt
        super().copy_prefix(src, dst, length)


class TensorParallelTarget:
    """Rank 0's target: the engine calls it like a `LlamaModel`; each call is first announced to the workers.

    `cfg` is the whole model's config (vocabulary, heads, context: what the engine and drafters ask about);
    `shard.cfg` is this rank's share.
    """

    def __init__(self, tp: TensorParallelGroup, model_dir: Path, dtype: torch.dtype) -> None:
        send_launch_spec(tp, model_dir, dtype)
        self.tp, self.model_dir = tp, model_dir
        self.shard = load_sharded_llama(model_dir, tp.rank, tp.world, tp.device, dtype, tp.group)
        self.cfg = LlamaConfig.from_dir(model_dir)
        self.tensor_parallel_size = tp.world
        self._ids = itertools.count()
        self._released: list[int] = []
        self.closed = False

    @property
    def embed(self) -> torch.nn.Embedding:
        return self.shard.embed  # whole on every rank

    @property
    def device(self) -> torch.device:
        return self.shard.device

    @property
    def dtype(self) -> torch.dtype:
        return self.shard.dtype

    @functools.cached_property
    def lm_head(self) -> nn.Module:
        """The whole LM head on rank 0, for drafters that score features themselves: no collective (the shard's
        vocab-parallel head gathers across ranks). Built on first use, so methods that never call it hold no
        copy; a tied head reuses the embedding every rank keeps whole (CPU packing still makes its packed copy,
        as in one process)."""
        return whole_lm_head(self.shard, self.model_dir, self.cfg.tie_embeddings)

    def lm_head_weight(self) -> torch.Tensor:
        """[vocab, hidden] the whole LM head as a dense tensor (as `LlamaModel.lm_head_weight`)."""
        w = self.lm_head.weight
        return w.to_dense() if w.is_mkldnn else w

    @property
    def step(self) -> StepFunctions:
        return self.shard.step  # eager: the compiled step has no collectives

    def new_cache(self, num_slots: int, max_len: int) -> MirroredCache:
        cache_id = next(self._ids)
        self._order(NEW_CACHE, cache_id, num_slots, max_len)
        cfg = self.shard.cfg
        shape = (cfg.num_layers, num_slots, max_len, cfg.num_kv_heads, cfg.head_dim)
        return MirroredCache(self.tp, cache_id, self._released, *shape, device=self.device, dtype=self.dtype)

    def __call__(
        self,
        tokens: torch.Tensor,  # [num_seqs, T] int64
        meta: AttentionMetadata,
        cache: MirroredCache,
        logits_index: torch.Tensor | None = None,  # [num_seqs, n]
        return_hidden: bool = False,
        layer_ids: Sequence[int] | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """LlamaModel.forward over every rank's shard: logits [num_seqs, n or T, vocab] on rank 0 (and its hidden
        states, whole there: the workers never return them)."""
        self._announce_forward(tokens, meta, cache, logits_index, layer_ids)
        with self.tp.watched():  # the layers' all-reduces and the head's gather
            return self.shard(tokens, meta, cache, logits_index, return_hidden, layer_ids)

    def _announce_forward(
        self,
        tokens: torch.Tensor,  # [num_seqs, T] int64
        meta: AttentionMetadata,
        cache: MirroredCache,
        logits_index: torch.Tensor | None,  # [num_seqs, n]
        layer_ids: Sequence[int] | None = None,
    ) -> None:
        """The workers' FORWARD order: sizes in the header (all 8 slots: op, cache id, b, t, kv_len, n, tree,
        layer count), inputs in one broadcast."""
        b, t = tokens.shape
        n = -1 if logits_index is None else logits_index.shape[1]
        tree = meta.tree_mask is not None
        num_layers = ALL_LAYERS if layer_ids is None else len(layer_ids)
        self._order(FORWARD, cache.cache_id, b, t, meta.kv_len, n, int(tree), num_layers)
        self.tp.broadcast(pack_forward(tokens, meta, logits_index, layer_ids))

    def _order(self, op: int, *args: int) -> None:
        if self.closed:
            raise RuntimeError("the tensor-parallel workers were shut down")
        while self._released:  # caches rank 0 no longer holds
            self.tp.send_header(FREE_CACHE, self._released.pop())
        self.tp.send_header(op, *args)

    def close(self) -> None:
        """Release the workers: they return from `serve`."""
        if not self.closed:
            self._order(STOP)
            self.closed = True


def pack_forward(
    tokens: torch.Tensor,
    meta: AttentionMetadata,
    logits_index: torch.Tensor | None,
    layer_ids: Sequence[int] | None = None,
) -> torch.Tensor:
    """A forward's inputs as one flat int64 tensor (one broadcast): tokens, slots, start, positions, write
    positions, then the logits index, tree mask and layer ids when there are any."""
    parts = [tokens, meta.slots, meta.start, meta.positions, meta.write_pos]
    parts += [x.long() for x in (logits_index, meta.tree_mask) if x is not None]
    if layer_ids is not None:
        parts.append(torch.tensor(list(layer_ids), dtype=torch.long, device=tokens.device))
    return torch.cat([x.reshape(-1) for x in parts])


def unpack_forward(
    flat: torch.Tensor, b: int, t: int, kv_len: int, n: int, tree: bool, num_layers: int
) -> tuple[torch.Tensor, AttentionMetadata, torch.Tensor | None, list[int] | None]:
    """`pack_forward` undone: (tokens [b, t], metadata, logits index [b, n] or None, layer ids or None)."""
    sizes = _forward_sizes(b, t, n, tree, num_layers)
    tokens, slots, start, positions, write_pos, index, mask, layers = flat.split(sizes)
    meta = AttentionMetadata(
        slots=slots,
        start=start,
        positions=positions.view(b, t),
        kv_len=kv_len,
        write_pos=write_pos.view(b, t),
        tree_mask=mask.view(b, t, t).bool() if tree else None,
    )
    layer_ids = layers.tolist() if num_layers != ALL_LAYERS else None
    return tokens.view(b, t), meta, index.view(b, n) if n >= 0 else None, layer_ids


def _forward_sizes(b: int, t: int, n: int, tree: bool, num_layers: int) -> list[int]:
    """Elements of each part `pack_forward` concatenates (n = -1: no logits index; ALL_LAYERS: no layer ids)."""
    return [b * t, b, b, b * t, b * t, max(n, 0) * b, t * t * b if tree else 0, max(num_layers, 0)]


@torch.inference_mode()
def serve(tp: TensorParallelGroup) -> None:
    """A worker: load this rank's shard of the model rank 0 names, then carry out its orders until STOP."""
    model_dir, dtype = receive_launch_spec(tp)
    shard = load_sharded_llama(model_dir, tp.rank, tp.world, tp.device, dtype, tp.group)
    caches: dict[int, KVCache] = {}
    while True:
        op, cache_id, *args = tp.receive_header()
        if op == STOP:
            return
        if op == FORWARD:
            b, t, kv_len, n, tree, num_layers = args[:6]
            sizes = _forward_sizes(b, t, n, bool(tree), num_layers)
            flat = torch.empty(sum(sizes), dtype=torch.long, device=tp.device)
            tokens, meta, index, layer_ids = unpack_forward(tp.broadcast(flat), b, t, kv_len, n, bool(tree), num_layers)
            shard(tokens, meta, caches[cache_id], index, layer_ids=layer_ids)  # logits and hidden stay on rank 0
        elif op == COMPACT:
            slot, start, count = args[:3]
            offsets = tp.broadcast(torch.empty(count, dtype=torch.long, device=tp.device)).tolist()
            caches[cache_id].compact(slot, start, offsets)
        elif op == COPY_PREFIX:
            caches[cache_id].copy_prefix(*args[:3])
        elif op == NEW_CACHE:
            caches[cache_id] = shard.new_cache(args[0], args[1])
        elif op == FREE_CACHE:
            del caches[cache_id]
