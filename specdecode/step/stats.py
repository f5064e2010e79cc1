"""What one engine step observed, fed back to the controller after verification."""

from __future__ import annotations

from dataclasses import dataclass

from specdecode.step.sequence import Sequence


@dataclass
class StepStats:
    """What one engine step observed, fed back to the controller after verification."""

    seqs: list[Sequence]
    num_proposed: list[int]  # drafts per row this step
    num_accepted: list[int]  # accepted drafts per row
    step_time_s: float  # wall time of propose + verify + commit
    num_verified_tokens: int  # tokens the verify computed: sum(k + 1) over rows, or rows * (widest k + 1) padded
    mean_context_len: float = 0.0  # tokens per row before the step, averaged (attention cost grows with it)
    propose_time_s: float = 0.0  # drafting (and truncation) part of step_time_s
    verify_time_s: float = 0.0  # target forward + acceptance part of step_time_s
    prefill_tokens: int = 0  # prompt tokens cached in the same target forward (engine.py fused_prefill)
