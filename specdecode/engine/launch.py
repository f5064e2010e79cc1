"""Starting and stopping a tensor-parallel target: spawned workers, or a group torchrun set up.

Spawned (`LLM(..., tensor_parallel_size=N)` in one process): the calling process is rank 0 and N - 1 workers
start by `torch.multiprocessing` spawn; gloo on CPU, NCCL on CUDA with rank r on cuda:r. Every rank runs on
cores // N threads. `close()` stops the workers (STOP, then a join; any that hang are terminated) and destroys
the group; the LLM also closes it when collected or at exit. The workers are spawned, so a script that builds
such an LLM needs the usual `if __name__ == "__main__":` guard; without it a worker dies before joining, and
rank 0 says so.

The ranks meet through a FileStore in a private (0700) temporary directory, not a TCP store (which listens on
every interface and authenticates no one), and their gloo/NCCL connections stay on the loopback interface: a
spawned group never leaves this machine. A thread on rank 0 watches the workers: when one dies (a crash, the
OOM killer), the others are stopped, which breaks any collective rank 0 is blocked in, and the next call on
the target raises `WorkerLostError` saying which worker died and how, within seconds rather than never.

torchrun (WORLD_SIZE set, or a default group already initialised): every rank runs the same script and joins
that group (env://, cuda:LOCAL_RANK). Rank 0 drives; on the other ranks `start` serves rank 0's orders and then
ends the process with SystemExit(0) once rank 0 closes, so no worker runs the rest of the script.

Every method runs: drafters run on rank 0, including those that reach into the target (its cache, features,
layers or head; specdecode/engine/tensor_parallel.py says how), while the target's forwards stay sharded.
"""

from __future__ import annotations

import multiprocessing.connection
import os
import shutil
import signal
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from specdecode.config import ConfigError
from specdecode.engine.tensor_parallel import (
    NOTICE_S,
    TensorParallelGroup,
    TensorParallelTarget,
    WorkerLostError,
    serve,
)
from specdecode.models import packed_linear
from specdecode.models.llama import LlamaConfig
from specdecode.models.tensor_parallel import check_shardable

STARTUP_TIMEOUT = timedelta(minutes=10)  # rendezvous and the layers' collectives (control waits longer)
JOIN_TIMEOUT_S = 30.0
POLL_S = 0.05  # how often rank 0 looks for workers that have checked in (or died) before the rendezvous
LOOPBACK = {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}  # a spawned group's connections
GUARD_HINT = (
    "the workers are spawned processes that import the main script again, so a script must build the LLM "
    'under `if __name__ == "__main__":`'
)


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


def _init(rank: int, world: int, device: torch.device, store: dist.Store) -> TensorParallelGroup:
    if device.type == "cuda":
        torch.cuda.set_device(device)
    with _loopback():
        dist.init_process_group(_backend(device), store=store, rank=rank, world_size=world, timeout=STARTUP_TIMEOUT)
        return TensorParallelGroup.join(device)


@contextmanager
def _loopback() -> Iterator[None]:
    """gloo and NCCL pick their interface when a group is made: the loopback one, for the duration."""
    saved = {k: os.environ.get(k) for k in LOOPBACK}
    os.environ.update(LOOPBACK)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k)
            else:
                os.environ[k] = v


def _init_from_env(device: str) -> None:
    """The default group from torchrun's environment (MASTER_ADDR/PORT, RANK, WORLD_SIZE, LOCAL_RANK)."""
    rank_dev = rank_device(device, int(os.environ.get("LOCAL_RANK", "0")))
    if rank_dev.type == "cuda":
        torch.cuda.set_device(rank_dev)
    dist.init_process_group(_backend(rank_dev), init_method="env://", timeout=STARTUP_TIMEOUT)


def _worker_main(index: int, world: int, store_path: str, device: str, packed_kind: str) -> None:
    """A spawned worker (rank index + 1): check in, join, serve until rank 0 closes, leave the group."""
    # Ctrl-C reaches the whole process group; rank 0 decides when the workers stop (or they see it go).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ[packed_linear.ENV] = packed_kind  # rank 0's measured choice: no probe per worker
    torch.set_num_threads(threads_per_rank(world))
    rank = index + 1
    store = dist.FileStore(store_path, world)
    store.set(_checked_in(rank), "1")
    tp = _init(rank, world, rank_device(device, rank), store)
    try:
        serve(tp)
    finally:
        tp.close()
        dist.destroy_process_group()


def _checked_in(rank: int) -> str:
    return f"specdecode/checked_in/{rank}"


def _await_workers(store: dist.Store, processes: list) -> None:
    """Wait until every worker has checked in; one that dies first (a script without the main guard, an import
    error) fails here, where `init_process_group` would wait for it until its timeout."""
    keys = [_checked_in(i + 1) for i in range(len(processes))]
    while not store.check(keys):
        for i, p in enumerate(processes):
            if not p.is_alive():
                raise WorkerLostError(
                    f"tensor-parallel worker rank {i + 1} {_how_it_ended(p)} before joining rank 0 (its error is "
                    f"printed above); if the script has no main guard, that is why: {GUARD_HINT}"
                )
        time.sleep(POLL_S)


def _how_it_ended(p) -> str:
    """How a worker process ended, for an error message: its exit code, or the signal that killed it."""
    code = p.exitcode
    deadline = time.monotonic() + 2.0
    while code is None and time.monotonic() < deadline:
        # Another thread's poll of the same process can reap it first; the code is on the shared handle a moment
        # later (an exit code of None here once turned "killed by SIGKILL" into "exited with code None").
        time.sleep(0.01)
        code = p.exitcode
    if code is not None and code < 0:
        name = signal.Signals(-code).name
        oom = " (as the kernel's out-of-memory killer does)" if -code == signal.SIGKILL else ""
        return f"(pid {p.pid}) was killed by {name}{oom}"
    return f"(pid {p.pid}) exited with code {code}"


class WorkerWatch:
    """Rank 0's watch on its spawned workers: a daemon thread that wakes when one exits. Unless rank 0 is
    closing, that worker died: the watch records how, and stops the others, so no rank waits on a collective
    that can never complete (rank 0's own fails once its peers' sockets close)."""

    def __init__(self, processes: list) -> None:
        self.processes = processes
        self.closing = False
        self.failure: str | None = None
        self._reported = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="specdecode-tp-watch", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        sentinels = {p.sentinel: i for i, p in enumerate(self.processes)}
        ready = multiprocessing.connection.wait(list(sentinels))
        if self.closing:
            return
        index = sentinels[ready[0]]
        dead = self.processes[index]
        dead.join()
        self.failure = (
            f"tensor-parallel worker rank {index + 1} {_how_it_ended(dead)} while serving; the other workers were "
            "stopped and this LLM can't run any more: close it and build a new one"
        )
        self._reported.set()
        for p in self.processes:
            if p.is_alive():
                p.terminate()

    def lost(self, wait: float) -> str | None:
        """What happened to the worker that died, waiting up to `wait` seconds for the watch to notice; where one
        has already exited, as long as the watch takes to say how (up to NOTICE_S). A worker killed between two
        generations was once reported only after rank 0 had sent its next order into the dead worker's socket,
        and that generation waited on it past the tests' 240 s guard (in 1 suite run of ~10)."""
        if self.failure is None and not self.closing and self._exited():
            wait = max(wait, NOTICE_S)
        self._reported.wait(wait)
        return self.failure

    def _exited(self) -> bool:
        """Whether a worker has exited (its sentinel is ready: unlike is_alive, this never reaps it, nor reads
        as alive while another thread reaps it)."""
        return bool(multiprocessing.connection.wait([p.sentinel for p in self.processes], timeout=0))


class TensorParallelRuntime:
    """Rank 0's handle on the group: the sharded target, the workers it spawned, and their shutdown.

    One at a time per process: torch.distributed's default group is per process, and a group's workers serve
    one target. Under torchrun the workers leave when the first one closes, so there is one per run.
    """

    live: TensorParallelRuntime | None = None

    def __init__(
        self, tp: TensorParallelGroup, processes: list, owns_group: bool, rendezvous: Path | None = None
    ) -> None:
        self.tp, self.processes, self.owns_group = tp, processes, owns_group
        self.rendezvous = rendezvous  # the FileStore's private directory, removed at close
        self.watch = WorkerWatch(processes) if processes else None
        if self.watch is not None:
            tp.lost = self.watch.lost
        self.target: TensorParallelTarget | None = None
        self.closed = False

    @classmethod
    def start(cls, model_dir: Path, device: str, dtype: torch.dtype, world: int) -> TensorParallelRuntime:
        """Rank 0's runtime with the target loaded; under torchrun, ranks > 0 serve here and exit."""
        check_shardable(LlamaConfig.from_dir(model_dir), world)
        if cls.live is not None:
            raise ConfigError("one tensor-parallel LLM per process at a time: close() the other one first")
        if getattr(mp.current_process(), "_inheriting", False):  # a spawned worker re-running the main script
            raise ConfigError(
                "a tensor-parallel worker, importing the main script, was asked to build an LLM with "
                f"tensor_parallel_size > 1 at module level: {GUARD_HINT}"
            )
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
        rendezvous = Path(tempfile.mkdtemp(prefix="specdecode-tp-"))  # 0700: only this user's processes meet
        store_path = str(rendezvous / "store")
        context = mp.start_processes(
            _worker_main,
            args=(world, store_path, device, packed_linear.choice()),
            nprocs=world - 1,
            join=False,
            daemon=True,  # a parent that dies takes its workers along
            start_method="spawn",
        )
        try:
            store = dist.FileStore(store_path, world)
            _await_workers(store, context.processes)
            tp = _init(0, world, rank_device(device, 0), store)
        except BaseException:
            _stop(context.processes, 0.0)
            shutil.rmtree(rendezvous, ignore_errors=True)
            raise
        return cls(tp, context.processes, owns_group=True, rendezvous=rendezvous)

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
        lost = self.watch is not None and self.watch.lost(0.0) is not None
        if self.watch is not None:
            self.watch.closing = True
        try:
            if self.target is not None and not lost:
                self.target.close()
        except WorkerLostError:
            pass  # a worker died while idle: closing is all that is left to do
        finally:  # workers that never got a target to follow have nothing to finish: no grace period
            _stop(self.processes, JOIN_TIMEOUT_S if self.target is not None and not lost else 0.0)
            self.tp.close()
            if self.owns_group:
                dist.destroy_process_group()
            if self.rendezvous is not None:
                shutil.rmtree(self.rendezvous, ignore_errors=True)


def _stop(processes: list, timeout: float) -> None:
    """Reap the workers: they leave on STOP; any still running after `timeout` seconds are terminated."""
    for p in processes:
        p.join(timeout)
        if p.is_alive():
            p.terminate()
            p.join()
