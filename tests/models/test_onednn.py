"""oneDNN packing is chosen per machine: the probe times both ways, the environment can force it, and a packed
linear computes what F.linear computes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from specdecode.models import onednn


@pytest.fixture
def fresh_choice():
    onednn.packing_pays.cache_clear()
    yield
    onednn.packing_pays.cache_clear()


@pytest.mark.parametrize(("forced", "want"), [("0", False), ("1", True)])
def test_environment_forces_the_choice(forced, want, monkeypatch, fresh_choice):
    if not torch.backends.mkldnn.is_available():
        pytest.skip("this torch has no oneDNN")
    monkeypatch.setenv("SPECDECODE_ONEDNN", forced)
    assert onednn.available(torch.device("cpu"), torch.float32) is want
    assert not onednn.available(torch.device("cpu"), torch.bfloat16)  # packing is fp32 only


def test_probe_decides_by_its_timings(monkeypatch, fresh_choice):
    monkeypatch.delenv("SPECDECODE_ONEDNN", raising=False)
    plain, packed = onednn.probe(num_layers=2, trials=1)
    assert plain > 0 and packed > 0
    monkeypatch.setattr(onednn, "probe", lambda: (1.0, 2.0))  # packed slower: do not pack
    assert onednn.packing_pays() is False
    onednn.packing_pays.cache_clear()
    monkeypatch.setattr(onednn, "probe", lambda: (2.0, 1.0))
    assert onednn.packing_pays() is True


def test_packed_linear_equals_plain():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32, bias=False), nn.Linear(32, 8, bias=False)).eval()
    x = torch.randn(3, 16)
    with torch.inference_mode():
        want = model(x)
        assert onednn.pack_linears(model) == 2
        assert torch.allclose(model(x), want, atol=1e-5)
