"""The few-rows GEMM (models/few_rows.py): it computes what F.linear computes at every row count, a row's result
does not depend on the rows beside it, it is installed only where it can run, and a machine that cannot build
it keeps the step it had."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from specdecode.models import few_rows


@pytest.fixture
def kernel() -> None:
    """Skip only without AVX-512 or a C++ compiler; where the kernel should build, a build error (a C++ error
    in kernels/*.cpp) fails the test rather than skipping it, as `available` would fall back."""
    if not few_rows.supported():
        pytest.skip("no AVX-512 or no C++ compiler here")
    few_rows.require()


needs_kernel = pytest.mark.usefixtures("kernel")

ROWS = (1, 2, 3, 7, 8, 9, 12, 13, 17, 24, 25, 40)  # 3 panels up to 7 rows, then 2; blocks of 12 rows


def _max_rel_error(pack) -> float:
    """Worst |kernel - F.linear| / max |F.linear| over row counts and shapes, packing weights with `pack`."""
    gen = torch.Generator().manual_seed(0)
    worst = 0.0
    for k, n in ((64, 96), (576, 960)):
        w = torch.randn(n, k, generator=gen)
        packed = pack(w)
        for m in ROWS:
            x = torch.randn(m, k, generator=gen)
            want = torch.nn.functional.linear(x, w)
            got = few_rows.few_rows_linear(x, packed)
            worst = max(worst, ((got - want).abs().max() / want.abs().max()).item())
    return worst


@needs_kernel
def test_kernel_equals_f_linear_at_every_row_count():
    assert _max_rel_error(few_rows.pack) < 1e-5  # fp32 rounding over K = 576 terms


@needs_kernel
def test_control_a_mispacked_weight_is_caught():
    """Negative control: panels laid out n-major instead of k-major fail the same check by far."""
    assert _max_rel_error(lambda w: w.reshape(w.shape[0] // 16, w.shape[1], 16).contiguous()) > 0.1


@needs_kernel
def test_a_row_does_not_depend_on_its_batch():
    gen = torch.Generator().manual_seed(1)
    w, x = torch.randn(960, 576, generator=gen), torch.randn(24, 576, generator=gen)
    packed = few_rows.pack(w)
    together = few_rows.few_rows_linear(x, packed)  # [24, 960]
    alone = torch.cat([few_rows.few_rows_linear(x[i : i + 1], packed) for i in range(len(x))])
    assert torch.equal(together, alone)
    x3 = x[:12].reshape(3, 4, 576)  # any leading shape
    assert torch.equal(few_rows.few_rows_linear(x3, packed), together[:12].reshape(3, 4, 960))


@needs_kernel
def test_install_takes_the_widths_it_can_and_keeps_the_layers():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32, bias=True), nn.Linear(32, 8, bias=False)).eval()
    x = torch.randn(5, 16)
    with torch.inference_mode():
        want = model(x)
        assert few_rows.install(model) == 1  # 8 output columns is not a whole panel: left as is
        assert isinstance(model[0], few_rows.FewRowsLinear) and isinstance(model[1], nn.Linear)
        assert model[0].weight is not None and torch.allclose(model(x), want, atol=1e-5)  # bias kept


@pytest.fixture
def fresh_kernel(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path))
    for cached in (few_rows.library, few_rows._build_error, few_rows._usable):
        cached.cache_clear()
    yield
    for cached in (few_rows.library, few_rows._build_error, few_rows._usable):
        cached.cache_clear()


def test_not_installed_where_it_cannot_run(fresh_kernel, monkeypatch):
    assert not few_rows.available(torch.device("cpu"), torch.bfloat16)
    assert not few_rows.available(torch.device("meta"), torch.float32)
    monkeypatch.setenv(few_rows.ENV, "0")
    assert not few_rows.available(torch.device("cpu"), torch.float32)
    monkeypatch.delenv(few_rows.ENV)
    few_rows._usable.cache_clear()
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert not few_rows.available(torch.device("cpu"), torch.float32)
    assert not few_rows.supported()  # the one case where the kernel tests skip


def test_a_failed_build_warns_and_keeps_the_step(fresh_kernel, monkeypatch, tmp_path):
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    monkeypatch.setenv("CXX", "false")  # a compiler that always fails
    with pytest.warns(UserWarning, match="few-rows GEMM unavailable.*failed"):
        assert not few_rows.available(torch.device("cpu"), torch.float32)
    assert not list((tmp_path / "kernels").glob("few_rows-*"))  # no half-built library left behind
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not few_rows.available(torch.device("cpu"), torch.float32)  # decided once per process
    assert few_rows.supported()  # a compiler that fails is no reason to skip: the tests see its error
    with pytest.raises(few_rows.KernelBuildError, match="false failed to build"):
        few_rows.require()
