"""Starting and stopping a tensor-parallel target: spawned workers, or a group torchrun set up.

Spawned (`LLM(..., tensor_parallel_size=N)` in one process): the calling process is rank 0 and N - 1 workers
start by `torch.multiprocessing` spawn, meeting it at 127.0.0.1 on a free port; gloo on CPU, NCCL on CUDA with
rank r on cuda:r. Every rank runs on cores // N threads. `close()` stops the workers (STOP, then a join; any
that hang are terminated) and destroys the group; the LLM also closes it when collected or at exit. The
workers are spawned, so a script that builds such an LLM needs the usual `if __name__ == "__main__":` guard.

torchrun (WORLD_SIZE set, or a default group already initialised): every rank runs the same script and joins
that group (env://, cuda:LOCAL_RANK). Rank 0 drives; on the other ranks `start` serves rank 0's orders and then
ends the process with SystemExit(0) once rank 0 closes, so no worker runs the rest of the script.

Every method runs: drafters run on rank 0, including those that reach into the target (its cache, features,
layers or head; specdecode/engine/tensor_parallel.py says how), while the target's forwards stay sharded.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import warnings
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from specdecode.config import ConfigError
from specdecode.engine.tensor_parallel import TensorParallelGroup, TensorParallelTarget, serve
from specdecode.models import packed_linear
from specdecode.models.llama import LlamaConfig
from specdecode.models.tensor_parallel import check_shardable

STARTUP_TIMEOUT = timedelta(minutes=10)  # rendezvous and the layers' collectives (control waits longer)
JOIN_TIMEOUT_S = 30.0


def check_tensor_parallel(device: str, enforce_eager: bool | None) -> bool:
    """Refuse what tensor parallelism can't run; returns enforce_eager (always True: the compiled step has no
    collectives, so the shards run the eager one)."""
    if torch.device(device).index is not None:
        raise ConfigError(f"with tensor parallelism name the device type only, not {device!r}: rank r runs on :r")
    if enforce_eager is False:
        warnings.warn("tensor parallelism runs the target eagerly; enforce_eager=False is ignored", stacklevel=3)
    return True


def threads_per_rank(world: int) -> int:
    return max(1, (os.cpu_count() or 1) // world)


def rank_device(device: str, local_rank: int) -> torch.device:
    """One GPU per rank (cuda:<local rank>); a CPU rank runs on the CPU."""
    d = torch.device(device)
    return torch.device("cuda", local_rank) if d.type == "cuda" else d


def _backend(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def _init(rank: int, world: int, device: torch.device, init_method: str) -> TensorParallelGroup:
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        _backend(device), init_method=init_method, rank=rank, world_size=world, timeout=STARTUP_TIMEOUT
    )
    return TensorParallelGroup.join(device)


def _init_from_env(device: str) -> None:
    """The default group from torchrun's environment (MASTER_ADDR/PORT, RANK, WORLD_SIZE, LOCAL_RANK)."""
    rank_dev = rank_device(device, int(os.environ.get("LOCAL_RANK", "0")))
    if rank_dev.type == "cuda":
        torch.cuda.set_device(rank_dev)
    dist.init_process_group(_backend(rank_dev), init_method="env://", timeout=STARTUP_TIMEOUT)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker_main(index: int, world: int, port: int, device: str, packed_kind: str) -> None:
    """A spawned worker (rank index + 1): join, serve until rank 0 closes, leave the group."""
    # Ctrl-C reaches the whole process group; rank 0 decides when the workers stop (or they see it go).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ[packed_linear.ENV] = packed_kind  # rank 0's measured choice: no probe per worker
    torch.set_num_threads(threads_per_rank(world))
    rank = index + 1
    tp = _init(rank, world, rank_device(device, rank), f"tcp://127.0.0.1:{port}")
    try:
        serve(tp)
    finally:
        tp.close()
        dist.destroy_process_group()


class TensorParallelRuntime:
    """Rank 0's handle on the group: the sharded target, the workers it spawned, and their shutdown.

    One at a time per process: torch.distributed's default group is per process, and a group's workers serve
    one target. Under torchrun the workers leave when the first one closes, so there is one per run.
    """

    live: TensorParallelRuntime | None = None

    def __init__(self, tp: TensorParallelGroup, processes: list, owns_group: bool) -> None:
        self.tp, self.processes, self.owns_group = tp, processes, owns_group
        self.target: TensorParallelTarget | None = None
        self.closed = False

    @classmethod
    def start(cls, model_dir: Path, device: str, dtype: torch.dtype, world: int) -> TensorParallelRuntime:
        """Rank 0's runtime with the target loaded; under torchrun, ranks > 0 serve here and exit."""
        check_shardable(LlamaConfig.from_hf(json.loads((model_dir / "config.json").read_text())), world)
        if cls.live is not None:
            raise ConfigError("one tensor-parallel LLM per process at a time: close() the other one first")
        # The node's cores are shared by its ranks (torchrun says how many run here; spawned, all of them do).
        torch.set_num_threads(threads_per_rank(int(os.environ.get("LOCAL_WORLD_SIZE", world))))
        if dist.is_initialized() or "WORLD_SIZE" in os.environ:
            runtime = cls._join(device, world)
        else:
            runtime = cls._spawn(device, world)
        try:
            runtime.target = TensorParallelTarget(runtime.tp, model_dir, dtype)
        except BaseException:
            runtime.close()
            raise
        cls.live = runtime
        return runtime

    @classmethod
    def _spawn(cls, device: str, world: int) -> TensorParallelRuntime:
        port = _free_port()
        context = mp.start_processes(
            _worker_main,
            args=(world, port, device, packed_linear.choice()),
            nprocs=world - 1,
            join=False,
            daemon=True,  # a parent that dies takes its workers along
            start_method="spawn",
        )
        try:
            tp = _init(0, world, rank_device(device, 0), f"tcp://127.0.0.1:{port}")
        except BaseException:
            _stop(context.processes, 0.0)
            raise
        return cls(tp, context.processes, owns_group=True)

    @classmethod
    def _join(cls, device: str, world: int) -> TensorParallelRuntime:
        owns_group = not dist.is_initialized()
        if owns_group:
            _init_from_env(device)
        if dist.get_world_size() != world:
            raise ConfigError(f"tensor_parallel_size is {world} but the process group has {dist.get_world_size()}")
        local = int(os.environ.get("LOCAL_RANK", dist.get_rank()))  # this rank's GPU on its node
        tp = TensorParallelGroup.join(rank_device(device, local))
        if tp.rank == 0:
            return cls(tp, [], owns_group)
        serve(tp)  # a worker: the rest of the script is rank 0's
        tp.close()
        if owns_group:
            dist.destroy_process_group()
        raise SystemExit(0)

    def close(self) -> None:
        """Stop the workers and leave the group (idempotent)."""
        if self.closed:
            return
        self.closed = True
        if TensorParallelRuntime.live is self:
            TensorParallelRuntime.live = None
        try:
            if self.target is not None:
                self.target.close()
        finally:  # workers that never got a target to follow have nothing to finish: no grace period
            _stop(self.processes, JOIN_TIMEOUT_S if self.target is not None else 0.0)
            self.tp.close()
            if self.owns_group:
                dist.destroy_process_group()


def _stop(processes: list, timeout: float) -> None:
    """Reap the workers: they leave on STOP; any still running after `timeout` seconds are terminated."""
    for p in processes:
        p.join(timeout)
        if p.is_alive():
            p.terminate()
            p.join()
