"""EOS, stop strings and max_tokens are honoured inside an accepted run; tokens past them are dropped."""

from __future__ import annotations

from specdecode import LLM, SamplingParams

PROMPT = [7, 8, 9, 10, 11, 12]
EOS = 2


def plain(tiny_target, **kw):
    llm = LLM(target=str(tiny_target), method="none")
    return llm.generate([PROMPT], SamplingParams(max_tokens=60, **kw))[0]


def spec(tiny_target, **kw):
    # The target drafting for itself: every draft is accepted, so stops fall inside runs of 9 tokens.
    llm = LLM(target=str(tiny_target), method="self", num_speculative_tokens=8)
    return llm.generate([PROMPT], SamplingParams(max_tokens=60, **kw))[0]


def test_eos_inside_accepted_run(tiny_target):
    ref = plain(tiny_target, ignore_eos=True).token_ids
    assert EOS in ref, "the tiny target must emit EOS for this test to check anything"
    out = spec(tiny_target)
    assert out.token_ids == ref[: ref.index(EOS) + 1]
    assert out.finish_reason == "stop"


def test_stop_string_inside_accepted_run(tiny_target):
    ref = plain(tiny_target, ignore_eos=True)
    stop = ref.text[13:15]
    cut = ref.text.index(stop)
    out = spec(tiny_target, ignore_eos=True, stop=[stop])
    assert out.text == ref.text[:cut]
    assert out.finish_reason == "stop"
    assert out.token_ids == ref.token_ids[: len(out.token_ids)] and len(out.token_ids) < len(ref.token_ids)


def test_max_tokens_inside_accepted_run(tiny_target):
    ref = plain(tiny_target, ignore_eos=True).token_ids
    for n in (1, 5, 12):
        out = LLM(target=str(tiny_target), method="self", num_speculative_tokens=8).generate(
            [PROMPT], SamplingParams(max_tokens=n, ignore_eos=True)
        )[0]
        assert out.token_ids == ref[:n] and out.finish_reason == "length"
