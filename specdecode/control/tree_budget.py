"""How many tree nodes to verify: the drafter's path confidences, calibrated online, priced by the cost model.

For a tree, the expected number of accepted drafts is the sum over nodes of P(node's path accepted), which
tree drafters estimate by their path probability (EAGLE-2's observation). Drafters are over- or
under-confident, so the sum is scaled by an online ratio of accepted to predicted. Tree proposals list nodes
best first, so verifying the first w nodes of every row is verifying the best w-node subtree.
"""

from __future__ import annotations

import numpy as np

from specdecode.control.cost import CostModel


class ConfidenceCalibration:
    """EWMA of (accepted drafts) / (sum of the verified nodes' confidences); starts at `prior`."""

    def __init__(self, prior: float = 0.5, decay: float = 0.95, bounds: tuple[float, float] = (0.05, 2.0)) -> None:
        self.accepted = prior
        self.predicted = 1.0
        self.decay = decay
        self.bounds = bounds

    @property
    def scale(self) -> float:
        return float(np.clip(self.accepted / max(self.predicted, 1e-9), *self.bounds))

    def update(self, accepted: int, predicted: float) -> None:
        self.accepted = self.decay * self.accepted + (1 - self.decay) * accepted
        self.predicted = self.decay * self.predicted + (1 - self.decay) * predicted


def tree_width(
    confidence: np.ndarray, counts: np.ndarray, scale: float, cost: CostModel, context: float
) -> tuple[int, np.ndarray]:
    """Nodes to verify per row maximising expected tokens per second, and each row's predicted accepted drafts.

    confidence [B, n] path probability of each node (best first), counts [B] nodes each row has.
    """
    num_seqs, widest = confidence.shape
    valid = np.arange(widest)[None] < counts[:, None]  # [B, n]
    cum = np.concatenate([np.zeros((num_seqs, 1)), np.cumsum(confidence * valid, axis=1)], axis=1)  # [B, n + 1]
    tokens = (1.0 + scale * cum).sum(0)  # [n + 1] batch tokens if w nodes per row are verified
    seconds = np.array([cost.predict_verify(num_seqs, w, context) for w in range(widest + 1)])
    width = int(np.argmax(tokens / np.maximum(seconds, 1e-9)))
    return width, cum[:, width]
