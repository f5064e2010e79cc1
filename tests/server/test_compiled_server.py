"""`specdecode serve` as a user gets it, without --enforce-eager: the suite runs eagerly (tests/conftest.py), so
this is the one server test on the compiled step (models/compiled.py, with the few-rows kernels on an AVX-512
CPU). Its greedy completions, speculating with the n-gram chain, equal the eager LLM's plain decoding."""

from __future__ import annotations

import httpx

from specdecode import LLM
from specdecode.models.compiled import ENFORCE_EAGER_ENV
from specdecode.server.process import LiveServer
from tests.models.test_compiled import GREEDY, PROMPTS
from tests.server.conftest import MODEL


def test_compiled_server_greedy_equals_eager_llm(tiny_target, tmp_path, monkeypatch):
    eager = LLM(target=str(tiny_target), method="none", max_num_seqs=4, enforce_eager=True)
    want = [o.text for o in eager.generate(PROMPTS, GREEDY)]
    monkeypatch.setenv(ENFORCE_EAGER_ENV, "0")  # the server process inherits it: the compiled step, the default
    log = tmp_path / "server.log"
    flags = ["--target", str(tiny_target), "--served-model-name", MODEL, "--method", "ngram", "--max-num-seqs", "4"]
    # On a machine that has not compiled this model yet the server compiles it before it answers (minutes on
    # two cores; later starts load the package from disk), hence the long start limit.
    with LiveServer(flags, log, start_timeout_s=600) as server:
        got = []
        for prompt in PROMPTS:
            body = {"model": MODEL, "prompt": prompt, "max_tokens": GREEDY.max_tokens, "temperature": 0.0}
            r = httpx.post(server.url + "/v1/completions", json={**body, "ignore_eos": True}, timeout=60)
            assert r.status_code == 200, r.text
            got.append(r.json()["choices"][0]["text"])
    assert "compiled target step" in log.read_text()  # load_target's progress bar: it did not run eagerly
    assert got == want
