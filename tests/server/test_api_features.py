"""logprobs, n, penalties, logit_bias and JSON output through the official openai client, streaming and not,
against the real SmolLM2 served with n-gram speculation; each compared with the offline LLM (no speculation)."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from specdecode.config import SamplingParams, StructuredOutputs
from specdecode.server import logprobs as logprobs_module
from specdecode.server.logprobs import LOGPROB_FLOOR, LogprobFormats
from specdecode.step.sequence import TokenLogprob
from tests.server.conftest import MODEL

PROMPT = "The three primary colors are"
CHAT = [{"role": "user", "content": "Describe a cat named Tom."}]
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer"},
        "colors": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
    },
    "required": ["name", "age", "colors"],
}


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_completion_logprobs_equal_offline(client, reference_llm):
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, logprobs=3)
    want = reference_llm.generate(PROMPT, SamplingParams(max_tokens=12, logprobs=3))[0]
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(want.token_ids) and "".join(lp.tokens) == r.choices[0].text
    for got, ref in zip(lp.token_logprobs, want.logprobs, strict=True):
        assert abs(got - ref.logprob) < 1e-3
    assert all(len(top) == 3 for top in lp.top_logprobs)
    assert lp.text_offset[0] == 0


def test_chat_logprobs_streamed_equal_unstreamed(client):
    kw = dict(model=MODEL, messages=CHAT, max_tokens=16, temperature=0, logprobs=True, top_logprobs=2)
    whole = client.chat.completions.create(**kw).choices[0].logprobs.content
    streamed = []
    for chunk in client.chat.completions.create(**kw, stream=True):
        if chunk.choices and chunk.choices[0].logprobs:
            streamed += chunk.choices[0].logprobs.content
    assert [(e.token, round(e.logprob, 4)) for e in streamed] == [(e.token, round(e.logprob, 4)) for e in whole]
    assert all(len(e.top_logprobs) == 2 and e.top_logprobs[0].logprob >= e.logprob - 1e-6 for e in whole)


def test_n_samples_streamed_and_not(client, reference_llm):
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=10, temperature=1.0, seed=5, n=3)
    r = client.completions.create(**kw)
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    texts = {c.index: c.text for c in r.choices}
    want = reference_llm.generate(PROMPT, SamplingParams(max_tokens=10, temperature=1.0, seed=5, n=3))[0]
    assert [texts[i] for i in range(3)] == [o.text for o in want.outputs]
    streamed = {i: "" for i in range(3)}
    finished = set()
    for chunk in client.completions.create(**kw, stream=True):
        for c in chunk.choices:
            streamed[c.index] += c.text
            if c.finish_reason:
                finished.add(c.index)
    assert streamed == texts and finished == {0, 1, 2}


def test_penalties_and_bias_equal_offline(client, reference_llm):
    comma = reference_llm.encode(",")[0]
    kw = dict(frequency_penalty=1.0, presence_penalty=0.5, logit_bias={str(comma): -100})
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0, **kw)
    params = SamplingParams(max_tokens=24, frequency_penalty=1.0, presence_penalty=0.5, logit_bias={comma: -100.0})
    want = reference_llm.generate(PROMPT, params)[0]
    assert r.choices[0].text == want.text and comma not in want.token_ids
    plain = reference_llm.generate(PROMPT, SamplingParams(max_tokens=24))[0]
    assert plain.text != want.text  # the penalties changed something


@pytest.mark.parametrize("stream", [True])  # non-streamed chat shares the path (test_openai_client.py)
def test_json_schema_output_parses_and_validates(client, reference_llm, stream):
    fmt = {"type": "json_schema", "json_schema": {"name": "cat", "schema": SCHEMA}}
    kw = dict(model=MODEL, messages=CHAT, max_tokens=120, temperature=0, response_format=fmt)
    if stream:
        text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(**kw, stream=True))
    else:
        text = client.chat.completions.create(**kw).choices[0].message.content
    doc = json.loads(text)
    jsonschema.validate(doc, SCHEMA)  # types, required keys, maxLength and maxItems, as a validator reads them
    assert set(doc) == {"name", "age", "colors"}  # and nothing the schema did not ask for
    params = SamplingParams(max_tokens=120, structured_outputs=StructuredOutputs(json=SCHEMA))
    assert text == reference_llm.chat(CHAT, params)[0].text


def test_json_object_mode(client):
    r = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=48, temperature=0.7, seed=1, response_format={"type": "json_object"}
    )
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:  # a run-on object hit max_tokens: still a prefix of one
        assert r.choices[0].message.content.lstrip().startswith("{")


def test_filtered_alternatives_come_back_as_the_floor(client):
    """top_p keeps one token, the request asks for 5 alternatives: the other 4 have log-probability -inf, which
    JSON cannot carry (this was a 500, found by the fuzz test). They come back as -9999.0, as from vLLM."""
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=1.0, top_p=1e-6, logprobs=5)
    for top in r.choices[0].logprobs.top_logprobs:
        assert sorted(top.values())[:-1] == [LOGPROB_FLOOR] * (len(top) - 1)
    chat = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=4, temperature=1.0, top_p=1e-6, logprobs=True, top_logprobs=5
    )
    for entry in chat.choices[0].logprobs.content:
        assert [t.logprob for t in entry.top_logprobs][1:] == [LOGPROB_FLOOR] * 4


def test_filtered_alternatives_would_not_serialise(smollm2_tokenizer, monkeypatch):
    """The formats' output goes through JSON as the server sends it (no NaN or infinity allowed). Negative
    control: the same entries without the floor do not serialise."""
    entries = [TokenLogprob(5, -0.5, [(5, -0.5), (6, float("-inf"))])]
    formats = LogprobFormats(smollm2_tokenizer)

    def serialise() -> None:
        for shape in (formats.chat_logprobs(entries), formats.completion_logprobs(entries)):
            json.dumps(shape, allow_nan=False)

    serialise()
    monkeypatch.setattr(logprobs_module, "finite", lambda v: v)
    with pytest.raises(ValueError, match="not JSON compliant"):
        serialise()
