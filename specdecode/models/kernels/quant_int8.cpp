// specdecode::quant_int8_linear(x [..., K], blocks [N, bytes_per_row], qtype, K, bias?, path) -> [..., N]: the
// "fast" arithmetic. y ~= x @ dequant(W)^T (+ bias) with W kept as the raw GGUF blocks of one of Q4_1, Q5_0,
// Q8_0, Q4_K, Q6_K (ggml's type numbers) and the activations quantized to int8, as llama.cpp's CPU kernels do.
// It is NOT the dequantized model's product (that is quant_rows.cpp's); it is this fixed arithmetic:
//
// 1. Activations. Each row of x is quantized on its own, per block of QB consecutive values: QB = 32 for the
//    32-weight types (Q4_1, Q5_0, Q8_0), QB = 256 (one super-block) for Q4_K and Q6_K. For a block x[0..QB):
//      amax = max |x[i]|;  dx = amax / 127.0f (fp32 division);
//      q[i] = 0 if dx == 0, else clamp(round_half_even(x[i] / dx), -127, 127)   (fp32 division, int8 result).
//    Block sums s16 (per 16 values) and s32 (per 32 values) of q are integers. Non-finite x are undefined.
// 2. Integers per weight block b of a weight row and activation block b of an activation row (exact in int32):
//      Q4_1:  S = sum_i q4[i] x[i];                  (w = d * q4 + m)
//      Q5_0:  S = sum_i (q5[i] - 16) x[i];           (w = d * (q5 - 16))
//      Q8_0:  S = sum_i q8[i] x[i];                  (w = d * q8, q8 signed)
//      Q4_K:  S = sum_j sc[j] * sum_{i in sub-block j} q4[i] x[i];  Mn = sum_j mn[j] * s32[j]   (8 sub-blocks of 32;
//             w = d * sc[j] * q4 - dmin * mn[j], sc and mn the 6-bit scales)
//      Q6_K:  S = sum_j sc[j] * sum_{i in sub-block j} (q6[i] - 32) x[i]   (16 sub-blocks of 16; sc int8)
//    where x[i] are the activation quants of the same 32 (or 256) positions.
// 3. fp32, in this order, each operation rounded to fp32 (no fused multiply-adds: -ffp-contract=off), with d, dmin,
//    m the block's fp16 values converted exactly and float(S) int32 -> fp32 round-to-nearest-even:
//      P = float(S) * (d * dx)
//      Q4_1: t = P + float(s32) * (m * dx);   Q4_K: t = P - float(Mn) * (dmin * dx);   others: t = P
//      acc = +0; acc = acc + t for b = 0, 1, 2, ... in increasing order;   y = acc (+ bias[n] if a bias).
//
// The integers are exact whatever instructions compute them, and the fp32 part is one scalar code shared by every
// path, so the AVX512-VNNI path (vpdpbusd for the 32-weight types, vpmaddubsw + vpdpwssd with the sub-block scales
// for the K-quants), the AVX-512BW path (vpmaddubsw + vpmaddwd; vpmaddubsw's int16 pair sums cannot saturate
// because its unsigned operand is a weight quant <= 63, at most 2 * 63 * 127 = 16002, and Q8_0's signed weights go
// through vpmaddwd on int16 instead) and the portable scalar path give identical bits. A row's quantization and
// sums never read another row, so its output is bitwise the same alone or in any batch.
//
// Work: every activation row is quantized once per call, before the threads start; threads split pairs of output
// rows; each weight block is decoded once per call and chunk of 16 activation rows, and meets every row of the
// chunk (the row count a template argument, so the row loop unrolls).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(SPECDECODE_PORTABLE_ONLY)
#define QUANT_INT8_X86 1
#include <immintrin.h>
#else
#define QUANT_INT8_X86 0
#endif

namespace {

enum QType : int64_t { kQ4_1 = 3, kQ5_0 = 6, kQ8_0 = 8, kQ4_K = 12, kQ6_K = 14 };
enum Path : int64_t { kAuto = 0, kVnni = 1, kBw = 2, kPortable = 3 };

template <int64_t T>
struct Layout;  // weights and bytes per block, as gguf.constants.GGML_QUANT_SIZES
template <>
struct Layout<kQ4_1> { static constexpr int kWeights = 32, kBytes = 20; };
template <>
struct Layout<kQ5_0> { static constexpr int kWeights = 32, kBytes = 22; };
template <>
struct Layout<kQ8_0> { static constexpr int kWeights = 32, kBytes = 34; };
template <>
struct Layout<kQ4_K> { static constexpr int kWeights = 256, kBytes = 144; };
template <>
struct Layout<kQ6_K> { static constexpr int kWeights = 256, kBytes = 210; };

constexpr int kMaxRows = 16;  // activation rows per chunk: their quants (16 x 256 bytes) stay in L1
constexpr int kPair = 2;      // weight rows per task
// Faults for negative controls (specdecode_quant_int8_fault): kFaultScale makes sub-block 5 of each K-quant
// super-block (or every 32-weight block b with b % 8 == 5) take its neighbour's scale; kFaultShared quantizes
// every activation block with one scale shared by all the rows of the call (the largest amax among them).
constexpr int kFaultScale = 1, kFaultShared = 2, kFaultSub = 5;
int g_fault = 0;

// Exact fp16 -> fp32 (normals, subnormals, infinities, NaN), read unaligned.
float half_to_float(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    const uint32_t sign = uint32_t(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    uint32_t bits;
    if (exp == 0) {
        const float mag = float(mant) * 0x1p-24f;
        std::memcpy(&bits, &mag, 4);
        bits |= sign;
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else {
        bits = sign | ((exp + 112) << 23) | (mant << 13);
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

// ---- activations: quantized once per call, shared read-only by the threads ----

struct Acts {
    int64_t K = 0, QB = 0;
    std::vector<int8_t> q;     // [rows, K]
    std::vector<float> d;      // [rows, K / QB]
    std::vector<int16_t> s16;  // [rows, K / 16]
    std::vector<int16_t> s32;  // [rows, K / 32]
};

void quantize(const float* x, int64_t rows, int64_t K, int64_t QB, bool shared, Acts& a) {
    a.K = K, a.QB = QB;
    a.q.assign(rows * K, 0);
    a.d.assign(rows * (K / QB), 0.0f);
    a.s16.assign(rows * (K / 16), 0);
    a.s32.assign(rows * (K / 32), 0);
    for (int64_t b = 0; b < K / QB; ++b) {
        float batch_amax = 0.0f;  // only the shared-scale fault reads it
        for (int64_t m = 0; shared && m < rows; ++m)
            for (int64_t i = 0; i < QB; ++i) batch_amax = std::max(batch_amax, std::fabs(x[m * K + b * QB + i]));
        for (int64_t m = 0; m < rows; ++m) {
            const float* xb = x + m * K + b * QB;
            float amax = 0.0f;
            for (int64_t i = 0; i < QB; ++i) amax = std::max(amax, std::fabs(xb[i]));
            const float dx = (shared ? batch_amax : amax) / 127.0f;
            a.d[m * (K / QB) + b] = dx;
            int8_t* qb = a.q.data() + m * K + b * QB;
            if (dx != 0.0f) {
                for (int64_t i = 0; i < QB; ++i) {
                    const float r = std::nearbyint(xb[i] / dx);  // the default rounding mode: half to even
                    qb[i] = int8_t(std::min(127.0f, std::max(-127.0f, r)));
                }
            }
        }
    }
    for (int64_t m = 0; m < rows; ++m) {
        for (int64_t c = 0; c < K / 16; ++c) {
            int s = 0;
            for (int i = 0; i < 16; ++i) s += a.q[m * K + 16 * c + i];
            a.s16[m * (K / 16) + c] = int16_t(s);
        }
        for (int64_t c = 0; c < K / 32; ++c)
            a.s32[m * (K / 32) + c] = int16_t(a.s16[m * (K / 16) + 2 * c] + a.s16[m * (K / 16) + 2 * c + 1]);
    }
}

// ---- weights: one block decoded to unsigned quants in natural order and integer scales ----

struct alignas(64) WBlock {
    uint8_t q[256];     // Q4_1, Q4_K 0..15; Q5_0 0..31; Q6_K 0..63; Q8_0 the signed bytes as stored
    int16_t sc[16];     // Q4_K 8, Q6_K 16 sub-block scales
    int16_t mn[8];      // Q4_K sub-block mins
    float d = 0, d2 = 0;  // d; and dmin (Q4_K) or m (Q4_1)
};

// Q4_K's 6-bit scale and min of sub-block j (0..7) from its 12 packed bytes.
void q4k_scale_min(const uint8_t* s, int j, int& sc, int& mn) {
    if (j < 4) {
        sc = s[j] & 63;
        mn = s[j + 4] & 63;
    } else {
        sc = (s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4);
        mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// The scalar fields of block b (shared by all paths, so the fault hits all of them alike).
template <int64_t T>
void decode_scales(const uint8_t* row, int64_t b, bool fault, WBlock& w) {
    const uint8_t* blk = row + b * Layout<T>::kBytes;
    if constexpr (T == kQ4_K) {
        w.d = half_to_float(blk), w.d2 = half_to_float(blk + 2);
        for (int j = 0; j < 8; ++j) {
            int sc, mn, unused;
            q4k_scale_min(blk + 4, j, sc, mn);
            if (fault && j == kFaultSub) q4k_scale_min(blk + 4, j - 1, sc, unused);
            w.sc[j] = int16_t(sc), w.mn[j] = int16_t(mn);
        }
    } else if constexpr (T == kQ6_K) {
        w.d = half_to_float(blk + 208);
        for (int j = 0; j < 16; ++j) w.sc[j] = int8_t(blk[192 + (fault && j == kFaultSub ? j - 1 : j)]);
    } else {
        const int64_t src = fault && b % 8 == kFaultSub ? b - 1 : b;
        w.d = half_to_float(row + src * Layout<T>::kBytes);
        if constexpr (T == kQ4_1) w.d2 = half_to_float(blk + 2);
    }
}

template <int64_t T>
void decode_quants_portable(const uint8_t* blk, WBlock& w) {
    if constexpr (T == kQ4_1) {
        for (int j = 0; j < 16; ++j) w.q[j] = blk[4 + j] & 0xf, w.q[j + 16] = blk[4 + j] >> 4;
    } else if constexpr (T == kQ5_0) {
        uint32_t qh;
        std::memcpy(&qh, blk + 2, 4);
        for (int j = 0; j < 16; ++j) {
            w.q[j] = uint8_t((blk[6 + j] & 0xf) | (((qh >> j) & 1) << 4));
            w.q[j + 16] = uint8_t((blk[6 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
        }
    } else if constexpr (T == kQ8_0) {
        std::memcpy(w.q, blk + 2, 32);
    } else if constexpr (T == kQ4_K) {
        for (int i = 0; i < 4; ++i)
            for (int l = 0; l < 32; ++l)
                w.q[64 * i + l] = blk[16 + 32 * i + l] & 0xf, w.q[64 * i + 32 + l] = blk[16 + 32 * i + l] >> 4;
    } else {
        for (int l = 0; l < 256; ++l) {
            const int h = l / 128, r = l % 128;
            const int lo = (blk[64 * h + r % 64] >> (4 * (r / 64))) & 0xf;
            const int hi = (blk[128 + 32 * h + r % 32] >> (2 * (r / 32))) & 3;
            w.q[l] = uint8_t(lo | (hi << 4));
        }
    }
}

struct Ints {
    int32_t S, Mn;  // Mn: Q4_K's mins term, Q4_1's activation sum; unused otherwise
};

template <int64_t T>
Ints dot_portable(const WBlock& w, const Acts& a, int64_t m, int64_t b) {
    constexpr int kW = Layout<T>::kWeights;
    const int8_t* x = a.q.data() + m * a.K + b * kW;
    const int16_t* s16 = a.s16.data() + m * (a.K / 16) + b * (kW / 16);
    const int16_t* s32 = a.s32.data() + m * (a.K / 32) + b * (kW / 32);
    int32_t S = 0, Mn = 0;
    if constexpr (T == kQ8_0) {
        for (int i = 0; i < 32; ++i) S += int8_t(w.q[i]) * x[i];
    } else if constexpr (T == kQ4_1 || T == kQ5_0) {
        for (int i = 0; i < 32; ++i) S += w.q[i] * x[i];
        if constexpr (T == kQ5_0) S -= 16 * s32[0];
        Mn = s32[0];
    } else if constexpr (T == kQ4_K) {
        for (int j = 0; j < 8; ++j) {
            int32_t s = 0;
            for (int i = 0; i < 32; ++i) s += w.q[32 * j + i] * x[32 * j + i];
            S += w.sc[j] * s;
            Mn += w.mn[j] * s32[j];
        }
    } else {
        for (int j = 0; j < 16; ++j) {
            int32_t s = 0;
            for (int i = 0; i < 16; ++i) s += w.q[16 * j + i] * x[16 * j + i];
            S += w.sc[j] * (s - 32 * s16[j]);
        }
    }
    return {S, Mn};
}

// Step 3 of the header: the one fp32 code every path ends in.
template <int64_t T>
float block_term(const WBlock& w, Ints v, float dx) {
    const float P = float(v.S) * (w.d * dx);
    if constexpr (T == kQ4_1) return P + float(v.Mn) * (w.d2 * dx);
    if constexpr (T == kQ4_K) return P - float(v.Mn) * (w.d2 * dx);
    return P;
}

struct Args {
    const Acts* acts;
    const uint8_t* w;    // [N, row_bytes]
    const float* bias;   // [N] or nullptr
    float* out;          // [M, N]
    int64_t M, K, N, row_bytes;
    bool fault;
};

using PairFn = void (*)(const Args&, const int64_t*, int64_t, int);

template <int64_t T>
void pair_portable(const Args& a, const int64_t* n, int64_t m0, int rows) {
    constexpr int kW = Layout<T>::kWeights;
    float acc[kPair][kMaxRows] = {};
    WBlock w[kPair];
    for (int64_t b = 0; b < a.K / kW; ++b) {
        for (int g = 0; g < kPair; ++g) {
            const uint8_t* row = a.w + n[g] * a.row_bytes;
            decode_scales<T>(row, b, a.fault, w[g]);
            decode_quants_portable<T>(row + b * Layout<T>::kBytes, w[g]);
        }
        for (int m = 0; m < rows; ++m) {
            const float dx = a.acts->d[(m0 + m) * (a.K / kW) + b];
            for (int g = 0; g < kPair; ++g)
                acc[g][m] = acc[g][m] + block_term<T>(w[g], dot_portable<T>(w[g], *a.acts, m0 + m, b), dx);
        }
    }
    for (int g = 0; g < kPair; ++g)
        for (int m = 0; m < rows; ++m)
            a.out[(m0 + m) * a.N + n[g]] = a.bias ? acc[g][m] + a.bias[n[g]] : acc[g][m];
}

#if QUANT_INT8_X86

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,f16c")

// Vector decoding of the quants (integers: any correct code gives the portable path's bytes).
template <int64_t T>
void decode_quants_avx(const uint8_t* blk, WBlock& w) {
    const __m256i low4 = _mm256_set1_epi8(0xf);
    if constexpr (T == kQ4_K) {
        for (int i = 0; i < 4; ++i) {
            const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16 + 32 * i));
            _mm256_store_si256(reinterpret_cast<__m256i*>(w.q + 64 * i), _mm256_and_si256(v, low4));
            _mm256_store_si256(reinterpret_cast<__m256i*>(w.q + 64 * i + 32),
                               _mm256_and_si256(_mm256_srli_epi16(v, 4), low4));
        }
    } else if constexpr (T == kQ6_K) {
        const __m512i m4 = _mm512_set1_epi8(0xf), m2 = _mm512_set1_epi8(3);
        for (int h = 0; h < 2; ++h) {
            const __m512i ql = _mm512_loadu_si512(blk + 64 * h);
            const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * h));
            // bytes r < 32: qh bits 0-1 / 4-5; bytes 32..63: qh bits 2-3 / 6-7
            const __m512i qh2 = _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1);
            const __m512i hi0 = _mm512_slli_epi16(_mm512_and_si512(qh2, m2), 4);
            const __m512i hi1 = _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh2, 4), m2), 4);
            _mm512_store_si512(w.q + 128 * h, _mm512_or_si512(_mm512_and_si512(ql, m4), hi0));
            _mm512_store_si512(w.q + 128 * h + 64,
                               _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4), hi1));
        }
    } else if constexpr (T == kQ8_0) {
        std::memcpy(w.q, blk + 2, 32);
    } else {  // Q4_1 and Q5_0: 16 bytes of nibbles, weights j (low) and j + 16 (high)
        const __m128i m4 = _mm_set1_epi8(0xf);
        const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + (T == kQ4_1 ? 4 : 6)));
        __m128i lo = _mm_and_si128(v, m4), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m4);
        if constexpr (T == kQ5_0) {  // weight j's fifth bit is bit j of qh
            uint32_t qh;
            std::memcpy(&qh, blk + 2, 4);
            const __m128i bit4 = _mm_set1_epi8(16);
            lo = _mm_mask_add_epi8(lo, __mmask16(qh & 0xffff), lo, bit4);
            hi = _mm_mask_add_epi8(hi, __mmask16(qh >> 16), hi, bit4);
        }
        _mm_store_si128(reinterpret_cast<__m128i*>(w.q), lo);
        _mm_store_si128(reinterpret_cast<__m128i*>(w.q + 16), hi);
    }
}

int32_t hsum8(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

int32_t hsum4(__m128i s) {
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

// Per weight block, the int16 scale vectors each 64-weight chunk multiplies its pair sums by.
struct KScales {
    __m512i sc[4];
    __m128i mn;
};

// The fields of block b, read with F16C (exact) and vector shuffles: the values decode_scales gives, plus the
// int16 scale vectors each 64-weight chunk multiplies its pair sums by (Q4_K: chunk i = sub-blocks 2i, 2i + 1,
// 16 pair sums each; Q6_K: chunk i = sub-blocks 4i .. 4i + 3, 8 pair sums each).
float half_hw(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

template <int64_t T>
void decode_scales_avx(const uint8_t* row, int64_t b, bool fault, WBlock& w, KScales& k) {
    const uint8_t* blk = row + b * Layout<T>::kBytes;
    if constexpr (T == kQ4_K) {
        w.d = half_hw(blk), w.d2 = half_hw(blk + 2);
        uint32_t u[4];  // llama.cpp's unpacking: bytes 0-7 the 8 scales, bytes 8-15 the 8 mins
        std::memcpy(u, blk + 4, 12);
        u[3] = ((u[2] >> 4) & 0x0f0f0f0f) | (((u[1] >> 6) & 0x03030303) << 4);
        const uint32_t mins_lo = u[1] & 0x3f3f3f3f;
        u[1] = (u[2] & 0x0f0f0f0f) | (((u[0] >> 6) & 0x03030303) << 4);
        u[2] = mins_lo;
        u[0] &= 0x3f3f3f3f;
        uint8_t* bytes = reinterpret_cast<uint8_t*>(u);
        if (fault) bytes[kFaultSub] = bytes[kFaultSub - 1];
        const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(u));
        const __m128i sc = _mm_cvtepu8_epi16(v), mn = _mm_cvtepu8_epi16(_mm_srli_si128(v, 8));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(w.sc), sc);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(w.mn), mn);
        k.mn = mn;
        const __m512i all = _mm512_castsi128_si512(sc);
        for (int i = 0; i < 4; ++i)
            k.sc[i] = _mm512_permutexvar_epi16(
                _mm512_inserti64x4(_mm512_set1_epi16(2 * i), _mm256_set1_epi16(2 * i + 1), 1), all);
    } else {
        w.d = half_hw(blk + 208);
        alignas(16) int8_t raw[16];
        std::memcpy(raw, blk + 192, 16);
        if (fault) raw[kFaultSub] = raw[kFaultSub - 1];
        const __m256i sc = _mm256_cvtepi8_epi16(_mm_load_si128(reinterpret_cast<const __m128i*>(raw)));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(w.sc), sc);
        const __m512i all = _mm512_castsi256_si512(sc);
        for (int i = 0; i < 4; ++i) {
            const __m512i idx = _mm512_set_epi64(0x0001000100010001LL * (4 * i + 3), 0x0001000100010001LL * (4 * i + 3),
                                                 0x0001000100010001LL * (4 * i + 2), 0x0001000100010001LL * (4 * i + 2),
                                                 0x0001000100010001LL * (4 * i + 1), 0x0001000100010001LL * (4 * i + 1),
                                                 0x0001000100010001LL * (4 * i), 0x0001000100010001LL * (4 * i));
            k.sc[i] = _mm512_permutexvar_epi16(idx, all);
        }
    }
}

template <int64_t T, bool kVnniOps>
Ints dot_k(const WBlock& w, const KScales& k, const Acts& a, int64_t m, int64_t b) {
    const int8_t* x = a.q.data() + m * a.K + b * 256;
    __m512i acc = _mm512_setzero_si512();
    for (int i = 0; i < 4; ++i) {
        const __m512i pairs = _mm512_maddubs_epi16(_mm512_load_si512(w.q + 64 * i), _mm512_loadu_si512(x + 64 * i));
        if constexpr (kVnniOps)
            acc = _mm512_dpwssd_epi32(acc, pairs, k.sc[i]);
        else
            acc = _mm512_add_epi32(acc, _mm512_madd_epi16(pairs, k.sc[i]));
    }
    if constexpr (T == kQ4_K) {
        const __m128i s32 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a.s32.data() + m * (a.K / 32) + b * 8));
        return {_mm512_reduce_add_epi32(acc), hsum4(_mm_madd_epi16(k.mn, s32))};
    } else {
        const __m256i s16 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.s16.data() + m * (a.K / 16) + b * 16));
        const __m256i sc = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.sc));
        const __m256i corr = _mm256_slli_epi32(_mm256_madd_epi16(sc, s16), 5);  // 32 * sc[j] * s16[j]
        return {_mm512_reduce_add_epi32(acc) - hsum8(corr), 0};
    }
}

template <int64_t T, bool kVnniOps>
Ints dot_32(const WBlock& w, const Acts& a, int64_t m, int64_t b) {
    const int8_t* x = a.q.data() + m * a.K + b * 32;
    const int32_t s32 = a.s32[m * (a.K / 32) + b];
    const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
    const __m256i wv = _mm256_load_si256(reinterpret_cast<const __m256i*>(w.q));
    int32_t S;
    if constexpr (kVnniOps) {
        // vpdpbusd wants unsigned weights: Q8_0's q + 128 (the sign bit flipped), corrected by 128 * s32.
        const __m256i wu = T == kQ8_0 ? _mm256_xor_si256(wv, _mm256_set1_epi8(char(0x80))) : wv;
        S = hsum8(_mm256_dpbusd_epi32(_mm256_setzero_si256(), wu, xv));
        if constexpr (T == kQ8_0) S -= 128 * s32;
    } else if constexpr (T == kQ8_0) {
        S = hsum8(_mm256_add_epi32(
            _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(wv)), _mm256_cvtepi8_epi16(_mm256_castsi256_si128(xv))),
            _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_extracti128_si256(wv, 1)),
                              _mm256_cvtepi8_epi16(_mm256_extracti128_si256(xv, 1)))));
    } else {
        S = hsum8(_mm256_madd_epi16(_mm256_maddubs_epi16(wv, xv), _mm256_set1_epi16(1)));
    }
    if constexpr (T == kQ5_0) S -= 16 * s32;
    return {S, s32};
}

// R rows, a compile-time count: the row loop unrolls and the per-row integers stay in registers.
template <int64_t T, bool kVnniOps, int R>
void pair_avx(const Args& a, const int64_t* n, int64_t m0, int) {
    constexpr int kW = Layout<T>::kWeights;
    constexpr bool kK = kW == 256;
    float acc[kPair][kMaxRows] = {};
    WBlock w[kPair];
    KScales ks[kPair];
    for (int64_t b = 0; b < a.K / kW; ++b) {
        for (int g = 0; g < kPair; ++g) {
            const uint8_t* row = a.w + n[g] * a.row_bytes;
            if constexpr (kK) {
                decode_scales_avx<T>(row, b, a.fault, w[g], ks[g]);
            } else {
                w[g].d = half_hw(row + (a.fault && b % 8 == kFaultSub ? b - 1 : b) * Layout<T>::kBytes);
                if constexpr (T == kQ4_1) w[g].d2 = half_hw(row + b * Layout<T>::kBytes + 2);
            }
            decode_quants_avx<T>(row + b * Layout<T>::kBytes, w[g]);
        }
        for (int m = 0; m < R; ++m) {
            const float dx = a.acts->d[(m0 + m) * (a.K / kW) + b];
            for (int g = 0; g < kPair; ++g) {
                Ints v;
                if constexpr (kK)
                    v = dot_k<T, kVnniOps>(w[g], ks[g], *a.acts, m0 + m, b);
                else
                    v = dot_32<T, kVnniOps>(w[g], *a.acts, m0 + m, b);
                acc[g][m] = acc[g][m] + block_term<T>(w[g], v, dx);
            }
        }
    }
    for (int g = 0; g < kPair; ++g)
        for (int m = 0; m < R; ++m)
            a.out[(m0 + m) * a.N + n[g]] = a.bias ? acc[g][m] + a.bias[n[g]] : acc[g][m];
}

template <int64_t T, bool kVnniOps, int... Rs>
constexpr PairFn kAvxPairs[] = {nullptr, pair_avx<T, kVnniOps, Rs>...};  // indexed by row count

#pragma GCC pop_options

#endif  // QUANT_INT8_X86

// Which vector paths this CPU runs: bit 0 AVX512-VNNI (with BW and VL), bit 1 AVX-512BW (with VL). Asked of
// the CPU (CPUID and the OS's XSAVE state, through GCC's builtins), never assumed.
int64_t features() {
#if QUANT_INT8_X86
    static const int64_t f = [] {
        __builtin_cpu_init();
        const bool bw = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("f16c");
        return int64_t(bw && __builtin_cpu_supports("avx512vnni")) | (int64_t(bw) << 1);
    }();
    return f;
#else
    return 0;
#endif
}

template <int64_t T>
void run(const Args& a, int64_t path) {
    const PairFn portable[kMaxRows + 1] = {nullptr, pair_portable<T>, pair_portable<T>, pair_portable<T>,
                                           pair_portable<T>, pair_portable<T>, pair_portable<T>, pair_portable<T>,
                                           pair_portable<T>, pair_portable<T>, pair_portable<T>, pair_portable<T>,
                                           pair_portable<T>, pair_portable<T>, pair_portable<T>, pair_portable<T>,
                                           pair_portable<T>};
    const PairFn* fns = portable;
#if QUANT_INT8_X86
    if (path == kVnni) fns = kAvxPairs<T, true, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16>;
    if (path == kBw) fns = kAvxPairs<T, false, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16>;
#endif
    const int64_t num_pairs = (a.N + 1) / kPair;
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < num_pairs; ++p) {
        // An odd N's last pair computes its one weight row twice: same work, one code path.
        const int64_t n[kPair] = {kPair * p, std::min(kPair * p + 1, a.N - 1)};
        for (int64_t m0 = 0; m0 < a.M; m0 += kMaxRows) {
            const int rows = int(std::min<int64_t>(kMaxRows, a.M - m0));
            fns[rows](a, n, m0, rows);
        }
    }
}

std::pair<int64_t, int64_t> layout(int64_t qtype) {
    switch (qtype) {
        case kQ4_1: return {Layout<kQ4_1>::kWeights, Layout<kQ4_1>::kBytes};
        case kQ5_0: return {Layout<kQ5_0>::kWeights, Layout<kQ5_0>::kBytes};
        case kQ8_0: return {Layout<kQ8_0>::kWeights, Layout<kQ8_0>::kBytes};
        case kQ4_K: return {Layout<kQ4_K>::kWeights, Layout<kQ4_K>::kBytes};
        case kQ6_K: return {Layout<kQ6_K>::kWeights, Layout<kQ6_K>::kBytes};
        default: return {0, 0};
    }
}

// path: 0 = the best this CPU has (VNNI, else BW, else portable); 1 = VNNI, 2 = BW (errors where missing);
// 3 = portable.
at::Tensor quant_int8_linear(const at::Tensor& x, const at::Tensor& blocks, int64_t qtype, int64_t in_features,
                             const std::optional<at::Tensor>& bias, int64_t path) {
    const auto [weights, bytes] = layout(qtype);
    TORCH_CHECK(weights > 0, "quant_int8_linear: unsupported GGML type ", qtype);
    TORCH_CHECK(x.scalar_type() == at::kFloat && x.device().is_cpu(), "quant_int8_linear: x must be fp32 on the CPU");
    TORCH_CHECK(blocks.scalar_type() == at::kByte && blocks.dim() == 2 && blocks.is_contiguous() &&
                    blocks.device().is_cpu(),
                "quant_int8_linear: blocks must be a contiguous uint8 [out, bytes_per_row] CPU tensor");
    TORCH_CHECK(in_features > 0 && in_features % weights == 0, "quant_int8_linear: in_features ", in_features,
                " is not a multiple of the block size ", weights);
    TORCH_CHECK(blocks.size(1) == in_features / weights * bytes, "quant_int8_linear: ", blocks.size(1),
                " bytes per row, the type needs ", in_features / weights * bytes);
    TORCH_CHECK(x.size(-1) == in_features, "quant_int8_linear: x has ", x.size(-1), " features, the weight ",
                in_features);
    const int64_t n = blocks.size(0);
    if (bias) {
        TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->dim() == 1 && bias->size(0) == n &&
                        bias->is_contiguous() && bias->device().is_cpu(),
                    "quant_int8_linear: bias must be a contiguous fp32 [out] CPU tensor");
    }
    TORCH_CHECK(path >= kAuto && path <= kPortable, "quant_int8_linear: path is 0 (auto), 1 (VNNI), 2 (BW) or 3 "
                                                    "(portable)");
    TORCH_CHECK(path != kVnni || (features() & 1), "quant_int8_linear: this CPU has no AVX512-VNNI");
    TORCH_CHECK(path != kBw || (features() & 2), "quant_int8_linear: this CPU has no AVX-512BW");
    if (path == kAuto) path = (features() & 1) ? kVnni : (features() & 2) ? kBw : kPortable;

    const at::Tensor rows = x.reshape({-1, in_features}).contiguous();  // [M, K]
    at::Tensor out = at::empty({rows.size(0), n}, x.options());        // [M, N]
    Acts acts;
    const int64_t M = rows.size(0);
    if (M > 0 && n > 0) {
        quantize(rows.data_ptr<float>(), M, in_features, weights, g_fault == kFaultShared, acts);
        const Args a{&acts, blocks.data_ptr<uint8_t>(), bias ? bias->data_ptr<float>() : nullptr,
                     out.data_ptr<float>(), M, in_features, n, blocks.size(1), g_fault == kFaultScale};
        switch (qtype) {
            case kQ4_1: run<kQ4_1>(a, path); break;
            case kQ5_0: run<kQ5_0>(a, path); break;
            case kQ8_0: run<kQ8_0>(a, path); break;
            case kQ4_K: run<kQ4_K>(a, path); break;
            case kQ6_K: run<kQ6_K>(a, path); break;
        }
    }
    std::vector<int64_t> sizes = x.sizes().vec();
    sizes.back() = n;
    return out.view(sizes);
}

}  // namespace

extern "C" {
// For the tests' negative controls only: 1 misreads one sub-block scale, 2 shares activation scales across rows.
void specdecode_quant_int8_fault(int mode) { g_fault = mode; }
}

TORCH_LIBRARY_FRAGMENT(specdecode, m) {
    m.def("quant_int8_linear(Tensor x, Tensor blocks, int qtype, int in_features, Tensor? bias=None, int path=0)"
          " -> Tensor");
    m.def("quant_int8_features() -> int", &features);
}

TORCH_LIBRARY_IMPL(specdecode, CPU, m) { m.impl("quant_int8_linear", &quant_int8_linear); }
