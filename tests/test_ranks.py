"""The test helper that runs a case on a gloo group (tests/ranks.py) removes its store only after its workers
have left: a worker's FileStore touches the store file as it goes, and a file removed under it aborts the worker
(SIGABRT, once in CI). Control: rank 0 told its workers are gone at once, as the old order did, is caught."""

from __future__ import annotations

import multiprocessing
from unittest import mock

import pytest

from tests import ranks


def _seven() -> int:
    return 7


@pytest.mark.parametrize("fault", [False, True], ids=["intact", "rank0_does_not_wait"])
def test_the_store_outlives_the_workers(fault):
    alive_at_removal: list[int] = []
    spawned: list = []
    real_rmtree, real_start = ranks.shutil.rmtree, ranks.mp.start_processes

    def rmtree(path, **kwargs) -> None:
        alive_at_removal.append(sum(p.is_alive() for p in spawned))
        real_rmtree(path, **kwargs)

    def start_processes(*args, **kwargs):
        context = real_start(*args, **kwargs)
        spawned.extend(context.processes)
        if fault:
            context.join = lambda *a, **k: True  # "every worker has left", at once
        return context

    with (
        mock.patch.object(ranks.shutil, "rmtree", rmtree),
        mock.patch.object(ranks.mp, "start_processes", start_processes),
    ):
        assert ranks.run_on_ranks(_seven) == 7
    for p in spawned:  # the control's worker is still leaving: reap it
        p.join(60)
    assert len(alive_at_removal) == 1
    assert (alive_at_removal[0] == 0) != fault, alive_at_removal
    assert not multiprocessing.active_children()
