"""experiments.goodput_replay charges each replayed step what the engine would do at it: drafts accepted while the
teacher-forced draft agrees, the draft's catch-up by its backlog, the verify by its width."""

from __future__ import annotations

import numpy as np
import pytest

from experiments.goodput_replay import Prices, Replay, Text, load_cell, replay_passes, save_cell
from specdecode.control.goodput import GoodputController

PRICES = Prices({w: 0.01 * (1 + 0.1 * w) for w in range(1, 7)}, {1: 0.003, 2: 0.004, 3: 0.005, 16: 0.018})


def text(agree: list[bool], confidence: float = 0.9) -> Text:
    n = len(agree)
    return Text(list(range(10)), list(range(100, 100 + n)), np.array(agree), np.full(n, confidence))


def replayed(k: int, agree: list[bool]) -> Replay:
    replay = Replay(None, k, PRICES, 0.7)
    replay.run(text(agree), "r", 64)
    return replay


def test_fixed_k_is_charged_step_by_step():
    # 9 tokens, the first step's drafts the first two (the prompt's last token pending, as the engine leaves it).
    # Step 1 at t = 0: drafts 100, 101 both agree -> 3 tokens (t = 3), the draft reads 1 token (the pending one) then
    # drafts once more; all accepted, so its next backlog is 2. Step 2 at t = 3: draft 104 misses -> 2 tokens
    # (t = 5). Step 3 at t = 5: both agree -> t = 8. Step 4 at t = 8: no room left (end 9): K 0.
    replay = replayed(2, [True, True, True, True, False, True, True, True, True])
    assert replay.k_chosen == [2, 2, 2, 0] and replay.tokens == 9
    draft = (0.003 + 0.003) + (0.004 + 0.003) + (0.003 + 0.003)  # backlogs 1, 2, 1
    verify = 3 * PRICES.target[3] + PRICES.target[1]
    assert replay.seconds == pytest.approx(draft + verify)


@pytest.mark.parametrize("agrees", [True, False], ids=["right", "control-wrong"])
def test_a_draft_pays_only_where_it_agrees(agrees):
    """The same assertion fails for a draft that is never right: its steps pay drafts and a wider verify for one
    token each."""
    agree = [agrees] * 30
    speculating, plain = replayed(2, agree), replayed(0, agree)
    assert speculating.tokens == plain.tokens == 30
    assert (speculating.seconds < 0.7 * plain.seconds) == agrees


def test_a_doubtful_draft_stops_the_chain():
    replay = Replay(None, 3, PRICES, 0.7)
    replay.run(text([True] * 6, confidence=0.5), "r", 64)  # every draft doubtful: one a step
    assert replay.tokens == 6 and replay.seconds == pytest.approx(
        PRICES.draft[1] + PRICES.draft[2] * 2 + PRICES.target[2] * 3
    )


def test_goodput_replays_through_the_real_controller():
    ctrl = GoodputController()
    ctrl.acceptance.seed_pool(0.9, 8.0)
    replay = Replay(ctrl, 0, PRICES, 0.0)
    for i in range(3):
        replay.run(text([True] * 40), f"r{i}", 64)
    assert replay.tokens == 3 * 40 and max(replay.k_chosen) > 1  # it drafts on a draft that is always right
    assert not ctrl.live_request_ids()  # each request ended


def test_texts_and_prices_come_back_as_saved(tmp_path):
    path = str(tmp_path / "texts.npz")
    texts = [text([True, False, True]), text([False] * 5, confidence=0.3)]
    save_cell(path, 256, texts, PRICES)
    save_cell(path, 2048, texts[:1], PRICES)  # another context joins the same file
    back, prices = load_cell(path, 256)
    assert [t.response for t in back] == [t.response for t in texts] and back[0].prompt == texts[0].prompt
    assert [t.agree.tolist() for t in back] == [t.agree.tolist() for t in texts]
    assert prices == PRICES and len(load_cell(path, 2048)[0]) == 1 and load_cell(path, 8192) is None
    first, again = replayed(2, [True, False, True] * 4), Replay(None, 2, prices, 0.7)
    again.run(
        Text(back[0].prompt, [100 + i for i in range(12)], np.array([True, False, True] * 4), np.full(12, 0.9)), "r", 64
    )
    assert (again.tokens, again.seconds) == (first.tokens, first.seconds)


def pessimistic_goodput() -> GoodputController:
    """goodput started from a pessimistic pool (0.3) and a draft at 6 ms."""
    ctrl = GoodputController()
    ctrl.cost.seed_draft(0.006)
    ctrl.acceptance.seed_pool(0.3, 8.0)
    return ctrl


def test_passes_are_reported_one_by_one_and_a_controller_keeps_what_it_learned():
    """A fixed arm's passes over the same texts cost the same; goodput, started from a pessimistic pool (0.3) and a
    draft at 6 ms, learns from its requests that the draft is always right and is faster in its last pass."""
    texts = [text([True] * 40) for _ in range(3)]
    fixed = replay_passes(Replay(None, 2, PRICES, 0.0), texts, "f", 2, 64)
    assert fixed[0] == pytest.approx(fixed[1])
    learning = replay_passes(Replay(pessimistic_goodput(), 0, PRICES, 0.0), texts, "g", 3, 64)
    assert learning[-1] > 1.1 * learning[0]


def test_drafts_truncate_cuts_are_charged_as_made():
    """A controller that asks 2 drafts a step and verifies none pays for the 2 drafts every step, as the engine does
    (the draft model ran them), and for a one-token verify. Control: charging only the drafts kept, as the replay
    did before 2026-11-29, would charge the verify alone."""
    import torch

    ctrl = GoodputController()
    ctrl.choose = lambda seqs, k_max: [2] * len(seqs)
    ctrl.truncate = lambda seqs, proposal: proposal.truncated(torch.zeros_like(proposal.num_tokens))
    replay = Replay(ctrl, 0, PRICES, 0.7)
    replay.run(text([True] * 6), "r", 64)
    # K as the request's end clamps it: 2, 2, 2, 2, 1, 0; nothing verified, so the draft's backlog grows a token a step
    assert replay.k_chosen == [2, 2, 2, 2, 1, 0]
    drafting = sum(PRICES.draft_s(b + 1) + (k - 1) * PRICES.draft_s(1) for b, k in enumerate(replay.k_chosen) if k)
    assert replay.seconds == pytest.approx(drafting + 6 * PRICES.target[1])
    assert replay.seconds > 6 * PRICES.target[1] * 1.2


def test_a_cold_arm_starts_every_text_afresh():
    """`renew` (the replay's goodput-cold, as the bench starts each arm's repeat): the same texts replayed again
    cost what they did the first time. Control: the test above, the same start carried from text to text, learns
    and gets faster."""
    texts = [text([True] * 40) for _ in range(3)]
    cold = replay_passes(Replay(None, 0, PRICES, 0.0, renew=pessimistic_goodput), texts, "c", 3, 64)
    assert cold[-1] == pytest.approx(cold[0])
