"""How this machine's speed moves while one process does the same work over and over.

    python -m experiments.machine_modes [--seconds 180] [--output results/machine_modes.json]

The 1.5B of the Qwen2.5-Coder pair (fast arithmetic, K = 0) decodes one dev code prompt, 48 greedy tokens, again and
again in one process; each request's decoding speed (the tokens after the first over the time after it) is logged
with the time it ended. The same code on the same input: what moves is the machine. On the 2-core AMD EPYC
(2026-12-01) two runs of this command ~40 minutes apart read medians of 40.5 tok/s (150 s, 10th-90th percentile
38.1-42.2; its file replaced by the next) and 60.8 (240 s, 58.0-62.6: results/machine_modes.json), and a scratch run
of the same loop moved between ~40 and ~60 four times in 180 s, staying at each for 2 to 136 s, with nothing else
running, no steal time reported in /proc/stat and the same huge pages under the weights either way. A benchmark
whose arms run one after another for longer than a few seconds can land them in different speeds, so arms must
take turns often (a prompt at a time, a short round at a time) and a ratio is best a median over many turns.
"""

from __future__ import annotations

import argparse
import statistics
import time

from specdecode import LLM, SamplingParams
from specdecode.bench.code_prompts import load_prompts
from specdecode.bench.lib import provenance, write_result

PARAMS = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=180.0)
    ap.add_argument("--output", default="results/machine_modes.json")
    a = ap.parse_args()
    llm = LLM(target="qwen2.5-coder-1.5b-instruct", arithmetic="fast", method="none")
    text = llm.apply_chat_template([{"role": "user", "content": load_prompts("code", "dev")[0].text}])
    llm.generate([text], PARAMS)  # warm
    t0, trace = time.perf_counter(), []
    while time.perf_counter() - t0 < a.seconds:
        m = llm.generate([text], PARAMS)[0].metrics
        rate = (m["num_generated"] - 1) / (m["elapsed_s"] - m["time_to_first_token_s"])
        trace.append({"t_s": round(time.perf_counter() - t0, 2), "decode_tokens_per_s": round(rate, 2)})
    rates = sorted(r["decode_tokens_per_s"] for r in trace)
    tenth, ninetieth = rates[len(rates) // 10], rates[(9 * len(rates)) // 10]
    median = statistics.median(rates)
    print(f"{len(rates)} requests: median {median:.1f} tok/s, 10th-90th percentile {tenth:.1f}-{ninetieth:.1f}")
    summary = {"requests": len(rates), "median": median, "p10": tenth, "p90": ninetieth}
    out = write_result(a.output, {**provenance(module="experiments.machine_modes"), **summary, "trace": trace})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
