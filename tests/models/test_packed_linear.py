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


def recording_onednn_linear(seen: set[int]) -> packed_linear.OneDNNLinear:
    """A OneDNNLinear [8 -> 4] that adds to `seen` each row count it calls oneDNN itself with."""
    lin = packed_linear.OneDNNLinear(nn.Linear(8, 4))

    class Recorder(nn.Module):
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.wrapped = inner

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seen.add(x.shape[0])
            return self.wrapped(x)

    lin.inner = Recorder(lin.inner)
    return lin


def shapes_reaching_onednn(rows: range) -> set[int]:
    """The row counts oneDNN itself is called with (each new one compiles and caches a primitive)."""
    seen: set[int] = set()
    lin = recording_onednn_linear(seen)
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


def shapes_new_after_warm_up(warm_rows: int, served_rows: int) -> set[int]:
    """Row counts reaching oneDNN for the first time while serving 1..served_rows rows after a warm-up."""
    warmed: set[int] = set()
    lin = recording_onednn_linear(warmed)
    packed_linear.warm_row_buckets(nn.Sequential(lin), warm_rows)
    return shapes_reaching_onednn(range(1, served_rows + 1)) - warmed


def test_warm_up_meets_every_shape_a_server_will_send():
    """`specdecode serve` warms each oneDNN linear at every row bucket up to a step's largest row count, so a
    server compiles no primitive (and its memory grows by none) after it starts serving."""
    assert shapes_new_after_warm_up(warm_rows=600, served_rows=600) == set()


def test_control_a_shorter_warm_up_leaves_shapes_to_compile_while_serving():
    assert len(shapes_new_after_warm_up(warm_rows=300, served_rows=600)) >= 8
