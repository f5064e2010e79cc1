"""The draft's config derived from a target's config.json."""

from __future__ import annotations

import pytest

from specdecode.config import ConfigError
from specdecode.train.draft_config import DraftOptions, build_draft_config

SMOLLM2 = dict(
    model_type="llama",
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    max_position_embeddings=8192,
    rms_norm_eps=1e-5,
    rope_theta=100000.0,
    tie_word_embeddings=True,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=2,
)

CASES = [  # (options, expected hidden, intermediate, heads, kv heads)
    (DraftOptions(), 576, 1536, 9, 3),
    (DraftOptions(hidden_size=256), 256, 704, 4, 1),
    (DraftOptions(hidden_size=384, intermediate_size=1024, num_heads=6, num_kv_heads=2), 384, 1024, 6, 2),
]


@pytest.mark.parametrize(("opts", "hidden", "inter", "heads", "kv"), CASES)
def test_shapes(opts, hidden, inter, heads, kv):
    cfg = build_draft_config(SMOLLM2, opts)
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads, cfg.num_key_value_heads) == (
        hidden,
        inter,
        heads,
        kv,
    )
    assert cfg.vocab_size == 49152 and cfg.tie_word_embeddings and cfg.num_hidden_layers == 2
    assert cfg.rope_parameters["rope_theta"] == 100000.0 and cfg.eos_token_id == 2


@pytest.mark.parametrize(
    ("opts", "words"),
    [
        (dict(hidden_size=100, num_heads=3), "not divisible by 3 attention heads"),
        (dict(num_heads=9, num_kv_heads=2), "not divisible by 2 key/value heads"),
        (dict(num_layers=0), "num_layers must be >= 1"),
    ],
)
def test_bad_options(opts, words):
    with pytest.raises(ConfigError, match=words):
        build_draft_config(SMOLLM2, DraftOptions(**opts))


def test_scaled_rope_is_refused():
    with pytest.raises(ConfigError, match="RoPE"):
        build_draft_config({**SMOLLM2, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, DraftOptions())
