// The few-queries attention (kernels/few_queries_attention.cpp) over a bf16 cache: the fast arithmetic's.
//
// At long contexts attention is most of a step's arithmetic: on the Qwen2.5-Coder 1.5B at 8,192 cached tokens
// each query token is ~1.4 GFLOP of it, and the fp32 kernel took 31.9 ms of a one-token step and 67.3 of a
// 5-token verify (results/kv_bf16_attention.json: 17.7 and 45.4 here; 2-core AMD EPYC, 2026-11-29). Here the keys and values are stored in bf16 (half the bytes a step reads) and,
// where the CPU has AVX512_BF16, the dot products are `vdpbf16ps`: two bf16 products a lane per instruction, with
// fp32 sums, twice an fp32 FMA's multiply-adds. The query is rounded to bf16 once per call, the probabilities
// before they weight the values (as bf16 attention does on accelerators); the scores, the softmax, the partial
// sums and the merge stay fp32, as in the fp32 kernel.
//
// Layout: a key's D bf16 values are D / 2 32-bit words (pairs of dimensions), so the fp32 kernel's 16 x 16
// transpose of 32-bit elements puts a chunk's keys as [D / 2, kChunk] words, and one `vdpbf16ps` adds a
// dimension pair's products for 16 keys. For the values, two keys' rows are interleaved 16 bits at a time
// (`vpunpck[lh]wd`), so a lane holds one dimension of both keys and the broadcast word holds both keys'
// probabilities; the interleave permutes the dimensions within a 32-dimension block, undone when stored.
//
// Without AVX512_BF16 (an Intel Xeon before Cooper Lake) the same bf16 values are widened to fp32 and summed with
// FMAs. Either way a query row's result depends only on its own query, mask row and keys, never on T, on the other
// rows or on the threads, so a verify's logits equal a one-token step's bit for bit on one machine; the two paths
// round differently, so machines with and without AVX512_BF16 may differ in the last bits.
#include <cstring>

#include "few_queries_common.h"

// The whole file may use AVX512_BF16 (its intrinsics need it); only `dot2<true>` does, and the caller takes that
// path only where the CPU has it (few_queries_bf16_dot).
#pragma GCC target("avx512bf16,avx512bw,avx512vl")

namespace {

using namespace few_queries;

using Word = uint32_t;  // two bf16 values: the even dimension (or key) in the low half

// fp32 -> bf16, rounding to nearest even (torch's rounding for a finite value; a NaN stays a quiet NaN).
inline uint16_t to_bf16(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
    return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// 16 fp32 -> 16 bf16 (the same rounding, in registers).
inline __m256i to_bf16x16(__m512 x) {
    const __m512i u = _mm512_castps_si512(x);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    r = _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7fc0));
    return _mm512_cvtepi32_epi16(r);
}

// The low and high bf16 halves of each word, widened to fp32.
inline __m512 low_half(__m512i w) { return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)); }
inline __m512 high_half(__m512i w) { return _mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32(-65536))); }

// acc + a.lo * b.lo + a.hi * b.hi per lane: `vdpbf16ps` where the CPU has it, else FMAs on the widened halves.
template <bool Hw>
inline __m512 dot2(__m512 acc, __m512i a, __m512i b);

template <>
inline __m512 dot2<true>(__m512 acc, __m512i a, __m512i b) {
    return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh>(a), reinterpret_cast<__m512bh>(b));
}

template <>
inline __m512 dot2<false>(__m512 acc, __m512i a, __m512i b) {
    return _mm512_fmadd_ps(high_half(a), high_half(b), _mm512_fmadd_ps(low_half(a), low_half(b), acc));
}

// Where lane e of a value block's low (half 0) or high (half 1) interleaved register lands: 128-bit lane e / 4
// holds dimensions 8 (e / 4) + 4 half + e % 4 of the 32.
inline int value_dim(int half, int e) { return 8 * (e / 4) + 4 * half + e % 4; }

// One (row b, key head g, chunk c) item, as the fp32 kernel's `chunk`: q are the call's queries in bf16 pairs
// [n, H, T, D / 2] words (contiguous), k and v the cache's bf16 values.
template <int DV, bool Hw>
void chunk(const Shape& s, const Word* q, const uint16_t* k, const uint16_t* v, const float* mask, int64_t b,
           int64_t g, int64_t c, const uint16_t* next_k, float* part) {
    constexpr int D = DV * 16, W = D / 2;  // dimensions, and words a key or query holds
    const int64_t group = s.H / s.G, T = s.real[b], R = group * T, first = c * kChunk;
    const int width = static_cast<int>(std::min<int64_t>(kChunk, s.len[b] - first));
    alignas(64) Word kt[W][kChunk];  // the chunk's keys, transposed: kt[m][j] = dimensions 2m, 2m + 1 of key j
    const uint16_t* kb = k + s.start[b] + g * s.kvs[0] + first * s.kvs[1];
    const uint16_t* vb = v + s.start[b] + g * s.kvs[0] + first * s.kvs[1];
    for (int j0 = 0; j0 < kChunk; j0 += 16)
        for (int m0 = 0; m0 < W; m0 += 16)
            transpose16(reinterpret_cast<const float*>(kb + j0 * s.kvs[1] + 2 * m0), s.kvs[1] / 2, width - j0,
                        reinterpret_cast<float*>(&kt[m0][j0]), kChunk);
    thread_local std::vector<float> scores;  // [R, kChunk]
    if (scores.size() < static_cast<size_t>(R * kChunk)) scores.resize(R * kChunk);
    auto qrow = [&](int64_t r) { return q + ((b * s.H + g * group + r / T) * s.T + r % T) * W; };
    for (int64_t r0 = 0; r0 < R; r0 += kScoreRows) {
        const int rows = static_cast<int>(std::min<int64_t>(kScoreRows, R - r0));
        __m512 acc[kScoreRows][4];
        const Word* qr[kScoreRows];
        for (int i = 0; i < rows; ++i) {
            qr[i] = qrow(r0 + i);
            for (int w = 0; w < 4; ++w) acc[i][w] = _mm512_setzero_ps();
        }
        for (int m = 0; m < W; ++m) {
            if (r0 == 0)  // the chunk's values (kChunk * D * 2 bytes: 4 lines a word of D / 2), while the dots run
                for (int l = 0; l < 4; ++l)
                    _mm_prefetch(reinterpret_cast<const char*>(vb + (m * 4 + l) * 32), _MM_HINT_T0);
            __m512i kd[4];
            for (int w = 0; w < 4; ++w) kd[w] = _mm512_load_si512(&kt[m][w * 16]);
            for (int i = 0; i < rows; ++i) {
                const __m512i x = _mm512_set1_epi32(static_cast<int>(qr[i][m]));
                for (int w = 0; w < 4; ++w) acc[i][w] = dot2<Hw>(acc[i][w], x, kd[w]);
            }
        }
        for (int i = 0; i < rows; ++i) {
            const int64_t r = r0 + i;
            const float* mr = mask + b * s.ms[0] + (r % T) * s.ms[1] + first;
            masked_scores(acc[i], mr, width, s.scale, &scores[r * kChunk]);
        }
    }
    // Per query row: max, exponentials, their sum (fp32), then the probabilities in bf16 pairs of keys.
    thread_local std::vector<Word> probs;  // [R, kChunk / 2]
    if (probs.size() < static_cast<size_t>(R * kChunk / 2)) probs.resize(R * kChunk / 2);
    for (int64_t r = 0; r < R; ++r) {
        float* sr = &scores[r * kChunk];
        exponentiate(sr, part + r * (D + 2), D);
        auto* pb = reinterpret_cast<uint16_t*>(&probs[r * kChunk / 2]);
        for (int w = 0; w < 4; ++w)
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(pb + w * 16), to_bf16x16(_mm512_loadu_ps(sr + w * 16)));
    }
    // acc[r] = sum_j p[r, j] v[j], two keys a step; a lone last key is paired with zeros (past it the cache may
    // hold anything).
    constexpr int kValueRows = 24 / DV;
    const int pairs = (width + 1) / 2;
    for (int64_t r0 = 0; r0 < R; r0 += kValueRows) {
        const int rows = static_cast<int>(std::min<int64_t>(kValueRows, R - r0));
        __m512 acc[kValueRows][DV];
        for (int i = 0; i < rows; ++i)
            for (int w = 0; w < DV; ++w) acc[i][w] = _mm512_setzero_ps();
        for (int jj = 0; jj < pairs; ++jj) {
            const int j = 2 * jj;
            if (r0 == 0 && next_k != nullptr)  // the next item's keys, likewise
                for (int l = 0; l < D / 16; ++l)
                    _mm_prefetch(reinterpret_cast<const char*>(next_k + (j + l / (D / 32)) * s.kvs[1] + (l % (D / 32)) * 32), _MM_HINT_T0);
            const uint16_t* v0 = vb + j * s.kvs[1];
            __m512i vv[DV];
            for (int u = 0; u < D / 32; ++u) {
                const __m512i a = _mm512_loadu_si512(v0 + u * 32);
                const __m512i z = j + 1 < width ? _mm512_loadu_si512(v0 + s.kvs[1] + u * 32) : _mm512_setzero_si512();
                vv[2 * u] = _mm512_unpacklo_epi16(a, z);
                vv[2 * u + 1] = _mm512_unpackhi_epi16(a, z);
            }
            for (int i = 0; i < rows; ++i) {
                const __m512i p = _mm512_set1_epi32(static_cast<int>(probs[(r0 + i) * kChunk / 2 + jj]));
                for (int w = 0; w < DV; ++w) acc[i][w] = dot2<Hw>(acc[i][w], p, vv[w]);
            }
        }
        for (int i = 0; i < rows; ++i) {
            float* pr = part + (r0 + i) * (D + 2);
            for (int w = 0; w < DV; ++w) {
                alignas(64) float lanes[16];
                _mm512_store_ps(lanes, acc[i][w]);
                for (int e = 0; e < 16; ++e) pr[(w / 2) * 32 + value_dim(w % 2, e)] = lanes[e];
            }
        }
    }
}

// The call's queries rounded to bf16 pairs: [n, H, T, D / 2] words.
void queries_bf16(const Shape& s, const float* q, std::vector<Word>& out) {
    const int64_t W = s.D / 2;
    out.resize(s.n * s.H * s.T * W);
    for (int64_t b = 0; b < s.n; ++b)
        for (int64_t h = 0; h < s.H; ++h)
            for (int64_t t = 0; t < s.T; ++t) {
                const float* src = q + b * s.qs[0] + h * s.qs[1] + t * s.qs[2];
                Word* dst = &out[((b * s.H + h) * s.T + t) * W];
                for (int64_t m = 0; m < W; ++m)
                    dst[m] = static_cast<Word>(to_bf16(src[2 * m])) | static_cast<Word>(to_bf16(src[2 * m + 1])) << 16;
            }
}

template <int DV, bool Hw>
void run(const Shape& s, const float* q, const uint16_t* k, const uint16_t* v, const float* mask, float* out) {
    thread_local std::vector<Word> qb;
    queries_bf16(s, q, qb);
    const Word* qw = qb.data();
    run_items(s, DV * 16, out, [&](const Item& at, const Item* next, float* part) {
        const uint16_t* next_k =
            next == nullptr ? nullptr : k + s.start[next->b] + next->g * s.kvs[0] + next->c * kChunk * s.kvs[1];
        chunk<DV, Hw>(s, qw, k, v, mask, at.b, at.g, at.c, next_k, part);
    });
}

template <bool Hw>
bool dispatch(const Shape& s, const float* q, const uint16_t* k, const uint16_t* v, const float* mask, float* out) {
    switch (s.D) {
        case 32: run<2, Hw>(s, q, k, v, mask, out); return true;
        case 64: run<4, Hw>(s, q, k, v, mask, out); return true;
        case 128: run<8, Hw>(s, q, k, v, mask, out); return true;
        default: return false;
    }
}

}  // namespace

extern "C" {

// Whether this CPU has AVX512_BF16 (the `vdpbf16ps` path).
bool few_queries_bf16_dot() {
    __builtin_cpu_init();  // it may run from a static initializer, before the library's own
    return __builtin_cpu_supports("avx512bf16");
}

// fp32 values [count] -> bf16 [count], rounding to nearest even (what `few_queries_attend` writes a new key with).
void few_queries_to_bf16(const float* src, uint16_t* dst, int64_t count) {
    for (int64_t i = 0; i < count; ++i) dst[i] = to_bf16(src[i]);
}

// As few_queries_attention (kernels/few_queries_attention.cpp) with bf16 keys and values; hw: the `vdpbf16ps`
// path (the caller asks only where few_queries_bf16_dot() holds), else the widening one. Returns false (and
// writes nothing) for a head size other than 32, 64 or 128.
bool few_queries_attention_bf16(const float* q, const uint16_t* k, const uint16_t* v, const float* mask, float* out,
                                const int64_t* sizes,  // n, H, G, T, D
                                const int64_t* q_strides, const int64_t* kv_strides, const int64_t* mask_strides,
                                const int64_t* start, const int64_t* len, const int64_t* real, float scale, bool hw) {
    Shape s{sizes[0], sizes[1], sizes[2], sizes[3], sizes[4], {}, {}, {}, start, len, real, scale};
    std::copy(q_strides, q_strides + 3, s.qs);
    std::copy(kv_strides, kv_strides + 2, s.kvs);
    std::copy(mask_strides, mask_strides + 2, s.ms);
    return hw ? dispatch<true>(s, q, k, v, mask, out) : dispatch<false>(s, q, k, v, mask, out);
}

}
