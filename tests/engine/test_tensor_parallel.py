"""Tensor parallelism through the engine: with the target on two gloo ranks, greedy speculative output equals the
single process's plain greedy output for every drafter it runs; `LLM(..., tensor_parallel_size=2)` spawns its
worker, and closing it reaps the worker; what it can't run is refused before any process starts."""

from __future__ import annotations

import multiprocessing

import pytest
import torch.distributed as dist

from specdecode import LLM, SamplingParams
from specdecode.config import ConfigError
from specdecode.engine.launch import TP_METHODS
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


def _generate(llm: LLM) -> dict:
    outs = llm.generate(PROMPTS, GREEDY)
    return {
        "tokens": [o.token_ids for o in outs],
        "drafted": sum(o.metrics["num_drafted"] for o in outs),
        "accepted": sum(o.metrics["num_accepted"] for o in outs),
        "samples": [o.token_ids for o in llm.generate(PROMPTS[2:3], SAMPLES)[0].outputs],
    }


def _greedy_case(target: str, draft: str) -> dict[str, dict]:
    """Rank 0: the single process's plain greedy output, then every TP method's (3 slots for 4 prompts: rows
    join and leave the batch)."""
    with LLM(target=target, method="none", controller="fixed", max_num_seqs=3) as llm:
        result = {"reference": _generate(llm)}
    arms = [(method, "fixed") for method in TP_METHODS] + [("ngram_tree", "goodput")]
    for method, controller in arms:
        with session():
            draft_dir = draft if method == "draft" else None
            kwargs = dict(method=method, num_speculative_tokens=4, controller=controller, max_num_seqs=3)
            with LLM(target=target, draft=draft_dir, tensor_parallel_size=2, **kwargs) as llm:
                result[f"{method}+{controller}"] = _generate(llm)
    return result


@pytest.fixture(scope="module")
def outputs(tiny_target, tiny_draft) -> dict[str, dict]:
    return run_on_ranks(_greedy_case, str(tiny_target), str(tiny_draft))


@pytest.mark.parametrize("method", TP_METHODS)
def test_tensor_parallel_greedy_equals_single_process(outputs, method):
    out = outputs[f"{method}+fixed"]
    assert out["tokens"] == outputs["reference"]["tokens"]
    if method != "draft":  # one-hot drafts: a seeded sample's tokens are plain sampling's (streams.py)
        assert out["samples"] == outputs["reference"]["samples"]
    if method != "none":
        assert out["drafted"] > 0


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
        (dict(tensor_parallel_size=2, method="eagle"), "does not support method 'eagle'"),
        (dict(tensor_parallel_size=2, method="self"), "does not support method 'self'"),
        (dict(tensor_parallel_size=2, device="cuda:1"), "device type only"),
    ],
)
def test_unsupported_setups_are_refused_before_spawning(tiny_target, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        LLM(target=str(tiny_target), **kwargs)
    assert not multiprocessing.active_children()
    assert not dist.is_initialized()
