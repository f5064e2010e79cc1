"""`bench startup`: a run reports its seconds and memory, and the KV bytes count the draft model's cache too."""

from __future__ import annotations

import math

from rich.console import Console

from specdecode import LLM
from specdecode.bench import startup


def _kv_bytes(cfg, slots: int, length: int) -> int:
    """K and V of a cache as KVCache lays it out: [layers, slots, kv_heads, length + 1 scratch, head_dim] fp32."""
    return 2 * 4 * cfg.num_layers * slots * cfg.num_kv_heads * (length + 1) * cfg.head_dim


def test_kv_mib_counts_the_engine_and_the_draft_models_caches(tiny_target, tiny_draft):
    llm = LLM(target=str(tiny_target), method="draft", draft=str(tiny_draft), max_num_seqs=2, max_model_len=64)
    want = _kv_bytes(llm.target.cfg, 2, 64) + _kv_bytes(llm.draft_model.cfg, 2, 64)
    assert startup.kv_mib(llm) * 2**20 == want
    plain = LLM(target=str(tiny_target), method="none", max_num_seqs=2, max_model_len=64)
    assert startup.kv_mib(plain) * 2**20 == _kv_bytes(plain.target.cfg, 2, 64)  # no drafter cache: none counted


def test_a_run_reports_its_seconds_and_memory_and_the_table_shows_them():
    """A fresh process on SmolLM2 (its GGUF blocks kept, eager): the fields, sane, and the table's row."""
    settings = {"target": "smollm2-135m-instruct", "method": "none", "max_num_seqs": 1, "enforce_eager": True}
    run = startup.run_once(settings, None, 4)
    assert run["tokens"] == 4 and run["ready_s"] > 0 and run["request_s"] > 0
    assert 50 < run["rss_ready_mib"] <= run["rss_mib"] < 8192 and run["kv_mib"] > 0
    md, summary = startup.render({"second start": [run, run]}, Console(file=None, quiet=True))
    assert summary["second start"]["rss_mib"] == run["rss_mib"]
    assert md.splitlines()[2].startswith(f"| second start | 2 | {run['ready_s']:.1f} |")


def test_rss_reads_this_process():
    assert math.isfinite(startup.rss_mib()) and startup.rss_mib() > 10
