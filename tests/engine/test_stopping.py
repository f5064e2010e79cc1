"""EOS, stop strings and max_tokens are honoured inside an accepted run; tokens past them are dropped."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

import specdecode.engine.engine
from specdecode import LLM, SamplingParams
from specdecode.detokenize import find_stop, stop_holdback
from specdecode.drafters import DRAFTERS

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


# ---- stop strings that straddle a step boundary ---------------------------------------------------------------
# Each request stops at a 3-character string cut from the reference text around one token boundary; every step
# boundary is a token boundary, so some of them begin in one engine step and end in a later one. While that
# happens, the text that could begin the stop string must not be sent: text once streamed is never taken back.

STOP_PROMPT = [17, 40, 52, 77, 81, 93]
STOP_TOKENS = 40
BOUNDARIES = range(2, 16)  # the stop string ends one character past token j - 1, for each j


@pytest.fixture(scope="module")
def greedy_reference(tiny_target, smollm2_tokenizer) -> tuple[list[int], str]:
    """Plain `transformers` greedy decoding of STOP_PROMPT (no EOS stop) and its text: the independent reference."""
    hf = AutoModelForCausalLM.from_pretrained(tiny_target, torch_dtype=torch.float32).eval()
    ids = list(STOP_PROMPT)
    with torch.no_grad():
        for _ in range(STOP_TOKENS):
            ids.append(int(hf(torch.tensor([ids])).logits[0, -1].argmax()))
    out = ids[len(STOP_PROMPT) :]
    return out, decode(smollm2_tokenizer, out)


def decode(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def straddling_stops(tokenizer, out: list[int], text: str) -> list[str]:
    """One stop string per boundary: the last two characters before it and the first one after."""
    stops = []
    for j in BOUNDARIES:
        end = len(decode(tokenizer, out[:j]))
        if 2 <= end < len(text) and text[end - 2 : end + 1] not in stops:
            stops.append(text[end - 2 : end + 1])
    return stops


def token_of_char(tokenizer, out: list[int], char: int) -> int:
    """The index of the output token whose text holds character `char`."""
    return next(i for i in range(len(out)) if len(decode(tokenizer, out[: i + 1])) > char)


def run_steps(llm: LLM, stops: list[str]) -> dict[str, tuple[list[int], list[str], str]]:
    """Step the engine by hand, one request per stop string: for each, the step that emitted each output token,
    the text deltas in order (what a stream sends) and the final text."""
    engine = llm.engine
    for i, stop in enumerate(stops):
        engine.add_request(
            str(i), list(STOP_PROMPT), SamplingParams(max_tokens=STOP_TOKENS, ignore_eos=True, stop=[stop])
        )
    steps: dict[str, list[int]] = {str(i): [] for i in range(len(stops))}
    deltas: dict[str, list[str]] = {str(i): [] for i in range(len(stops))}
    final: dict[str, str] = {}
    step = 0
    while engine.has_work():
        for u in engine.step():
            rid = u.seq.request_id
            steps[rid] += [step] * len(u.new_token_ids)
            deltas[rid].append(u.new_text)
            if u.finished:
                final[rid] = u.seq.text
        step += 1
    return {str(i): (steps[str(i)], deltas[str(i)], final[str(i)]) for i in range(len(stops))}


def stop_mismatches(method: str, tiny_target, drafts, tokenizer, reference) -> tuple[list[str], int]:
    """Every way a run with straddling stop strings departs from the reference cut by hand, and how many of the
    stop strings really began and ended in different engine steps."""
    out, text = reference
    stops = straddling_stops(tokenizer, out, text)
    assert len(stops) >= 8, "the reference text must offer stop strings at many boundaries"
    llm = LLM(
        target=str(tiny_target),
        draft=drafts.get(method),
        method=method,
        num_speculative_tokens=3,
        controller="fixed",
        max_num_seqs=len(stops),
    )
    runs = run_steps(llm, stops)
    offline = llm.generate(
        [STOP_PROMPT] * len(stops), [SamplingParams(max_tokens=STOP_TOKENS, ignore_eos=True, stop=[s]) for s in stops]
    )
    wrong, straddled = [], 0
    for i, stop in enumerate(stops):
        at = text.index(stop)
        want = text[:at]  # the reference cut by hand
        steps, deltas, final = runs[str(i)]
        first, last = token_of_char(tokenizer, out, at), token_of_char(tokenizer, out, at + len(stop) - 1)
        straddled += steps[first] < steps[last]
        streamed = ""
        for d in deltas:
            streamed += d
            if not want.startswith(streamed):
                wrong.append(f"stop {stop!r}: sent {streamed!r}, the answer is {want!r}")
                break
        if streamed != want or final != want:
            wrong.append(f"stop {stop!r}: streamed {streamed!r}, final {final!r}, want {want!r}")
        got = offline[i].outputs[0]
        if got.text != want or got.finish_reason != "stop" or got.token_ids != out[: last + 1]:
            wrong.append(f"stop {stop!r}: LLM.generate gave {got.text!r} ({got.finish_reason}), want {want!r}")
    return wrong, straddled


@pytest.mark.parametrize("method", list(DRAFTERS))
def test_stop_string_across_steps_is_never_sent(method, tiny_target, drafts, smollm2_tokenizer, greedy_reference):
    wrong, straddled = stop_mismatches(method, tiny_target, drafts, smollm2_tokenizer, greedy_reference)
    assert not wrong, "\n".join(wrong)
    assert straddled >= 1, "no stop string began and ended in different steps: the test checked nothing"


def test_sending_text_that_may_begin_a_stop_is_caught(
    tiny_target, drafts, smollm2_tokenizer, greedy_reference, monkeypatch
):
    """Fault: nothing is held back. The streamed text leaks the start of a straddling stop string."""
    monkeypatch.setattr(specdecode.engine.engine, "stop_holdback", lambda text, stops: 0)
    wrong, straddled = stop_mismatches("self", tiny_target, drafts, smollm2_tokenizer, greedy_reference)
    assert straddled >= 1 and any("sent" in w for w in wrong)


@pytest.mark.parametrize(
    "text, stops, held",
    [
        ("a wise", ["wise old"], 4),
        ("a wise o", ["wise old"], 6),
        ("a wise ox", ["wise old"], 0),
        ("abab", ["abac"], 2),  # the longest suffix that begins a stop string, not the first found
        ("xy", ["y", "xyz"], 2),  # one-character stops hold nothing back; another stop may
        ("", ["ab"], 0),
    ],
)
def test_stop_holdback(text, stops, held):
    assert stop_holdback(text, stops) == held


def test_find_stop_takes_the_earliest():
    assert find_stop("one two three", ["three", "two"], 0) == 4
    assert find_stop("one two three", ["one"], 1) is None
