"""The results' machine line names what the loaded target's linears run, read from its modules: GGUF blocks kept
quantized (their types and arithmetic) or fp32 linears by kernel, never the fp32 packing a quantized target does
not use."""

from __future__ import annotations

import re

import torch

from specdecode.bench.lib import machine, provenance
from specdecode.llm import LLM
from specdecode.models.gguf_quantized import load_gguf_quantized
from specdecode.models.quant_int8 import use_int8
from tests.models.test_gguf_quantized import write_tiny_gguf

# The tiny GGUF (tests/models/test_gguf_quantized.py): per layer q, k, v, o, gate, up in quantized blocks, with
# q/k/v and gate/up fused where their types differ (ConcatLinear parts); ffn_down in F16 and Q5_1, which the
# kernels do not take: dequantized, plain fp32 linears.
QUANTIZED = "(Q4_0, Q4_1, Q4_K, Q5_0, Q6_K, Q8_0)"


def test_a_quantized_target_names_its_blocks_and_arithmetic(tmp_path):
    model = load_gguf_quantized(write_tiny_gguf(tmp_path / "tiny.gguf", tie=True))
    line = machine(model)
    assert re.search(rf"linears: \d+ in quantized GGUF blocks {re.escape(QUANTIZED)}, exact arithmetic", line)
    assert line.endswith("; 2 plain F.linear fp32")  # the two layers' ffn_down
    assert "packed" not in line
    use_int8(model)
    assert re.search(rf"\d+ in quantized GGUF blocks {re.escape(QUANTIZED)}, fast arithmetic \(int8\)", machine(model))
    assert "exact" not in machine(model) and "KV cache" not in machine(model)
    model.kv_dtype = torch.bfloat16  # what kv_cache_dtype="auto" gives the fast arithmetic (models/kv_dtype.py)
    assert machine(model).endswith("; KV cache bfloat16")


def test_an_fp32_target_names_its_kernel(tiny_target):
    llm = LLM(str(tiny_target), method="none", max_num_seqs=1, max_model_len=32, enforce_eager=True)
    line = provenance(model=llm.target)["machine"]
    assert re.search(r"linears: \d+ (plain F.linear|MKL-packed|oneDNN-packed|few-rows GEMM) fp32", line)
    assert "quantized" not in line


def test_without_a_model_the_line_makes_no_claim_about_linears():
    assert "linears" not in provenance()["machine"]
