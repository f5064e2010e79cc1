"""Log-probabilities of the tokens a step emitted, from the target's processed distribution at their positions.

Every emitted token, accepted draft, recovered or bonus, is a sample of the target's p at its position, so its
log-probability is read from that position's p, never from a residual: the same number plain decoding would
report. Token i of a chain comes from position i; in a tree from the node it follows (the root for the first).
"""

from __future__ import annotations

import torch

from specdecode.step.sequence import TokenLogprob
from specdecode.verify.chain import VerifyResult


def emitted_positions(result: VerifyResult) -> torch.Tensor:
    """[num_seqs, k + 1] int64 the position whose distribution produced each emitted token (0 past the end)."""
    num_seqs, width = result.output_token_ids.shape
    device = result.output_token_ids.device
    if result.path is None:
        return torch.arange(width, device=device).expand(num_seqs, width)
    nodes = torch.cat([torch.zeros((num_seqs, 1), dtype=torch.long, device=device), result.path + 1], 1)
    return nodes[:, :width].clamp(min=0)  # PAD (-1) + 1 = 0 past the accepted path


def emitted_logprobs(
    logprobs: torch.Tensor,  # [num_seqs, k + 1, vocab] processed log-probabilities at every position
    result: VerifyResult,
    wanted: list[int | None],  # per row: alternatives asked for (None = no logprobs)
) -> list[list[TokenLogprob] | None]:
    """Per row, one TokenLogprob per emitted token (num_accepted + 1 of them), or None where not wanted."""
    rows = [b for b, n in enumerate(wanted) if n is not None]
    out: list[list[TokenLogprob] | None] = [None] * len(wanted)
    if not rows:
        return out
    index = torch.tensor(rows, device=logprobs.device)
    positions = emitted_positions(result)[index]  # [rows, k + 1]
    vocab = logprobs.shape[-1]
    lp = logprobs[index].gather(1, positions[..., None].expand(-1, -1, vocab))  # [rows, k + 1, vocab]
    tokens = result.output_token_ids[index].clamp(min=0)  # [rows, k + 1]
    chosen = lp.gather(-1, tokens[..., None])[..., 0].tolist()  # [rows, k + 1]
    top_n = max(wanted[b] for b in rows)
    top_val, top_ids = lp.topk(max(top_n, 1), dim=-1)  # [rows, k + 1, top_n]
    top_val, top_ids = top_val.tolist(), top_ids.tolist()
    emitted = (result.num_accepted[index] + 1).tolist()
    token_ids = tokens.tolist()
    for r, b in enumerate(rows):
        n = wanted[b]
        out[b] = [
            TokenLogprob(token_ids[r][i], chosen[r][i], list(zip(top_ids[r][i][:n], top_val[r][i][:n], strict=True)))
            for i in range(emitted[r])
        ]
    return out
