"""`goodput`'s predicted tokens, seconds and goodput per K against the replay's truth, averaged over its steps.

    python -m experiments.goodput_curve_check --texts-file F --context 8192 [--blind] [--out results/...json]

Replays `goodput` (experiments/goodput_replay.py: the pair's load probe, the draft's confidence stop, a cached
texts file's teacher-forced agreement and prices) and records, at each step, what it predicted every K would give
(`curve_parts`' tokens and seconds) and what asking that K there would have given: the drafts the stop makes, the
run accepted, their prices. A controller whose prices or continuation are biased shows it as a gap between the two
averages. --blind: the last draft's confidence never tells the continuation where the drafter would have stopped
(control/continuation.py), as before 2026-11-29. The truth takes a backlog of one token a step (the replay charges
two after a fully accepted step: ~3 ms at 8,192 tokens, a few percent of a step).
"""

from __future__ import annotations

import argparse

import numpy as np

import experiments.goodput_replay as gr
import specdecode.control.goodput as goodput_module
from experiments.goodput_draft_context import pair_llm
from specdecode.bench.lib import provenance, write_result

MAX_TOKENS = 64


class Recorder:
    """Wraps `curve_parts`: keeps the tokens and seconds [k_max + 1] of each full-width goodput curve."""

    def __init__(self) -> None:
        self.parts = goodput_module.curve_parts
        self.tokens: list[np.ndarray] = []
        self.seconds: list[np.ndarray] = []

    def __call__(self, reach: np.ndarray, *args) -> tuple[np.ndarray, np.ndarray]:
        tokens, seconds = self.parts(reach, *args)  # [k_max + 1] each
        if reach.shape[1] == gr.K_MAX:  # not `_explore`'s K <= 1 curve
            self.tokens.append(tokens)
            self.seconds.append(seconds)
        return tokens, seconds


def truth(text: gr.Text, t: int, k: int, prices: gr.Prices) -> tuple[int, float]:
    """(tokens, seconds) of asking K = k at response position t: the stop's drafts, the run accepted, their prices."""
    k = max(0, min(k, min(MAX_TOKENS, len(text.response)) - t - 1))
    made = gr.Replay(None, k, prices, gr.STOP_BELOW).drafted(text, t, k)
    return gr.accepted_run(text, t, made) + 1, prices.draft_s(1) * made + prices.target[made + 1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--texts-file", required=True, help="goodput_replay's cached texts and prices")
    ap.add_argument("--context", type=int, required=True)
    ap.add_argument("--blind", action="store_true", help="no verdict from the last draft's confidence")
    ap.add_argument("--out", default="results/goodput_curve_check.json")
    a = ap.parse_args()
    base = pair_llm(max_model_len=8192 + MAX_TOKENS + 2 * gr.K_MAX + 8)
    texts, prices = gr.load_cell(a.texts_file, a.context)
    recorder = Recorder()
    goodput_module.curve_parts = recorder
    ctrl = base.new_controller("goodput")
    if a.blind:
        ctrl._would_go_on = lambda seqs, proposal: {}
    replay = gr.Replay(ctrl, 0, prices, gr.STOP_BELOW)
    positions: list[tuple[gr.Text, int]] = []
    step = replay.step

    def recording_step(seq, text, end) -> None:
        positions.append((text, seq.metrics.num_generated))
        step(seq, text, end)

    replay.step = recording_step
    gr.replay_passes(replay, texts, "check", 2, MAX_TOKENS)
    ks = np.arange(gr.K_MAX + 1)
    true = np.array([[truth(text, t, k, prices) for k in ks] for text, t in positions])  # [steps, K, 2]
    predicted_tokens, predicted_s = np.mean(recorder.tokens, axis=0), np.mean(recorder.seconds, axis=0)
    true_tokens, true_s = true[..., 0].mean(0), true[..., 1].mean(0)
    cell = {
        "context": a.context,
        "steps": len(positions),
        "k_asked_mean": float(np.mean(replay.k_chosen)),
        "predicted_tokens": predicted_tokens.tolist(),
        "true_tokens": true_tokens.tolist(),
        "predicted_ms": (1e3 * predicted_s).tolist(),
        "true_ms": (1e3 * true_s).tolist(),
        "predicted_goodput_over_k0": (predicted_tokens / predicted_s * predicted_s[0]).tolist(),
        "true_goodput_over_k0": (true_tokens / true_s * true_s[0]).tolist(),
    }
    for key in ("predicted_tokens", "true_tokens", "predicted_ms", "true_ms"):
        print(f"{key:>16}", " ".join(f"{x:7.2f}" for x in cell[key]))
    for key in ("predicted_goodput_over_k0", "true_goodput_over_k0"):
        print(f"{key[:16]:>16}", " ".join(f"{x:7.3f}" for x in cell[key]))
    result = {
        **provenance(model=base.target),
        "command": f"python -m experiments.goodput_curve_check --texts-file {a.texts_file.split('/')[-1]} "
        f"--context {a.context}" + (" --blind" if a.blind else ""),
        "cell": cell,
    }
    print(f"wrote {write_result(a.out, result)}")


if __name__ == "__main__":
    main()
