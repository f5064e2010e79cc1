"""Tensor parallelism through the engine: with the target on two gloo ranks, greedy speculative output equals the
single process's plain greedy output for every method, drafts made: those that only read tokens, a draft model,
and those that reach into the target (EAGLE, Medusa and MTP score its features with a whole LM head on rank 0,
layer skipping forwards a subset of its layers on every rank, `self` drafts with the sharded target itself);
`LLM(..., tensor_parallel_size=2)` spawns its worker, and closing it reaps the worker; what it can't run is
refused before any process starts. The spawned group exposes nothing: it listens on loopback only and pickles
nothing between ranks. A worker that dies (SIGKILL mid-session, or a script without the main guard) fails the
driver at once with a message that says what happened, instead of leaving it waiting forever."""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from unittest import mock

import pytest
import torch.distributed as dist

from specdecode import LLM, SamplingParams
from specdecode.config import METHODS, ConfigError
from specdecode.engine import launch
from specdecode.engine.launch import WorkerWatch
from specdecode.engine.tensor_parallel import WorkerLostError
from specdecode.models import tensor_parallel as tp_models
from tests.listeners import is_loopback, tcp_listeners
from tests.ranks import run_on_ranks, session

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
# Mixed lengths; repetition gives the n-gram and suffix drafters something to find.
PROMPTS = [
    [5, 6, 7, 8, 5, 6, 7, 8, 5, 6],
    [11, 12, 13],
    [20, 21, 22, 23, 24, 25, 20, 21, 22, 23, 40, 41, 20, 21, 22],
    [3, 4],
]


# n samples of one prompt: later samples copy sample 0's prompt K/V, on every rank (MirroredCache.copy_prefix).
SAMPLES = SamplingParams(temperature=0.9, max_tokens=12, ignore_eos=True, seed=4, n=3)
# Drafters whose sampled drafts are not one-hot: a seeded sample's tokens differ from plain sampling's.
SAMPLED_DRAFTS = ("draft", "self", "layer_skip")


def _generate(llm: LLM) -> dict:
    outs = llm.generate(PROMPTS, GREEDY)
    return {
        "tokens": [o.token_ids for o in outs],
        "drafted": sum(o.metrics["num_drafted"] for o in outs),
        "accepted": sum(o.metrics["num_accepted"] for o in outs),
        "samples": [o.token_ids for o in llm.generate(PROMPTS[2:3], SAMPLES)[0].outputs],
    }


def _llm(target: str, drafts: dict[str, str], method: str, controller: str = "fixed", tp: int = 1) -> LLM:
    return LLM(
        target=target,
        draft=drafts.get(method),
        method=method,
        num_speculative_tokens=4,
        controller=controller,
        max_num_seqs=3,  # 3 slots for 4 prompts: rows join and leave the batch
        tensor_parallel_size=tp,
    )


def _greedy_case(target: str, drafts: dict[str, str]) -> dict[str, dict]:
    """Rank 0: the single process's plain greedy output and its layer-skip drafts, then every method under TP,
    and layer skipping under TP with workers that run the wrong layers. drafts: --draft of the methods that
    need one."""
    with _llm(target, drafts, "none") as llm:
        result = {"reference": _generate(llm)}
    with _llm(target, drafts, "layer_skip") as llm:
        result["layer_skip single"] = _generate(llm)
    arms = [(method, "fixed", None) for method in METHODS]
    arms += [("ngram_tree", "goodput", None), ("layer_skip", "fixed", "wrong_layer_ids")]
    for method, controller, fault in arms:
        with session(fault), _llm(target, drafts, method, controller, tp=2) as llm:
            result["+".join(filter(None, (method, controller, fault)))] = _generate(llm)
    return result


@pytest.fixture(scope="module")
def outputs(tiny_target, drafts) -> dict[str, dict]:
    return run_on_ranks(_greedy_case, str(tiny_target), drafts)


@pytest.mark.parametrize("method", METHODS)
def test_tensor_parallel_greedy_equals_single_process(outputs, method):
    out = outputs[f"{method}+fixed"]
    assert out["tokens"] == outputs["reference"]["tokens"]
    if method not in SAMPLED_DRAFTS:  # one-hot drafts: a seeded sample's tokens are plain sampling's (streams.py)
        assert out["samples"] == outputs["reference"]["samples"]
    if method != "none":
        assert out["drafted"] > 0


def test_self_drafts_are_all_accepted(outputs):
    """The sharded target drafting for itself proposes exactly what its verify forward picks."""
    assert outputs["self+fixed"]["accepted"] == outputs["self+fixed"]["drafted"] > 0


def _same_drafts(out: dict, single: dict) -> bool:
    """Drafted as `single` did: the same counts, and the same seeded samples (a sampled layer-skip draft's
    distribution q decides which tokens are kept or resampled, so these tokens follow q itself)."""
    keys = ("drafted", "accepted", "samples")
    return [out[k] for k in keys] == [single[k] for k in keys]


def test_layer_skip_drafts_as_the_single_process(outputs):
    """Greedy output can't tell what a draft computed (verification is lossless); its acceptance and sampled
    output can: the workers run rank 0's layers on their shards, so two ranks draft what one process does."""
    assert _same_drafts(outputs["layer_skip+fixed"], outputs["layer_skip single"])
    assert outputs["layer_skip single"]["accepted"] > 0


def test_wrong_layer_ids_are_caught(outputs):
    """Negative control: workers running other layers than rank 0 (tests/ranks.py) leave the greedy output
    right, since verification repairs any draft, but their drafts are not one process's: the same check fails."""
    out = outputs["layer_skip+fixed+wrong_layer_ids"]
    assert out["tokens"] == outputs["reference"]["tokens"]
    assert not _same_drafts(out, outputs["layer_skip single"]), out


def test_timing_based_controller_keeps_ranks_in_step(outputs):
    """goodput probes the sharded target at start-up and picks K from measured step times, which differ run to
    run: the workers only follow rank 0's orders, so the output is still the single process's."""
    assert outputs["ngram_tree+goodput"]["tokens"] == outputs["reference"]["tokens"]


def test_rejections_are_exercised(outputs):
    """Guard on the test itself: the draft model is sometimes wrong, so rollback runs under TP too."""
    assert 0 < outputs["draft+fixed"]["accepted"] < outputs["draft+fixed"]["drafted"]


def test_llm_spawns_and_reaps_its_worker(tiny_target, outputs):
    """The real launch path: this process is rank 0, one worker is spawned; close() leaves no process and no
    process group behind."""
    with LLM(target=str(tiny_target), method="ngram_tree", controller="fixed", tensor_parallel_size=2) as llm:
        assert _generate(llm)["tokens"] == outputs["reference"]["tokens"]
        workers = list(llm._tp.processes)
        assert [p.is_alive() for p in workers] == [True]
    assert [p.exitcode for p in workers] == [0]
    assert not dist.is_initialized()
    assert not multiprocessing.active_children()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(tensor_parallel_size=0), "tensor_parallel_size must be >= 1"),
        (dict(tensor_parallel_size=3), "key/value heads"),  # the tiny target has 2
        (dict(tensor_parallel_size=2, device="cuda:1"), "device type only"),
    ],
)
def test_unsupported_setups_are_refused_before_spawning(tiny_target, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        LLM(target=str(tiny_target), **kwargs)
    assert not multiprocessing.active_children()
    assert not dist.is_initialized()


# ---- what a spawned group exposes, and how it fails ---------------------------------------------------------
HANG_GUARD_S = 240  # only so a regression fails instead of hanging the suite; the fixed code takes seconds
DEATH = "tensor-parallel worker rank 1 .*was killed by SIGKILL"


def _refuse(*args, **kwargs):
    raise AssertionError("an object was pickled to cross ranks")


def test_spawned_group_listens_on_loopback_only(tiny_target):
    """Rank 0 and its worker listen on loopback alone, during a generation too: no TCP store on every
    interface, and gloo's connections on the loopback interface."""
    with LLM(target=str(tiny_target), method="none", tensor_parallel_size=2) as llm:
        pids = [os.getpid(), *(p.pid for p in llm._tp.processes)]
        llm.generate(PROMPTS, GREEDY)
        listeners = tcp_listeners(pids)
    assert {pid for pid, _ in listeners} == set(pids)  # gloo's own listeners: the check saw every rank's sockets
    assert [a for _, a in listeners if not is_loopback(a)] == [], listeners


def test_nothing_is_pickled_between_ranks(tiny_target):
    """Rank 0 pickles nothing on the way to the workers (they only receive what it sends) for the whole
    launch and a generation: the pickler torch.distributed sends objects with raises."""
    c10d = dist.distributed_c10d
    with mock.patch.object(c10d, "_pickler", _refuse), mock.patch.object(c10d, "_unpickler", _refuse):
        with LLM(target=str(tiny_target), method="none", tensor_parallel_size=2) as llm:
            outs = llm.generate(PROMPTS, GREEDY)
    assert [len(o.token_ids) for o in outs] == [GREEDY.max_tokens] * len(PROMPTS)


def test_address_parsing_sees_a_listener_on_every_interface():
    """Control for the check above: a socket bound to 0.0.0.0 is found, and is not loopback."""
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        port = s.getsockname()[1]
        mine = [a for _, a in tcp_listeners([os.getpid()]) if a.endswith(f":{port}")]
    assert mine == [f"0.0.0.0:{port}"] and not is_loopback(mine[0])


def _generate_in_thread(llm: LLM) -> BaseException | None:
    """What one generation raises, run beside the test so a hang fails the test instead of stalling it."""
    raised: list[BaseException | None] = [None]

    def run() -> None:
        try:
            llm.generate(PROMPTS, GREEDY)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            raised[0] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HANG_GUARD_S)
    assert not thread.is_alive(), "rank 0 still waiting on a dead worker"
    return raised[0]


def _kill(process) -> None:
    os.kill(process.pid, signal.SIGKILL)
    process.join()


@pytest.mark.parametrize("when", ["idle", "in_a_collective"])
def test_a_killed_worker_fails_the_driver_with_what_happened(tiny_target, when, monkeypatch):
    """SIGKILL (the OOM killer's signal) to the worker between generations, or while rank 0 is inside a
    layer's all-reduce: the generation raises WorkerLostError naming the worker and the signal, and close()
    leaves no process and no group behind."""
    llm = LLM(target=str(tiny_target), method="ngram_tree", controller="fixed", tensor_parallel_size=2)
    try:
        llm.generate(PROMPTS[:1], GREEDY)
        (worker,) = llm._tp.processes
        if when == "idle":
            _kill(worker)
        else:
            real = tp_models.RowParallelLinear.forward

            def forward(self, x):
                if worker.is_alive():
                    _kill(worker)  # the all-reduce below then waits on a dead peer
                return real(self, x)

            monkeypatch.setattr(tp_models.RowParallelLinear, "forward", forward)
        error = _generate_in_thread(llm)
    finally:
        llm.close()
    assert isinstance(error, WorkerLostError), repr(error)
    assert error.args[0].startswith("tensor-parallel worker rank 1 (pid ") and "killed by SIGKILL" in error.args[0]
    assert worker.exitcode == -signal.SIGKILL
    assert not multiprocessing.active_children()
    assert not dist.is_initialized()


def test_the_watch_stops_the_other_workers_when_one_dies():
    """With more than one worker (the tiny model splits only two ways, so plain processes stand in): one killed,
    the watch reports it and terminates the others, which would otherwise wait on it forever."""
    spawn = multiprocessing.get_context("spawn")
    workers = [spawn.Process(target=time.sleep, args=(600,), daemon=True) for _ in range(3)]
    for p in workers:
        p.start()
    watch = WorkerWatch(workers)
    _kill(workers[1])
    failure = watch.lost(HANG_GUARD_S)
    assert failure is not None and failure.startswith("tensor-parallel worker rank 2 (pid ")
    assert "killed by SIGKILL" in failure
    for p in workers:
        p.join(HANG_GUARD_S)
    assert [p.exitcode for p in workers] == [-signal.SIGTERM, -signal.SIGKILL, -signal.SIGTERM]


def test_a_worker_that_has_exited_is_reported_before_the_next_order(monkeypatch):
    """A worker killed (and reaped) between generations: asked at once, before its next order, the watch says
    it is lost even while its thread is still finding out how (slowed here by a second). Control: the watch
    asked only for what it has recorded (the rule before) has nothing to say yet, and rank 0 would send the
    order into a dead worker's socket."""
    real = launch._how_it_ended

    def slow(p) -> str:
        time.sleep(1.0)
        return real(p)

    monkeypatch.setattr(launch, "_how_it_ended", slow)
    spawn = multiprocessing.get_context("spawn")
    for check_exited in (True, False):
        workers = [spawn.Process(target=time.sleep, args=(600,), daemon=True) for _ in range(2)]
        for p in workers:
            p.start()
        watch = WorkerWatch(workers)
        if not check_exited:
            monkeypatch.setattr(watch, "_exited", lambda: False)
        _kill(workers[0])
        failure = watch.lost(0.0)
        assert (failure is not None and "rank 1" in failure and "killed by SIGKILL" in failure) == check_exited
        watch.lost(HANG_GUARD_S)
        for p in workers:
            p.join(HANG_GUARD_S)


NO_GUARD = """
from specdecode import LLM

llm = LLM(target={target!r}, method="none", tensor_parallel_size=2)
print("generated", llm.generate([[5, 6, 7]])[0].token_ids)
"""


def test_a_script_without_the_main_guard_fails_fast_and_says_how_to_fix_it(tiny_target, tmp_path):
    """The spawned worker re-runs the script, builds an LLM at import and dies: rank 0 must not wait for it
    (it waited past 150 s, for the rendezvous' 10 minutes), but fail saying the guard is missing."""
    script = tmp_path / "no_guard.py"
    script.write_text(NO_GUARD.format(target=str(tiny_target)))
    paths = [str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH")]  # this checkout's specdecode
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, paths))}
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=HANG_GUARD_S, env=env, cwd=tmp_path
    )
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 1 and "generated" not in done.stdout
    assert last.startswith("specdecode.engine.tensor_parallel.WorkerLostError: tensor-parallel worker rank 1")
    assert "before joining rank 0" in last and 'under `if __name__ == "__main__":`' in last
    assert "a tensor-parallel worker, importing the main script" in done.stderr  # the worker's own error
