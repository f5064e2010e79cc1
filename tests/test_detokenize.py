"""Incremental detokenization equals one-shot decoding and never emits broken UTF-8."""

import pytest

from specdecode.detokenize import REPLACEMENT, IncrementalDetokenizer


@pytest.mark.parametrize("text", ["Hello, world! café 日本語 🙂👍 done", "  spaces\n\nand\ttabs   ", "ünïcödé ☃☃☃"])
@pytest.mark.parametrize("chunk", [1, 2, 3])
def test_incremental_equals_full_decode(smollm2_tokenizer, text, chunk):
    tok = smollm2_tokenizer
    ids = tok(text).input_ids
    prompt = tok("Say:").input_ids
    detok = IncrementalDetokenizer(tok, prompt)
    pieces = [detok.add(ids[i : i + chunk]) for i in range(0, len(ids), chunk)]
    assert all(REPLACEMENT not in p for p in pieces)
    assert "".join(pieces) == tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def test_split_multibyte_character_is_held_back(smollm2_tokenizer):
    tok = smollm2_tokenizer
    ids = tok("🙂").input_ids
    assert len(ids) > 1, "the emoji must span several byte tokens for this test to mean anything"
    detok = IncrementalDetokenizer(tok, [])
    assert detok.add(ids[:1]) == ""  # a partial character is never emitted
    assert detok.add(ids[1:]) == "🙂"
