"""The transformers rows of `bench specbench` load a GGUF-backed model as a transformers user with that file
would: through transformers' own GGUF loader (`gguf_file=`), fp32; a Hugging Face directory from itself."""

from __future__ import annotations

import torch
import transformers

from specdecode.bench.specbench import hf_model
from specdecode.models.loader import BUILTIN_MODELS

SMOLLM2 = "smollm2-135m-instruct"


def test_gguf_backed_models_go_through_transformers_gguf_loader(monkeypatch, tiny_target):
    calls = []

    def from_pretrained(path, **kwargs):
        calls.append((str(path), kwargs))
        return "model"

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", from_pretrained)
    gguf = BUILTIN_MODELS[SMOLLM2].gguf_path(SMOLLM2)
    for spec in (SMOLLM2, str(gguf)):  # a built-in name and a .gguf path
        assert hf_model(spec, torch.float32) == "model"
        assert calls.pop() == (str(gguf.parent), {"gguf_file": gguf.name, "dtype": torch.float32})
    # Control: a Hugging Face directory is loaded from itself, with no gguf_file.
    hf_model(str(tiny_target), torch.float32)
    assert calls.pop() == (str(tiny_target), {"dtype": torch.float32})
