// specdecode::ordered_attend(q [n, T, H, D], cache_k [layers, slots, G, len + 1, D], cache_v, layer, slots [n],
// write_pos [n, T], mask [n, 1, T, kv_len]) -> [n, T, H * D]: attention of every query over its row's cached keys
// (written before the call), for CPUs where the AVX-512 few-queries kernel does not serve. Portable C++, no
// intrinsics.
//
// Why. ATen's SDPA reduces over keys in blocks whose cut moves with the number of queries T, the padded key length
// and the batch, so a query's result in a 5-token verify differed in its last bits from the same query in a
// one-token step; under the fast arithmetic's int8 activations such differences flip greedy tokens, and
// speculation was no longer exact with respect to plain decoding. Here one query's result is a function of its
// own query vector, its mask row and the keys and values it may see, in key order, nothing else:
//
//   for query head h (key head g = h / (H / G)) of token t in row b, over keys j = 0, 1, ... < kv_len with
//   mask[b, 0, t, j] > -inf, in increasing j:
//     s_j = dot(q, k_j) * (1 / sqrt(D)) + mask_j, dot = 8 lane sums (lane l: d = l, l + 8, ... in order, each
//           a product then a sum, both rounded: no fma) added by the tree l += l + 4, l += l + 2, l + (l + 1)
//     M = max_j s_j;  p_j = expf(s_j - M);  l = sum_j p_j and acc[d] = sum_j p_j * v_j[d], in increasing j
//     out = acc[d] / l   (no visible key, or a padded token, write_pos < 0: zeros)
//
// A masked key is skipped, not added as 0, so a tree node's result is the one a plain step computes over the same
// keys laid out contiguously. Work: threads split (row, key head); a key head's keys and values are read once per
// token for the query heads that share them.
#include <ATen/core/Tensor.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

// GCC on x86-64 compiles the hot loop twice (target_clones, chosen when the library loads); elsewhere once.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define ORDERED_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define ORDERED_CLONES
#endif

namespace {

constexpr int kLanes = 8;

__attribute__((always_inline)) inline float dot(const float* a, const float* b, int64_t D) {
    float lane[kLanes] = {};
    for (int64_t d0 = 0; d0 < D; d0 += kLanes)
        for (int l = 0; l < kLanes; ++l) lane[l] = lane[l] + a[d0 + l] * b[d0 + l];
    for (int width = kLanes / 2; width >= 1; width /= 2)
        for (int l = 0; l < width; ++l) lane[l] = lane[l] + lane[l + width];
    return lane[0];
}

struct Args {
    const float *q, *k, *v, *mask;  // k, v: this layer's cache, [slots, G, len + 1, D]
    const int64_t *slots, *write_pos;
    float* out;
    int64_t T, H, G, D, kv_len, slot_stride, head_stride;
};

// The query heads of one token that share key head g (`group` of them: q[h] [D], out[h] [D]) against its keys and
// values from key 0, mask row m [kv_len]: each key and value row is read once for all of them, and each query's
// operations are the header's, in its order (its scores, then its max, then its sums in increasing j).
// Compiled for AVX2 and for baseline x86-64 (ORDERED_CLONES): the same operations in the same order (products and
// sums rounded one by one, no fma), so the same bits, 8 lanes a vector or 4. A layer of the 1.5B's shape took
// 0.61-0.65x SDPA's time at one token, 1.04-1.14x at five (experiments/avx2_paths.py, 2-core Zen 4, 2026-12-07).
ORDERED_CLONES void token_heads(const Args& a, const float* const* q, const float* k, const float* v, const float* m,
                                int64_t group, int64_t end, float* scores, float* top, float* total,
                                float* const* out) {
    const float scale = 1.0f / std::sqrt(static_cast<float>(a.D));
    const float none = -std::numeric_limits<float>::infinity();
    for (int64_t h = 0; h < group; ++h) top[h] = none, total[h] = 0.0f;
    for (int64_t j = 0; j < end; ++j) {
        if (m[j] == none) continue;  // its score would be -inf: no change to any max
        const float* kj = k + j * a.D;
        for (int64_t h = 0; h < group; ++h) {
            const float s = dot(q[h], kj, a.D) * scale + m[j];
            scores[h * end + j] = s;
            top[h] = std::max(top[h], s);
        }
    }
    for (int64_t j = 0; j < end; ++j) {
        if (m[j] == none) continue;
        const float* vj = v + j * a.D;
        for (int64_t h = 0; h < group; ++h) {
            const float p = std::exp(scores[h * end + j] - top[h]);
            total[h] = total[h] + p;
            float* o = out[h];
            for (int64_t d = 0; d < a.D; ++d) o[d] = o[d] + p * vj[d];
        }
    }
    for (int64_t h = 0; h < group; ++h)
        if (top[h] != none)  // else no visible key: zeros (out is zeroed)
            for (int64_t d = 0; d < a.D; ++d) out[h][d] = out[h][d] / total[h];
}

void row_head(const Args& a, int64_t b, int64_t g) {
    const int64_t group = a.H / a.G;
    int64_t end = 0;  // keys past the row's last written position are never visible to it
    for (int64_t t = 0; t < a.T; ++t) end = std::max(end, a.write_pos[b * a.T + t] + 1);
    end = std::min(end, a.kv_len);
    thread_local std::vector<float> scores, sums;
    thread_local std::vector<const float*> qs;
    thread_local std::vector<float*> outs;
    if (scores.size() < static_cast<size_t>(group * end)) scores.resize(group * end);
    sums.resize(2 * group), qs.resize(group), outs.resize(group);
    const float* k = a.k + a.slots[b] * a.slot_stride + g * a.head_stride;
    const float* v = a.v + a.slots[b] * a.slot_stride + g * a.head_stride;
    for (int64_t t = 0; t < a.T; ++t) {
        if (a.write_pos[b * a.T + t] < 0) continue;  // padding: zeros
        for (int64_t i = 0; i < group; ++i) {
            const int64_t at = ((b * a.T + t) * a.H + g * group + i) * a.D;
            qs[i] = a.q + at, outs[i] = a.out + at;
        }
        const float* m = a.mask + (b * a.T + t) * a.kv_len;
        token_heads(a, qs.data(), k, v, m, group, end, scores.data(), sums.data(), sums.data() + group, outs.data());
    }
}

at::Tensor ordered_attend(const at::Tensor& q, const at::Tensor& cache_k, const at::Tensor& cache_v, int64_t layer,
                          const at::Tensor& slots, const at::Tensor& write_pos, const at::Tensor& mask) {
    TORCH_CHECK(q.dim() == 4 && cache_k.dim() == 5 && mask.dim() == 4, "ordered_attend: q [n, T, H, D], caches "
                "[layers, slots, G, len + 1, D] and mask [n, 1, T, kv_len]");
    TORCH_CHECK(q.scalar_type() == at::kFloat && cache_k.scalar_type() == at::kFloat &&
                    cache_v.scalar_type() == at::kFloat && mask.scalar_type() == at::kFloat,
                "ordered_attend: fp32 queries, caches and mask");
    TORCH_CHECK(cache_k.is_contiguous() && cache_v.is_contiguous() && cache_k.sizes() == cache_v.sizes(),
                "ordered_attend: contiguous caches of one shape");
    const int64_t n = q.size(0), T = q.size(1), H = q.size(2), D = q.size(3), G = cache_k.size(2);
    TORCH_CHECK(D % kLanes == 0 && cache_k.size(4) == D && G > 0 && H % G == 0, "ordered_attend: head size ", D,
                " (a multiple of 8, the caches') and ", H, " query heads over ", G, " key heads");
    TORCH_CHECK(slots.numel() == n && write_pos.size(0) == n && write_pos.size(1) == T && mask.size(0) == n &&
                    mask.size(2) == T && mask.size(3) <= cache_k.size(3),
                "ordered_attend: slots [n], write_pos [n, T] and mask [n, 1, T, <= len + 1]");
    TORCH_CHECK(layer >= 0 && layer < cache_k.size(0), "ordered_attend: layer ", layer, " out of range");
    const at::Tensor qc = q.contiguous(), mc = mask.contiguous();
    const at::Tensor sc = slots.to(at::kLong).contiguous(), wc = write_pos.to(at::kLong).contiguous();
    at::Tensor out = at::zeros({n, T, H * D}, q.options());
    const int64_t slot_stride = cache_k.stride(1), head_stride = cache_k.stride(2);
    const int64_t* s = sc.data_ptr<int64_t>();
    for (int64_t b = 0; b < n; ++b) TORCH_CHECK(s[b] >= 0 && s[b] < cache_k.size(1), "ordered_attend: slot ", s[b]);
    const Args a{qc.data_ptr<float>(),
                 cache_k.data_ptr<float>() + layer * cache_k.stride(0),
                 cache_v.data_ptr<float>() + layer * cache_v.stride(0),
                 mc.data_ptr<float>(),
                 s,
                 wc.data_ptr<int64_t>(),
                 out.data_ptr<float>(),
                 T, H, G, D, mask.size(3), slot_stride, head_stride};
#pragma omp parallel for collapse(2) schedule(dynamic)
    for (int64_t b = 0; b < n; ++b)
        for (int64_t g = 0; g < G; ++g) row_head(a, b, g);
    return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(specdecode, m) {
    m.def("ordered_attend(Tensor q, Tensor cache_k, Tensor cache_v, int layer, Tensor slots, Tensor write_pos, "
          "Tensor mask) -> Tensor");
}

TORCH_LIBRARY_IMPL(specdecode, CPU, m) { m.impl("ordered_attend", &ordered_attend); }
