// What the few-queries attention kernels share (kernels/few_queries_attention.cpp, fp32 keys and values;
// kernels/few_queries_attention_bf16.cpp, bf16 ones): the chunking, the exponential, the 16 x 16 transpose, the
// call's shape and the in-order merge of a query row's chunks. See the fp32 kernel's header for the algorithm.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace few_queries {

constexpr int kChunk = 64;      // keys per work item: 4 AVX-512 registers of scores per query row
constexpr int kScoreRows = 6;   // query rows per score block: 6 x 4 accumulators
constexpr float kFloor = -200.f;  // exp's input is clamped here: 2^-288 rounds to exactly 0

// e^x for 16 lanes: 2^n * p(r), x = n ln2 + r, |r| <= ln2 / 2; a degree-6 polynomial (~1 ulp); -inf gives 0.
inline __m512 exp16(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(kFloor));
    x = _mm512_min_ps(x, _mm512_set1_ps(88.7f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), 0);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
    return _mm512_scalef_ps(p, n);
}

// dst[c * dst_stride + i] = src[i * src_stride + c] for a 16 x 16 block, rows i >= rows read as zeros: four
// rounds of in-register shuffles in place of 256 scalar moves (the keys' transpose was most of a one-token
// chunk's work).
inline void transpose16(const float* src, int64_t src_stride, int rows, float* dst, int64_t dst_stride) {
    __m512 r[16], a[16];
    for (int i = 0; i < 16; ++i) r[i] = i < rows ? _mm512_loadu_ps(src + i * src_stride) : _mm512_setzero_ps();
    for (int i = 0; i < 16; i += 2) {  // per 128-bit lane l: (r_i[4l], r_i+1[4l], r_i[4l+1], r_i+1[4l+1]) and the next two
        a[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        a[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {  // r[i + c], lane l: column 4l + c of rows i..i+3
        const __m512d a0 = _mm512_castps_pd(a[i]), a1 = _mm512_castps_pd(a[i + 1]);
        const __m512d a2 = _mm512_castps_pd(a[i + 2]), a3 = _mm512_castps_pd(a[i + 3]);
        r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a0, a2));
        r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a0, a2));
        r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(a1, a3));
        r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(a1, a3));
    }
    for (int c = 0; c < 4; ++c) {  // column 4l + c gathers lane l of r[c], r[4 + c], r[8 + c], r[12 + c]
        const __m512 s0 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88), s1 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xDD);
        const __m512 s2 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88);
        const __m512 s3 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xDD);
        _mm512_store_ps(dst + c * dst_stride, _mm512_shuffle_f32x4(s0, s2, 0x88));
        _mm512_store_ps(dst + (4 + c) * dst_stride, _mm512_shuffle_f32x4(s1, s3, 0x88));
        _mm512_store_ps(dst + (8 + c) * dst_stride, _mm512_shuffle_f32x4(s0, s2, 0xDD));
        _mm512_store_ps(dst + (12 + c) * dst_stride, _mm512_shuffle_f32x4(s1, s3, 0xDD));
    }
}

// A query row's kChunk scores from its 4 registers of dot products: acc * scale + its mask row (mask_row: at the
// chunk's first key), -inf for the keys past the chunk's `width`.
inline void masked_scores(const __m512* acc, const float* mask_row, int width, float scale, float* out) {
    for (int w = 0; w < 4; ++w) {
        const int lanes = std::clamp(width - w * 16, 0, 16);  // this register's keys inside the chunk
        const __mmask16 live = static_cast<__mmask16>((1u << lanes) - 1);
        const __m512 m = _mm512_maskz_loadu_ps(live, mask_row + w * 16);
        const __m512 sc = _mm512_fmadd_ps(acc[w], _mm512_set1_ps(scale), m);
        _mm512_storeu_ps(out + w * 16, _mm512_mask_blend_ps(live, _mm512_set1_ps(-INFINITY), sc));
    }
}

// A query row's kChunk scores become exp(score - max) in place; part[D] = the max, part[D + 1] = their sum. A row
// that sees no key of the chunk gets zeros, max -inf and sum 0.
inline void exponentiate(float* scores, float* part, int64_t D) {
    __m512 mx = _mm512_loadu_ps(scores);
    for (int w = 1; w < 4; ++w) mx = _mm512_max_ps(mx, _mm512_loadu_ps(scores + w * 16));
    const float m = _mm512_reduce_max_ps(mx);
    part[D] = m;
    if (m == -INFINITY) {
        for (int w = 0; w < 4; ++w) _mm512_storeu_ps(scores + w * 16, _mm512_setzero_ps());
        part[D + 1] = 0.f;
        return;
    }
    __m512 sum = _mm512_setzero_ps();
    for (int w = 0; w < 4; ++w) {
        const __m512 p = exp16(_mm512_sub_ps(_mm512_loadu_ps(scores + w * 16), _mm512_set1_ps(m)));
        _mm512_storeu_ps(scores + w * 16, p);
        sum = _mm512_add_ps(sum, p);
    }
    part[D + 1] = _mm512_reduce_add_ps(sum);
}

struct Shape {
    int64_t n, H, G, T, D;
    int64_t qs[3];         // q strides: row, head, token (d contiguous)
    int64_t kvs[2];        // keys' and values' strides: head, key (d contiguous)
    int64_t ms[2];         // mask: row, token (key contiguous)
    const int64_t* start;  // [n] where row b's keys and values begin (elements from k and v)
    const int64_t* len;    // [n] keys row b attends (its mask row's first len entries)
    const int64_t* real;   // [n] row b's real queries: its tokens 0 .. real[b] - 1 (the rest is padding)
    float scale;
};

// Merge a query row's chunks in order into out (D values).
inline void merge(const float* parts, int64_t chunks, int64_t stride, int64_t D, float* out) {
    float top = -INFINITY;
    for (int64_t c = 0; c < chunks; ++c) top = std::max(top, parts[c * stride + D]);
    std::fill(out, out + D, 0.f);
    if (top == -INFINITY) return;
    float total = 0.f;
    for (int64_t c = 0; c < chunks; ++c) {
        const float* pc = parts + c * stride;
        if (pc[D] == -INFINITY) continue;
        const float w = std::exp(pc[D] - top);
        total += w * pc[D + 1];
        for (int64_t d = 0; d < D; ++d) out[d] += w * pc[d];
    }
    const float inv = 1.f / total;
    for (int64_t d = 0; d < D; ++d) out[d] *= inv;
}

struct Item {
    int64_t b, g, c;  // row, key head, chunk
};

// Every (row, key head, chunk) item computed by chunk_fn(item, next item or nullptr (its keys are prefetched),
// part [R, D + 2]) in parallel, then each query row's chunks merged in order into out [n, T, H, D]
// (contiguous); a padded query's output is zeros.
template <typename ChunkFn>
void run_items(const Shape& s, int64_t D, float* out, ChunkFn&& chunk_fn) {
    const int64_t group = s.H / s.G, R = group * s.T, stride = D + 2;
    std::vector<int64_t> first(s.n + 1, 0);  // [n + 1] row b's items are [first[b], first[b + 1]): G x its chunks
    for (int64_t b = 0; b < s.n; ++b) first[b + 1] = first[b] + s.G * ((s.len[b] + kChunk - 1) / kChunk);
    std::vector<int64_t> item_row(first[s.n]);  // [items] the row of each item
    for (int64_t b = 0; b < s.n; ++b) std::fill(item_row.begin() + first[b], item_row.begin() + first[b + 1], b);
    // [items, R, D + 2], kept across calls: a fresh megabyte a layer was hundreds of page faults each call
    // (the caller's thread's buffer: the OpenMP threads below reach it through this pointer, not by name)
    thread_local std::vector<float> buffer;
    if (buffer.size() < static_cast<size_t>(first[s.n] * R * stride)) buffer.resize(first[s.n] * R * stride);
    float* const parts = buffer.data();
    auto item = [&](int64_t it) {
        const int64_t b = item_row[it], chunks = (first[b + 1] - first[b]) / s.G, i = it - first[b];
        return Item{b, i / chunks, i % chunks};
    };
#pragma omp parallel for schedule(static)
    for (int64_t it = 0; it < first[s.n]; ++it) {
        const Item at = item(it);
        const Item next = it + 1 < first[s.n] ? item(it + 1) : at;
        chunk_fn(at, it + 1 < first[s.n] ? &next : nullptr, &parts[it * R * stride]);
    }
    // The items of (b, g) are its chunks in order, group * real[b] query rows each (at R apart in `parts`).
#pragma omp parallel for schedule(static)
    for (int64_t row = 0; row < s.n * s.G * R; ++row) {
        const int64_t b = row / (s.G * R), g = (row / R) % s.G, r = row % R;
        const int64_t h = g * group + r / s.T, t = r % s.T, chunks = (first[b + 1] - first[b]) / s.G;
        float* o = out + ((b * s.T + t) * s.H + h) * D;
        if (t >= s.real[b]) {
            std::fill(o, o + D, 0.f);
            continue;
        }
        const float* head = &parts[(first[b] + g * chunks) * R * stride + ((r / s.T) * s.real[b] + t) * stride];
        merge(head, chunks, R * stride, D, o);
    }
}

}  // namespace few_queries
