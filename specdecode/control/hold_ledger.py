"""Whether the prompt lookup's drafts for rows the draft model skips pay for what they cost, as measured.

`goodput` asks each row it gives no model drafts for the lookup's drafts alone (`GoodputController._hold`): free
where a row copies its prompt, but not free. Each held row's lookup runs every step, and so does the drafter's step
around it; on the Qwen2.5-Coder pair at 8 rows of 256 tokens (K = 0 the best arm: a verified token is a row of a
compute-bound step) holding every row for lookups that found almost nothing (0.03 drafts verified a row a step) made
`goodput` 0.937x K = 0, where it had asked nothing before (the batch-8 `bench long-context` command of
docs/benchmarks.md at 43ab432, 2026-11-30: its printed 256-token cell; the run was stopped before it wrote its file).

So the ledger keeps, over the last ~10 steps that held rows (decayed sums), what their accepted drafts saved (each
accepted token a plain step's time over its rows: the step it spares that row) against what they cost (the
lookups' time, measured where only held rows drafted, and the verify's price of their drafts). Holding goes on while
the savings cover the cost; once they do not, rows are held again only every `probe_every` steps that could hold
any, so that text which starts to copy its prompt is found again. Until `min_steps` steps (decayed) have held rows
it holds: a lookup finds drafts in a few steps of a copying answer, not every one, and one step that found nothing
is no evidence.
"""

from __future__ import annotations


class HoldLedger:
    def __init__(self, decay: float = 0.9, probe_every: int = 16, min_steps: float = 4.0) -> None:
        self.decay = decay
        self.probe_every = probe_every
        self.min_steps = min_steps
        self.steps = 0.0  # decayed count of the steps that held rows
        self.saved_s = 0.0  # decayed seconds the held rows' accepted lookup drafts saved
        self.cost_s = 0.0  # decayed seconds their lookups and verified drafts cost
        self.lookup_row_s = 0.0  # one held row's lookup (and its share of the drafter's step), as last measured
        self.closed_steps = 0  # steps that could have held rows since the ledger last held any

    def holds(self) -> bool:
        """Whether to hold this step's candidate rows: the lookups have paid lately (or nothing says otherwise), or,
        closed, a probe is due. Asked once a step that has rows to hold."""
        paid = self.saved_s >= self.cost_s or self.steps < self.min_steps
        if paid or self.closed_steps + 1 >= self.probe_every:
            self.closed_steps = 0
            return True
        self.closed_steps += 1
        return False

    def record(self, rows: int, saved_s: float, verify_s: float, propose_s: float | None) -> None:
        """A step that held `rows` rows: saved_s what their accepted drafts saved, verify_s what verifying their drafts
        cost, propose_s the step's drafting time where only held rows drafted (None: the draft model drafted too,
        and the lookups' share is the last measured one)."""
        if propose_s is not None:
            self.lookup_row_s = propose_s / max(rows, 1)
        self.steps = self.decay * self.steps + 1.0
        self.saved_s = self.decay * self.saved_s + saved_s
        self.cost_s = self.decay * self.cost_s + verify_s + self.lookup_row_s * rows
