// specdecode::few_rows_linear(x [..., K], packed [N / 16, K, 16]) -> [..., N]: the few-rows GEMM as a torch op,
// so the compiled step calls it without Python (models/few_rows.py registers its fake for tracing).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

extern "C" void few_rows_gemm(const float* x, const float* packed, float* out, int64_t M, int64_t K, int64_t N);

namespace {

at::Tensor few_rows_linear(const at::Tensor& x, const at::Tensor& packed) {
    TORCH_CHECK(x.scalar_type() == at::kFloat && packed.scalar_type() == at::kFloat, "few_rows_linear is fp32");
    TORCH_CHECK(x.device().is_cpu() && packed.device().is_cpu(), "few_rows_linear runs on the CPU");
    TORCH_CHECK(packed.dim() == 3 && packed.size(2) == 16 && packed.is_contiguous(), "packed must be [N/16, K, 16]");
    const int64_t k = packed.size(1), n = packed.size(0) * 16;
    TORCH_CHECK(x.size(-1) == k, "x has ", x.size(-1), " features, the weight ", k);
    const at::Tensor rows = x.reshape({-1, k}).contiguous();  // [M, K]
    at::Tensor out = at::empty({rows.size(0), n}, x.options());  // [M, N]
    if (rows.size(0) > 0) {
        few_rows_gemm(rows.data_ptr<float>(), packed.data_ptr<float>(), out.data_ptr<float>(), rows.size(0), k, n);
    }
    std::vector<int64_t> sizes = x.sizes().vec();
    sizes.back() = n;
    return out.view(sizes);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(specdecode, m) { m.def("few_rows_linear(Tensor x, Tensor packed) -> Tensor"); }

TORCH_LIBRARY_IMPL(specdecode, CPU, m) { m.impl("few_rows_linear", &few_rows_linear); }
