"""A test on a gloo group: the test's own process is rank 0 and runs the case; spawned workers serve every
tensor-parallel target it starts, as workers do (specdecode.engine.tensor_parallel.serve).

One spawn serves many targets in a row (each a "session", announced to the workers on the default group), so a
test pays for starting a process once, and rank 0 reuses the test process's imports. A session may carry a
fault, injected into the real code on every rank (or on rank 0 only, for the driver's own faults), for negative
controls.

The ranks meet as the engine's spawned ones do (engine/launch.py): a FileStore in a private temporary directory,
connections on loopback, and nothing pickled between them (a session's fault is named in JSON bytes).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from unittest import mock

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from specdecode.engine import launch
from specdecode.engine import tensor_parallel as tp_engine
from specdecode.engine.tensor_parallel import TensorParallelGroup, TensorParallelTarget, serve
from specdecode.kv import KVCache
from specdecode.models import packed_linear
from specdecode.models import tensor_parallel as tp_models

CPU = torch.device("cpu")


def _rank0_slices() -> AbstractContextManager:
    """Every rank keeps rank 0's heads and columns: a wrong shard offset."""
    real = tp_models.shard_range
    return mock.patch.object(tp_models, "shard_range", lambda n, rank, world: real(n, 0, world))


# Faults every rank runs with (a fault on one rank only would desynchronise the collectives).
FAULTS: dict[str, Callable[[], AbstractContextManager]] = {
    "skip_all_reduce": lambda: mock.patch.object(dist, "all_reduce", lambda *args, **kwargs: None),
    "rank0_slices": _rank0_slices,
}


def _wrong_layer_ids() -> AbstractContextManager:
    """The workers hear other layer ids than rank 0 runs: each one layer on, as many of them, so the collectives
    stay in step. (Sending none at all makes the workers run every layer, more all-reduces than rank 0's: the
    ranks then wait on each other until the group times out, 30 minutes here, a hang rather than a failure.)"""
    real = tp_engine.TensorParallelTarget._announce_forward

    def announce(self, tokens, meta, cache, logits_index, layer_ids=None) -> None:
        if layer_ids is not None:
            layer_ids = [(i + 1) % self.cfg.num_layers for i in layer_ids]
        real(self, tokens, meta, cache, logits_index, layer_ids)

    return mock.patch.object(tp_engine.TensorParallelTarget, "_announce_forward", announce)


# Faults of the driver alone: the workers never hear of the K/V moves rank 0 makes, or mishear its layer choice.
DRIVER_FAULTS: dict[str, Callable[[], AbstractContextManager]] = {
    "unmirrored_compact": lambda: mock.patch.object(tp_engine.MirroredCache, "compact", KVCache.compact),
    "unmirrored_copy_prefix": lambda: mock.patch.object(tp_engine.MirroredCache, "copy_prefix", KVCache.copy_prefix),
    "wrong_layer_ids": _wrong_layer_ids,
}


def run_on_ranks(case: Callable, *args, world: int = 2):
    """case(*args) in this process, as rank 0 of a gloo group whose other ranks are spawned workers; returns
    what it returns. The group lives for this call only."""
    rendezvous = Path(tempfile.mkdtemp(prefix="specdecode-test-ranks-"))
    store_path = str(rendezvous / "store")
    # The workers pack linears as this process does, without probing the machine again (seconds under load).
    spawn_args = (world, store_path, packed_linear.choice())
    workers = mp.start_processes(_worker_main, args=spawn_args, nprocs=world - 1, join=False, start_method="spawn")
    try:
        with launch._loopback():  # every group the case makes (each session's) stays on loopback
            dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=0, world_size=world)
            try:
                result = case(*args)
                _announce(None)  # no more sessions
                # The workers leave first, as the engine's do (launch._stop): each one's FileStore touches the
                # store file as it goes, and a file removed under it aborts the worker (SIGABRT, seen in CI).
                while not workers.join():  # re-raises a worker's exception
                    pass
            finally:
                dist.destroy_process_group()
    except BaseException:
        for p in workers.processes:
            p.terminate()
            p.join()
        raise
    finally:
        shutil.rmtree(rendezvous, ignore_errors=True)
    return result


def _worker_main(index: int, world: int, store_path: str, packed_kind: str) -> None:
    os.environ[packed_linear.ENV] = packed_kind
    os.environ.update(launch.LOOPBACK)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=index + 1, world_size=world)
    try:
        _serve_sessions()
    finally:
        dist.destroy_process_group()


def _announce(fault: str | None | bool) -> None:
    """Rank 0 tells the workers another session starts (with this fault, or none: False), or that none will:
    JSON bytes in a uint8 tensor, length first."""
    data = torch.frombuffer(bytearray(json.dumps(fault).encode()), dtype=torch.uint8)  # [n]
    dist.broadcast(torch.tensor([len(data)]), src=0)
    dist.broadcast(data, src=0)


def _hear() -> str | None | bool:
    size = torch.zeros(1, dtype=torch.long)
    dist.broadcast(size, src=0)
    data = torch.empty(int(size), dtype=torch.uint8)  # [n]
    dist.broadcast(data, src=0)
    return json.loads(bytes(data.tolist()))


def _serve_sessions() -> None:
    while True:
        fault = _hear()
        if fault is None:
            return
        with FAULTS[fault]() if fault in FAULTS else nullcontext():
            tp = TensorParallelGroup.join(CPU)
            serve(tp)
            tp.close()


@contextmanager
def session(fault: str | None = None) -> Iterator[None]:
    """Rank 0: the workers join the next target's group (an LLM with tensor_parallel_size, or `driven`)."""
    _announce(fault or False)
    faults = {**FAULTS, **DRIVER_FAULTS}
    with faults[fault]() if fault else nullcontext():
        yield


@contextmanager
def driven(
    model_dir: Path | str, fault: str | None = None, dtype: torch.dtype = torch.float32
) -> Iterator[TensorParallelTarget]:
    """Rank 0: a sharded target over every rank, closed (workers released) on exit."""
    with session(fault):
        tp = TensorParallelGroup.join(CPU)
        target = TensorParallelTarget(tp, Path(model_dir), dtype)
        try:
            yield target
        finally:
            target.close()
            tp.close()
