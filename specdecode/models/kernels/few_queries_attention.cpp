// Attention of a few new queries per row over a row's cached keys, fp32, AVX-512: the decode and verify case.
//
// q [n, H, T, D] (any strides, a head's D values contiguous); row b's keys and values [G, len[b], D] start at its
// own offset in the cache (H = G * group; a key's D values contiguous); additive mask [n, 1, T, >= len[b]]. ATen's
// flash kernel on the CPU treats every query head alone and multiplies [T, D] by [D, block] with a library GEMM;
// for T of 1-17 that is mostly overhead, and each key is read once per query head. Here the group * T query rows
// that share a key head are one block:
//
// 1. The keys are cut into chunks of kChunk from key 0, the same cut whatever T, n or the thread count. A
//    (row, key head, chunk) is one work item: its keys are transposed into [D, kChunk] on the stack (16 x 16
//    blocks in registers), then every query row's kChunk scores are 4 registers of FMAs over d (a query value
//    broadcast per FMA), plus the mask. While they run, the item's values are prefetched, and while the values
//    are summed, the next item's keys: a one-token step is bound by reading the cache, and without it the
//    loads waited on the arithmetic.
// 2. Per query row: the chunk's max m, p = exp(s - m) (a polynomial; masked keys give exactly 0), l = sum p and
//    acc[D] = sum_j p_j v_j (each value row read once for all the query rows).
// 3. The chunks of a query row are merged in order: out = sum_c e^(m_c - M) acc_c / sum_c e^(m_c - M) l_c.
//
// A query row's result depends only on its own query, mask row and keys: not on T, on the other rows or on the
// threads (the same summation order in all cases), so a verify's logits equal a one-token step's bit for bit.
// A row that may attend to no key gets zeros, and so does a padded query (token t >= real[b]: a batch padded to
// its widest row, where one row's probe at batch 8 made every row attend twice), which is not computed.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace {

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

// One (row b, key head g, chunk c) item: scores, exponentials and the partial sums of its R = group * real[b]
// query rows (head-major: row r is head g * group + r / real[b], token r % real[b]), written to part[R][D + 2]
// as (acc[D], m, l).
template <int DV>  // D / 16
void chunk(const Shape& s, const float* q, const float* k, const float* v, const float* mask, int64_t b, int64_t g,
           int64_t c, const float* next_k, float* part) {
    constexpr int D = DV * 16;
    const int64_t group = s.H / s.G, T = s.real[b], R = group * T, first = c * kChunk;
    const int width = static_cast<int>(std::min<int64_t>(kChunk, s.len[b] - first));
    alignas(64) float kt[D][kChunk];  // the chunk's keys, transposed
    const float* kb = k + s.start[b] + g * s.kvs[0] + first * s.kvs[1];
    const float* vb = v + s.start[b] + g * s.kvs[0] + first * s.kvs[1];
    for (int j0 = 0; j0 < kChunk; j0 += 16)
        for (int d0 = 0; d0 < D; d0 += 16) transpose16(kb + j0 * s.kvs[1] + d0, s.kvs[1], width - j0, &kt[d0][j0], kChunk);
    thread_local std::vector<float> scores;  // [R, kChunk]
    if (scores.size() < static_cast<size_t>(R * kChunk)) scores.resize(R * kChunk);
    auto qrow = [&](int64_t r) { return q + b * s.qs[0] + (g * group + r / T) * s.qs[1] + (r % T) * s.qs[2]; };
    for (int64_t r0 = 0; r0 < R; r0 += kScoreRows) {
        const int rows = static_cast<int>(std::min<int64_t>(kScoreRows, R - r0));
        __m512 acc[kScoreRows][4];
        const float* qr[kScoreRows];
        for (int i = 0; i < rows; ++i) {
            qr[i] = qrow(r0 + i);
            for (int w = 0; w < 4; ++w) acc[i][w] = _mm512_setzero_ps();
        }
        for (int d = 0; d < D; ++d) {
            if (r0 == 0)  // the chunk's values (contiguous: kvs[1] == D), kChunk / 16 lines per d, while the FMAs run
                for (int l = 0; l < kChunk / 16; ++l)
                    _mm_prefetch(reinterpret_cast<const char*>(vb + (d * kChunk / 16 + l) * 16), _MM_HINT_T0);
            __m512 kd[4];
            for (int w = 0; w < 4; ++w) kd[w] = _mm512_load_ps(&kt[d][w * 16]);
            for (int i = 0; i < rows; ++i) {
                const __m512 x = _mm512_set1_ps(qr[i][d]);
                for (int w = 0; w < 4; ++w) acc[i][w] = _mm512_fmadd_ps(x, kd[w], acc[i][w]);
            }
        }
        for (int i = 0; i < rows; ++i) {
            const int64_t r = r0 + i;
            const float* mr = mask + b * s.ms[0] + (r % T) * s.ms[1] + first;
            for (int w = 0; w < 4; ++w) {
                const int lanes = std::clamp(width - w * 16, 0, 16);  // this register's keys inside the chunk
                const __mmask16 live = static_cast<__mmask16>((1u << lanes) - 1);
                const __m512 m = _mm512_maskz_loadu_ps(live, mr + w * 16);
                const __m512 sc = _mm512_fmadd_ps(acc[i][w], _mm512_set1_ps(s.scale), m);
                _mm512_storeu_ps(&scores[r * kChunk + w * 16], _mm512_mask_blend_ps(live, _mm512_set1_ps(-INFINITY), sc));
            }
        }
    }
    // Per query row: max, exponentials in place, their sum.
    for (int64_t r = 0; r < R; ++r) {
        float* sr = &scores[r * kChunk];
        __m512 mx = _mm512_loadu_ps(sr);
        for (int w = 1; w < 4; ++w) mx = _mm512_max_ps(mx, _mm512_loadu_ps(sr + w * 16));
        const float m = _mm512_reduce_max_ps(mx);
        float* pr = part + r * (D + 2);
        pr[D] = m;
        if (m == -INFINITY) {  // no key of this chunk is visible to the row
            for (int w = 0; w < 4; ++w) _mm512_storeu_ps(sr + w * 16, _mm512_setzero_ps());
            pr[D + 1] = 0.f;
            continue;
        }
        __m512 sum = _mm512_setzero_ps();
        for (int w = 0; w < 4; ++w) {
            const __m512 p = exp16(_mm512_sub_ps(_mm512_loadu_ps(sr + w * 16), _mm512_set1_ps(m)));
            _mm512_storeu_ps(sr + w * 16, p);
            sum = _mm512_add_ps(sum, p);
        }
        pr[D + 1] = _mm512_reduce_add_ps(sum);
    }
    // acc[r] = sum_j p[r, j] v[j]: each value row loaded once per block of query rows.
    constexpr int kValueRows = 24 / DV;
    for (int64_t r0 = 0; r0 < R; r0 += kValueRows) {
        const int rows = static_cast<int>(std::min<int64_t>(kValueRows, R - r0));
        __m512 acc[kValueRows][DV];
        for (int i = 0; i < rows; ++i)
            for (int w = 0; w < DV; ++w) acc[i][w] = _mm512_setzero_ps();
        for (int j = 0; j < width; ++j) {
            if (r0 == 0 && next_k != nullptr)  // the next item's keys, likewise
                for (int w = 0; w < DV; ++w) _mm_prefetch(reinterpret_cast<const char*>(next_k + j * s.kvs[1] + w * 16), _MM_HINT_T0);
            __m512 vj[DV];
            for (int w = 0; w < DV; ++w) vj[w] = _mm512_loadu_ps(vb + j * s.kvs[1] + w * 16);
            for (int i = 0; i < rows; ++i) {
                const __m512 p = _mm512_set1_ps(scores[(r0 + i) * kChunk + j]);
                for (int w = 0; w < DV; ++w) acc[i][w] = _mm512_fmadd_ps(p, vj[w], acc[i][w]);
            }
        }
        for (int i = 0; i < rows; ++i)
            for (int w = 0; w < DV; ++w) _mm512_storeu_ps(part + (r0 + i) * (D + 2) + w * 16, acc[i][w]);
    }
}

// Merge a query row's chunks in order into out (D values).
void merge(const float* parts, int64_t chunks, int64_t stride, int64_t D, float* out) {
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

template <int DV>
void run(const Shape& s, const float* q, const float* k, const float* v, const float* mask, float* out) {
    constexpr int D = DV * 16;
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
    struct Item {
        int64_t b, g, c;  // row, key head, chunk
    };
    auto item = [&](int64_t it) {
        const int64_t b = item_row[it], chunks = (first[b + 1] - first[b]) / s.G, i = it - first[b];
        return Item{b, i / chunks, i % chunks};
    };
#pragma omp parallel for schedule(static)
    for (int64_t it = 0; it < first[s.n]; ++it) {
        const Item at = item(it);
        const float* next_k = nullptr;  // the next item's keys, prefetched while this one computes
        if (it + 1 < first[s.n]) {
            const Item next = item(it + 1);
            next_k = k + s.start[next.b] + next.g * s.kvs[0] + next.c * kChunk * s.kvs[1];
        }
        chunk<DV>(s, q, k, v, mask, at.b, at.g, at.c, next_k, &parts[it * R * stride]);
    }
    // out [n, T, H, D] contiguous; the items of (b, g) are its chunks in order, group * real[b] query rows each
    // (at R apart in `parts`); a padded query's output is zeros.
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

}  // namespace

extern "C" {

// q [n, H, T, D] (strides q_strides: row, head, token); row b's keys at k + start[b] and values at v + start[b],
// [G, len[b], D] with strides kv_strides (head, key); mask [n, 1, T, >= len[b]] (strides: row, token); out
// [n, T, H, D] contiguous; real [n]: row b's queries past real[b] - 1 are padding (1 <= real[b] <= T), not
// computed, their output zeros. Returns false (and writes nothing) for a head size other than 16, 32, 64 or 128.
bool few_queries_attention(const float* q, const float* k, const float* v, const float* mask, float* out,
                           const int64_t* sizes,  // n, H, G, T, D
                           const int64_t* q_strides, const int64_t* kv_strides, const int64_t* mask_strides,
                           const int64_t* start, const int64_t* len, const int64_t* real, float scale) {
    Shape s{sizes[0], sizes[1], sizes[2], sizes[3], sizes[4], {}, {}, {}, start, len, real, scale};
    std::copy(q_strides, q_strides + 3, s.qs);
    std::copy(kv_strides, kv_strides + 2, s.kvs);
    std::copy(mask_strides, mask_strides + 2, s.ms);
    switch (s.D) {
        case 16: run<1>(s, q, k, v, mask, out); break;
        case 32: run<2>(s, q, k, v, mask, out); break;
        case 64: run<4>(s, q, k, v, mask, out); break;
        case 128: run<8>(s, q, k, v, mask, out); break;
        default: return false;
    }
    return true;
}

}
