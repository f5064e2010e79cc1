"""`bench long-prompt`'s "without" window holds decode steps only: the short streams are settled (each has its
first token) before it opens, so a stream's own prompt chunks never count as the baseline's gaps. Negative
control: the old fixed two warm-up steps leave streams prefilling at a small budget, and the same check fails."""

from __future__ import annotations

import pytest

from specdecode.bench.long_prompt import Scene, Window
from specdecode.llm import LLM
from tests.bench.conftest import eager_smollm2_ngram

# Prompts of ~40 tokens each: eight of them need several 32-token steps to prefill.
PROMPTS = [[(7 * i + j) % 500 + 20 for j in range(40)] for i in range(8)]


@pytest.fixture(scope="module")
def smollm2() -> LLM:
    return eager_smollm2_ngram(max_num_seqs=8, max_model_len=128, max_num_batched_tokens=32)


def prefilling_after(llm: LLM, warm_up) -> list[str]:
    """The short streams still without a first token once `warm_up(scene)` ran, seven of them having arrived
    while the first decodes."""
    scene = Scene(llm, PROMPTS, max_tokens=64)
    scene.start_short(0)
    for _ in range(2):  # stream 0 decodes: the others' prompts now go at the budget, not in one idle chunk
        scene.step(None)
    for i in range(1, len(PROMPTS)):
        scene.start_short(i)
    warm_up(scene)
    late = [s.request_id for s in scene.requests() if s.metrics.num_generated == 0]
    scene.clear()
    return late


def test_the_window_opens_once_every_stream_decodes(smollm2):
    assert prefilling_after(smollm2, lambda scene: scene.settle()) == []


def test_control_two_fixed_steps_leave_streams_prefilling(smollm2):
    def two_steps(scene: Scene) -> None:  # the old warm-up
        for _ in range(2):
            scene.step(None)

    assert len(prefilling_after(smollm2, two_steps)) >= 4


def test_streams_started_in_a_window_report_their_first_token_wait(smollm2):
    """Streams of 4 tokens end every step or two and are replaced: each replacement's first token is a wait of its
    own in the window (`ttft_s`), never a gap between tokens (`tpot_s`)."""
    scene = Scene(smollm2, PROMPTS[:2], max_tokens=4)
    for i in range(2):
        scene.start_short(i)
    scene.settle()
    window, tokens = Window(), 0
    for _ in range(20):
        tokens += sum(len(u.new_token_ids) > 0 for u in scene.step(window) if u.seq.request_id.startswith("short"))
    scene.clear()
    assert len(window.ttft_s) >= 4 and all(t > 0 for t in window.ttft_s)
    assert len(window.tpot_s) + len(window.ttft_s) == tokens  # each token-bearing update counted once
