"""MKL packing is chosen per machine: the probe times both ways, the environment can force it, and a packed
linear computes what F.linear computes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from specdecode.models import packed_linear


@pytest.fixture
def fresh_choice():
    packed_linear.packing_pays.cache_clear()
    yield
    packed_linear.packing_pays.cache_clear()


@pytest.mark.parametrize(("forced", "want"), [("0", False), ("1", True)])
def test_environment_forces_the_choice(forced, want, monkeypatch, fresh_choice):
    if not torch.backends.mkl.is_available():
        pytest.skip("this torch has no MKL")
    monkeypatch.setenv(packed_linear.ENV, forced)
    assert packed_linear.available(torch.device("cpu"), torch.float32) is want
    assert not packed_linear.available(torch.device("cpu"), torch.bfloat16)  # packing is fp32 only


def test_probe_decides_by_its_timings(monkeypatch, fresh_choice):
    monkeypatch.delenv(packed_linear.ENV, raising=False)
    plain, packed = packed_linear.probe(num_layers=2, trials=1)
    assert plain > 0 and packed > 0
    monkeypatch.setattr(packed_linear, "probe", lambda: (1.0, 2.0))  # packed slower: do not pack
    assert packed_linear.packing_pays() is False
    packed_linear.packing_pays.cache_clear()
    monkeypatch.setattr(packed_linear, "probe", lambda: (2.0, 1.0))
    assert packed_linear.packing_pays() is True


def test_packed_linear_equals_plain():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32, bias=False), nn.Linear(32, 8, bias=False)).eval()
    xs = [torch.randn(rows, 16) for rows in (1, 3, 9, 17)] + [torch.randn(2, 5, 16)]  # every row count, and 3-d
    with torch.inference_mode():
        want = [model(x) for x in xs]
        assert packed_linear.pack_linears(model) == 2
        for x, w in zip(xs, want, strict=True):
            assert torch.allclose(model(x), w, atol=1e-5)
