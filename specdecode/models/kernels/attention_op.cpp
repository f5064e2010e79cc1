// specdecode::few_queries_attend: one layer's attention for a decode or verify step on the CPU, as a torch op
// (models/attention.py calls it in place of writing the cache and calling SDPA from Python; models/few_rows.py
// builds it into the same library). It writes the new K/V into the cache, then attends each row over its own
// slot's keys up to its last new token, reading nothing past it and copying nothing.
#include <ATen/autocast_mode.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

extern "C" bool few_queries_attention(const float* q, const float* k, const float* v, const float* mask, float* out,
                                      const int64_t* sizes, const int64_t* q_strides, const int64_t* kv_strides,
                                      const int64_t* mask_strides, const int64_t* start, const int64_t* len,
                                      const int64_t* real, float scale);
extern "C" bool few_queries_attention_bf16(const float* q, const uint16_t* k, const uint16_t* v, const float* mask,
                                           float* out, const int64_t* sizes, const int64_t* q_strides,
                                           const int64_t* kv_strides, const int64_t* mask_strides,
                                           const int64_t* start, const int64_t* len, const int64_t* real, float scale,
                                           bool hw);
extern "C" bool few_queries_bf16_dot();
extern "C" void few_queries_to_bf16(const float* src, uint16_t* dst, int64_t count);

namespace {

// Whether `specdecode::attend` on the CPU may take the few-queries kernel ($SPECDECODE_FEW_QUERIES_ATTENTION;
// models/few_rows.py sets it once the library is loaded, and tests turn it off to compare with SDPA).
std::atomic<bool> g_attend_kernel{false};
// Whether a bf16 cache's dot products take `vdpbf16ps` (where the CPU has it; tests turn it off to check the
// widening path, kernels/few_queries_attention_bf16.cpp).
std::atomic<bool> g_bf16_dot{few_queries_bf16_dot()};
// models/attention.py's KERNEL_MAX_QUERIES: a longer chunk goes to the Python path, which sends it back in such pieces
constexpr int64_t kMaxQueries = 32;

bool is_bf16(const at::Tensor& t) { return t.scalar_type() == at::kBFloat16; }

void check_cache(const at::Tensor& t, const char* name) {
    TORCH_CHECK(t.dim() == 5 && (t.scalar_type() == at::kFloat || is_bf16(t)) && t.device().is_cpu(), name,
                " must be 5-d fp32 or bf16 on the CPU");
    TORCH_CHECK(t.stride(4) == 1, name, "'s last dimension must be contiguous");
}

void check_float(const at::Tensor& t, int64_t dim, const char* name) {
    TORCH_CHECK(t.dim() == dim && t.scalar_type() == at::kFloat && t.device().is_cpu(), name, " must be ", dim,
                "-d fp32 on the CPU");
    TORCH_CHECK(t.stride(dim - 1) == 1, name, "'s last dimension must be contiguous");
}

// Write new[b, t] (each [G, D]) into cache[layer, slots[b], :, pos] with pos = write_pos[b, t] (-1: the last
// column, the scratch a padding token writes to).
void write_new(const at::Tensor& fresh, const at::Tensor& cache, int64_t layer, const int64_t* slots,
               const int64_t* write_pos) {
    const int64_t n = fresh.size(0), T = fresh.size(1), G = fresh.size(2), D = fresh.size(3), cols = cache.size(3);
    const float* src = fresh.data_ptr<float>();
    const bool bf16 = is_bf16(cache);  // a bf16 cache: each value rounded to nearest even, as torch's .to() does
    char* dst = static_cast<char*>(cache.data_ptr());
    const int64_t size = cache.element_size();
    for (int64_t b = 0; b < n; ++b)
        for (int64_t t = 0; t < T; ++t) {
            const int64_t pos = write_pos[b * T + t] < 0 ? cols + write_pos[b * T + t] : write_pos[b * T + t];
            TORCH_CHECK(pos >= 0 && pos < cols, "write position ", write_pos[b * T + t], " is outside the cache");
            for (int64_t g = 0; g < G; ++g) {
                char* to = dst + size * (layer * cache.stride(0) + slots[b] * cache.stride(1) + g * cache.stride(2) +
                                         pos * cache.stride(3));
                const float* from = src + b * fresh.stride(0) + t * fresh.stride(1) + g * fresh.stride(2);
                if (bf16)
                    few_queries_to_bf16(from, reinterpret_cast<uint16_t*>(to), D);
                else
                    std::memcpy(to, from, D * sizeof(float));
            }
        }
}

at::Tensor few_queries_attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& cache_k,
                              at::Tensor& cache_v, int64_t layer, const at::Tensor& slots, const at::Tensor& write_pos,
                              const at::Tensor& mask) {
    check_float(q, 4, "q");  // [n, T, H, D]
    check_float(k, 4, "k");  // [n, T, G, D]
    check_float(v, 4, "v");
    check_cache(cache_k, "cache_k");  // [layers, slots, G, len + 1, D]
    check_cache(cache_v, "cache_v");
    check_float(mask, 4, "mask");  // [n, 1, T, kv_len]
    const int64_t n = q.size(0), T = q.size(1), H = q.size(2), D = q.size(3), G = k.size(2);
    TORCH_CHECK(k.sizes() == v.sizes() && k.size(0) == n && k.size(1) == T && k.size(3) == D, "k/v do not match q");
    TORCH_CHECK(H % G == 0, "query heads ", H, " are not a multiple of key heads ", G);
    TORCH_CHECK(cache_k.sizes() == cache_v.sizes() && cache_k.strides() == cache_v.strides() &&
                    cache_k.scalar_type() == cache_v.scalar_type() &&
                    cache_k.size(2) == G && cache_k.size(4) == D && cache_k.stride(3) == D,
                "the caches must be [layers, slots, ", G, ", len + 1, ", D, "] with each position's values together");
    TORCH_CHECK(mask.size(0) == n && mask.size(1) == 1 && mask.size(2) == T, "mask must be [n, 1, T, kv_len]");
    TORCH_CHECK(slots.scalar_type() == at::kLong && write_pos.scalar_type() == at::kLong, "slots/write_pos are int64");
    const at::Tensor slot = slots.contiguous(), pos = write_pos.contiguous();  // [n], [n, T]
    TORCH_CHECK(slot.numel() == n && pos.numel() == n * T, "slots must be [n] and write_pos [n, T]");
    const int64_t* slot_of = slot.data_ptr<int64_t>();
    const int64_t* pos_of = pos.data_ptr<int64_t>();
    // Every index is checked before anything is written: a bad slot or layer must not write outside the cache.
    TORCH_CHECK(layer >= 0 && layer < cache_k.size(0), "layer ", layer, " is outside the cache");
    for (int64_t b = 0; b < n; ++b)
        TORCH_CHECK(slot_of[b] >= 0 && slot_of[b] < cache_k.size(1), "slot ", slot_of[b], " is outside the cache");
    write_new(k, cache_k, layer, slot_of, pos_of);
    write_new(v, cache_v, layer, slot_of, pos_of);
    // Each row's slot, its attended length (its last real write + 1) and its real queries (up to its last token
    // written to the cache; padding, written to the scratch column, comes after them and is not computed).
    std::vector<int64_t> start(n), len(n), real(n);
    for (int64_t b = 0; b < n; ++b) {
        start[b] = layer * cache_k.stride(0) + slot_of[b] * cache_k.stride(1);
        len[b] = *std::max_element(pos_of + b * T, pos_of + (b + 1) * T) + 1;
        real[b] = T;
        while (real[b] > 0 && pos_of[b * T + real[b] - 1] < 0) --real[b];
        TORCH_CHECK(len[b] <= mask.size(3), "row ", b, " attends ", len[b], " keys, its mask covers ", mask.size(3));
    }
    at::Tensor out = at::empty({n, T, H, D}, q.options());
    const int64_t sizes[] = {n, H, G, T, D};
    const int64_t q_strides[] = {q.stride(0), q.stride(2), q.stride(1)};  // row, head, token
    const int64_t kv_strides[] = {cache_k.stride(2), cache_k.stride(3)};  // head, key
    const int64_t mask_strides[] = {mask.stride(0), mask.stride(2)};      // row, token
    const float scale = 1.f / std::sqrt(static_cast<float>(D));
    if (n > 0 && T > 0 && is_bf16(cache_k)) {
        const auto* k16 = reinterpret_cast<const uint16_t*>(cache_k.data_ptr());
        const auto* v16 = reinterpret_cast<const uint16_t*>(cache_v.data_ptr());
        const bool done = few_queries_attention_bf16(
            q.data_ptr<float>(), k16, v16, mask.data_ptr<float>(), out.data_ptr<float>(), sizes, q_strides,
            kv_strides, mask_strides, start.data(), len.data(), real.data(), scale,
            g_bf16_dot.load(std::memory_order_relaxed));
        TORCH_CHECK(done, "few_queries_attend has no bf16 kernel for head size ", D);
    } else if (n > 0 && T > 0) {
        const bool done = few_queries_attention(
            q.data_ptr<float>(), cache_k.data_ptr<float>(), cache_v.data_ptr<float>(), mask.data_ptr<float>(),
            out.data_ptr<float>(), sizes, q_strides, kv_strides, mask_strides, start.data(), len.data(), real.data(),
            scale);
        TORCH_CHECK(done, "few_queries_attend has no kernel for head size ", D);
    }
    return out.view({n, T, H * D});
}

bool last_dim_dense(const at::Tensor& t) { return t.dim() > 0 && t.stride(t.dim() - 1) == 1; }

// What models/attention.py's _kernel_serves asks, here so that a compiled step's attention never enters Python:
// a decode or verify step (at most kMaxQueries new tokens a row) in fp32, outside autograd and autocast, over an
// fp32 cache or a bf16 one (head sizes 32, 64 and 128).
bool kernel_serves(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cache_k,
                   const at::Tensor& mask) {
    const int64_t d = q.dim() == 4 ? q.size(3) : 0;
    return g_attend_kernel.load(std::memory_order_relaxed) && q.dim() == 4 && q.size(1) <= kMaxQueries &&
           (d == 16 || d == 32 || d == 64 || d == 128) && q.scalar_type() == at::kFloat &&
           k.scalar_type() == at::kFloat && v.scalar_type() == at::kFloat &&
           (cache_k.scalar_type() == at::kFloat || (is_bf16(cache_k) && d >= 32)) &&
           mask.scalar_type() == at::kFloat && !(q.requires_grad() || k.requires_grad() || v.requires_grad()) &&
           !at::autocast::is_autocast_enabled(at::kCPU) && last_dim_dense(q) && last_dim_dense(k) &&
           last_dim_dense(v) && last_dim_dense(mask);
}

// `specdecode::attend` for CPU tensors: the few-queries op where it serves, else `specdecode::attend_general`
// (models/attention.py: the cache writes and SDPA, in Python). A compiled step calls this through AOTInductor's
// proxy executor, so a decode step's 24-28 layers no longer each cross into Python (~7 us a layer).
at::Tensor attend_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& cache_k,
                      at::Tensor& cache_v, int64_t layer, const at::Tensor& slots, const at::Tensor& write_pos,
                      const at::Tensor& mask) {
    if (kernel_serves(q, k, v, cache_k, mask))
        return few_queries_attend(q, k, v, cache_k, cache_v, layer, slots, write_pos, mask);
    static const auto general =
        c10::Dispatcher::singleton()
            .findSchemaOrThrow("specdecode::attend_general", "")
            .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, at::Tensor&, at::Tensor&,
                              int64_t, const at::Tensor&, const at::Tensor&, const at::Tensor&)>();
    return general.call(q, k, v, cache_k, cache_v, layer, slots, write_pos, mask);
}

}  // namespace

void set_attend_kernel(bool on) { g_attend_kernel.store(on); }

// Let a bf16 cache's attention take `vdpbf16ps` (only where the CPU has it) or the widening path; returns the
// setting in force.
bool set_bf16_dot(bool on) {
    g_bf16_dot.store(on && few_queries_bf16_dot());
    return g_bf16_dot.load();
}

TORCH_LIBRARY_FRAGMENT(specdecode, m) {
    m.def(
        "few_queries_attend(Tensor q, Tensor k, Tensor v, Tensor(a!) cache_k, Tensor(b!) cache_v, int layer, "
        "Tensor slots, Tensor write_pos, Tensor mask) -> Tensor");
    m.def("set_attend_kernel(bool on) -> ()", &set_attend_kernel);
    m.def("set_bf16_dot(bool on) -> bool", &set_bf16_dot);
}

TORCH_LIBRARY_IMPL(specdecode, CPU, m) {
    m.impl("few_queries_attend", &few_queries_attend);
    m.impl("attend", &attend_cpu);
}
