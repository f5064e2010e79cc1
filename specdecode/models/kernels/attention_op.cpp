// specdecode::few_queries_attention(q [n, H, T, D], keys [n, G, L, D], values [n, G, L, D], mask [n, 1, T, L])
// -> [n, H, T, D]: the few-queries attention kernel as a torch op (models/attention.py calls it; models/few_rows.py
// builds it into the same library and registers its fake for tracing).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cmath>

extern "C" bool few_queries_attention(const float* q, const float* k, const float* v, const float* mask, float* out,
                                      const int64_t* sizes, const int64_t* strides, float scale);

namespace {

void check_rows(const at::Tensor& t, const char* name) {
    TORCH_CHECK(t.dim() == 4 && t.scalar_type() == at::kFloat && t.device().is_cpu(), name, " must be 4-d fp32 on the CPU");
    TORCH_CHECK(t.stride(3) == 1, name, "'s last dimension must be contiguous");
}

at::Tensor few_queries_attention_op(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                                    const at::Tensor& mask) {
    check_rows(q, "q");
    check_rows(keys, "keys");
    check_rows(values, "values");
    check_rows(mask, "mask");
    const int64_t n = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3), G = keys.size(1), L = keys.size(2);
    TORCH_CHECK(keys.sizes() == values.sizes() && keys.size(0) == n && keys.size(3) == D, "keys/values do not match q");
    TORCH_CHECK(H % G == 0, "query heads ", H, " are not a multiple of key heads ", G);
    TORCH_CHECK(keys.stride(2) == D && values.stride(2) == D, "a key's and a value's D values must be one block");
    TORCH_CHECK(mask.size(0) == n && mask.size(1) == 1 && mask.size(2) == T && mask.size(3) == L, "mask must be [n, 1, T, L]");
    at::Tensor out = at::empty({n, T, H, D}, q.options());  // [n, T, H, D]: the attention op's own layout
    const int64_t sizes[] = {n, H, G, T, L, D};
    const int64_t strides[] = {q.stride(0),      q.stride(1),      q.stride(2),      keys.stride(0),
                               keys.stride(1),   keys.stride(2),   values.stride(0), values.stride(1),
                               values.stride(2), mask.stride(0),   mask.stride(2)};
    if (n > 0 && T > 0) {
        const bool done = few_queries_attention(q.data_ptr<float>(), keys.data_ptr<float>(), values.data_ptr<float>(),
                                                mask.data_ptr<float>(), out.data_ptr<float>(), sizes, strides,
                                                1.f / std::sqrt(static_cast<float>(D)));
        TORCH_CHECK(done, "few_queries_attention has no kernel for head size ", D);
    }
    return out.transpose(1, 2);  // [n, H, T, D]
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(specdecode, m) {
    m.def("few_queries_attention(Tensor q, Tensor keys, Tensor values, Tensor mask) -> Tensor");
}

TORCH_LIBRARY_IMPL(specdecode, CPU, m) { m.impl("few_queries_attention", &few_queries_attention_op); }
