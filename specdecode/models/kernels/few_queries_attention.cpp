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
#include "few_queries_common.h"

namespace {

using namespace few_queries;

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
            masked_scores(acc[i], mr, width, s.scale, &scores[r * kChunk]);
        }
    }
    // Per query row: max, exponentials in place, their sum.
    for (int64_t r = 0; r < R; ++r) exponentiate(&scores[r * kChunk], part + r * (D + 2), D);
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

template <int DV>
void run(const Shape& s, const float* q, const float* k, const float* v, const float* mask, float* out) {
    run_items(s, DV * 16, out, [&](const Item& at, const Item* next, float* part) {
        const float* next_k = next == nullptr ? nullptr : k + s.start[next->b] + next->g * s.kvs[0] + next->c * kChunk * s.kvs[1];
        chunk<DV>(s, q, k, v, mask, at.b, at.g, at.c, next_k, part);
    });
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
