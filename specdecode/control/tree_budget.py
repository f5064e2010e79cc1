"""How many tree nodes to verify: the drafter's path confidences, calibrated online, priced by the cost model.

For a tree, the expected number of accepted drafts is the sum over nodes of P(node's path accepted), which
tree drafters estimate by their path probability (EAGLE-2's observation). Drafters are over- or
under-confident, and more so deep down (an n-gram continuation seen once has confidence 1 at every depth),
so each depth's confidences are scaled by an online ratio of paths accepted to confidence spent there. Tree
proposals list nodes best first, so verifying the first w nodes of a row verifies its best w-node subtree.
"""

from __future__ import annotations

import numpy as np

from specdecode.control.cost import CostModel

MAX_DEPTH = 64


class ConfidenceCalibration:
    """Per depth d: EWMA of (accepted path reached d) / (sum of confidences of verified nodes at depth d)."""

    def __init__(self, prior: float = 0.5, decay: float = 0.95, bounds: tuple[float, float] = (0.02, 2.0)) -> None:
        self.accepted = np.full(MAX_DEPTH + 1, prior)  # [depth] index 0 unused
        self.predicted = np.ones(MAX_DEPTH + 1)
        self.decay = decay
        self.bounds = bounds

    def scale(self, depth: np.ndarray) -> np.ndarray:
        """depth [...] int -> [...] the factor that turns a confidence at that depth into P(accepted)."""
        ratio = self.accepted / np.maximum(self.predicted, 1e-9)
        return np.clip(ratio, *self.bounds)[np.minimum(depth, MAX_DEPTH)]

    def update(self, confidence: np.ndarray, depth: np.ndarray, num_accepted: int) -> None:
        """The verified nodes' confidences [n] and depths [n] of one row, and how deep its accepted path went."""
        for d in np.unique(np.minimum(depth, MAX_DEPTH)):
            spent = confidence[depth == d].sum()
            self.accepted[d] = self.decay * self.accepted[d] + (1 - self.decay) * float(num_accepted >= d)
            self.predicted[d] = self.decay * self.predicted[d] + (1 - self.decay) * spent


def tree_width(
    confidence: np.ndarray,
    depth: np.ndarray,
    counts: np.ndarray,
    calib: ConfidenceCalibration,
    cost: CostModel,
    context: float,
) -> int:
    """Nodes to verify per row maximising expected tokens per second.

    confidence [B, n] path probability of each node (best first), depth [B, n] its depth, counts [B] nodes each
    row has.
    """
    num_seqs, widest = confidence.shape
    valid = np.arange(widest)[None] < counts[:, None]  # [B, n]
    gain = confidence * calib.scale(depth) * valid  # [B, n] expected accepted drafts contributed by each node
    cum = np.concatenate([np.zeros((num_seqs, 1)), np.cumsum(gain, axis=1)], axis=1)  # [B, n + 1]
    tokens = (1.0 + cum).sum(0)  # [n + 1] batch tokens if w nodes per row are verified
    seconds = np.array([cost.predict_rows(np.minimum(counts, w), context) for w in range(widest + 1)])
    return int(np.argmax(tokens / np.maximum(seconds, 1e-9)))
