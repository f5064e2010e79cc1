"""Tree drafts report a node acceptance, never a chain's acceptance rate: at most one of a node's siblings can be
accepted, so accepted / drafted nodes is not comparable with accepted / drafted tokens of a chain."""

from __future__ import annotations

from rich.console import Console

from specdecode import LLM, SamplingParams
from specdecode.bench.lib import Sample
from specdecode.bench.specbench import ArmResult, render
from specdecode.server.async_engine import usage_of

PROMPT = [5, 6, 7, 8, 5, 6, 9, 5, 6, 7, 8, 5, 6]  # "5 6" recurs with different continuations: a tree has siblings
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def test_tree_metrics_are_named_per_node_and_chain_metrics_per_token(tiny_target):
    outs = {}
    for method in ("ngram", "ngram_tree"):
        llm = LLM(target=str(tiny_target), method=method, num_speculative_tokens=4, controller="fixed")
        engine = llm.engine
        seq = engine.add_request(method, PROMPT, GREEDY)
        while engine.has_work():
            engine.step()
        outs[method] = (seq.metrics.as_dict(), usage_of(seq)["speculative"])
    chain, chain_usage = outs["ngram"]
    tree, tree_usage = outs["ngram_tree"]
    assert tree["num_drafted"] > 0 and chain["num_drafted"] > 0
    assert "acceptance_rate" in chain and "node_acceptance_rate" not in chain
    assert "node_acceptance_rate" in tree and "acceptance_rate" not in tree
    assert tree["node_acceptance_rate"] == tree["num_accepted"] / tree["num_drafted"]
    assert "node_acceptance_rate" in tree_usage and "acceptance_rate" in chain_usage


def test_bench_tables_name_tree_acceptance():
    chain = ArmResult()
    chain.samples["qa"] = [Sample(10, 1.0, 8, 4, 6)]
    tree = ArmResult()
    tree.samples["qa"] = [Sample(10, 1.0, 20, 4, 6, trees=True)]
    base = ArmResult()
    base.samples["qa"] = [Sample(10, 1.0)]
    assert tree.table()["overall"]["node_acceptance_rate"] == 0.2 and "acceptance_rate" not in tree.table()["qa"]
    md = render({"ours K=0": base, "chain": chain, "tree": tree}, Console(quiet=True))
    sections = md.split("### ")
    assert "| acceptance |" in sections[2] and "node acceptance" not in sections[2]
    assert "| node acceptance |" in sections[3] and "| 0.20 |" in sections[3]
