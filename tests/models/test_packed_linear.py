"""Linear packing is chosen per machine: the probe times every kind, the environment can force it, and a packed
linear of each kind computes what F.linear computes at every row count."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from specdecode.models import packed_linear


@pytest.fixture
def fresh_choice():
    packed_linear.choice.cache_clear()
    yield
    packed_linear.choice.cache_clear()


@pytest.mark.parametrize(("forced", "packs"), [("plain", False), ("mkl", True), ("onednn", True)])
def test_environment_forces_the_choice(forced, packs, monkeypatch, fresh_choice):
    monkeypatch.setenv(packed_linear.ENV, forced)
    assert packed_linear.choice() == forced
    assert packed_linear.available(torch.device("cpu"), torch.float32) is packs
    assert not packed_linear.available(torch.device("cpu"), torch.bfloat16)  # packing is fp32 only


def test_probe_decides_by_its_timings(monkeypatch, fresh_choice):
    monkeypatch.delenv(packed_linear.ENV, raising=False)
    times = packed_linear.probe(num_layers=2, trials=1)
    assert set(times) == set(packed_linear._supported()) and min(times.values()) > 0
    for fastest in ("plain", "mkl", "onednn"):
        fake = {k: (1.0 if k == fastest else 2.0) for k in packed_linear.KINDS}
        monkeypatch.setattr(packed_linear, "probe", lambda fake=fake: fake)
        packed_linear.choice.cache_clear()
        assert packed_linear.choice() == fastest


@pytest.mark.parametrize("kind", [k for k in packed_linear._supported() if k != "plain"])
def test_packed_linear_equals_plain(kind):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32, bias=True), nn.Linear(32, 8, bias=False)).eval()
    xs = [torch.randn(rows, 16) for rows in (1, 3, 9, 17, 100)] + [torch.randn(2, 5, 16)]  # row counts, padded, 3-d
    with torch.inference_mode():
        want = [model(x) for x in xs]
        assert packed_linear.pack_linears(model, kind) == 2
        for x, w in zip(xs, want, strict=True):
            assert torch.allclose(model(x), w, atol=1e-5)


def shapes_reaching_onednn(rows: range) -> set[int]:
    """The row counts oneDNN itself is called with (each new one compiles and caches a primitive)."""
    seen: set[int] = set()
    lin = packed_linear.OneDNNLinear(nn.Linear(8, 4))

    class Recorder(nn.Module):
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.wrapped = inner

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seen.add(x.shape[0])
            return self.wrapped(x)

    lin.inner = Recorder(lin.inner)
    with torch.inference_mode():
        for n in rows:
            out = lin(torch.randn(n, 8))
            assert out.shape == (n, 4)
    return seen


def test_onednn_sees_a_bounded_set_of_row_counts():
    """Every prompt length and batch x K is a new input shape; padded to row buckets, 500 of them reach oneDNN
    as 56 shapes (a server's primitive caches plateau instead of growing with each new shape)."""
    assert len(shapes_reaching_onednn(range(1, 501))) <= 60


def test_control_unpadded_rows_reach_onednn_one_shape_each(monkeypatch):
    monkeypatch.setattr(packed_linear, "row_bucket", lambda rows: rows)
    with pytest.raises(AssertionError):
        test_onednn_sees_a_bounded_set_of_row_counts()


def test_row_buckets_pad_little():
    for rows in range(1, 5000):
        padded = packed_linear.row_bucket(rows)
        assert rows <= padded <= max(rows * 1.125, packed_linear.EXACT_ROWS)
