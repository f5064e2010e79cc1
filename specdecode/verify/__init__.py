"""Lossless verification: what the target keeps of a step's drafts, chain or tree, greedy or sampled.

Each verified row emits, in order:
- **accepted** tokens: drafts the target keeps (a greedy row: the draft equals the target's argmax; a sampled row:
  the exponential race for one-hot drafts, rejection sampling min(1, p / q) for sampled ones);
- at most one **recovered** token, drawn at the first rejected position from the target's p with the rejected
  mass taken out (normalize(max(0, p - q)), or the race's own sample for one-hot drafts);
- or, when every draft was accepted, one **bonus** token drawn from the target's p after the last draft.
So every step emits accepted + 1 tokens, and the output has exactly the target's distribution. Padding uses one
sentinel, PAD_TOKEN_ID (sampling.py).

The modules: sampling.py (logits -> the processed p: temperature, top-k, top-p; q of sampled drafts),
logits_adjust.py (penalties, logit_bias and grammar masks applied along each draft's own path), streams.py (the
seeded random streams every draw reads), chain.py (verifying a chain), tree.py (verifying a token tree by
SpecInfer's sibling rule) and tree_layout.py (a tree's parents, depths and attention layout).
"""
