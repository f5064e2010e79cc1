// specdecode::quant_int8_linear(x [..., K], blocks [N, bytes_per_row], qtype, K, bias?, path) -> [..., N] and
// specdecode::quant_int8_grouped_linear (K-quants; its own definition is further down, before the op): the
// "fast" arithmetic. y ~= x @ dequant(W)^T (+ bias) with W kept as the raw GGUF blocks of Q4_1, Q5_0 or Q8_0
// (ggml's type numbers; Q4_K and Q6_K take the grouped op) and the activations quantized to int8, as llama.cpp's
// CPU kernels do. It is NOT the dequantized model's product (that is quant_rows.cpp's); it is this fixed arithmetic:
//
// 1. Activations. Each row of x is quantized on its own, per block of QB consecutive values: QB = 32 for the
//    32-weight types (Q4_1, Q5_0, Q8_0), QB = 256 (one super-block) for Q4_K and Q6_K. For a block x[0..QB):
//      amax = max |x[i]|;  dx = amax / 127.0f (fp32 division);
//      q[i] = 0 if dx == 0, else clamp(round_half_even(x[i] / dx), -127, 127)   (fp32 division, int8 result).
//    Non-finite x are undefined.
// 2. Lanes. The K positions of a row fall in chunks of 64 (k = 64 c + p, p = 0..63); position p of every chunk
//    belongs to lane l = p / 4 (16 lanes, four positions each). Per chunk (the two blocks 2c, 2c + 1, lanes 0-7
//    and 8-15; a missing last block adds nothing) each lane l gets one exact integer I[l], the sum over its
//    positions of
//      Q4_1: q4 * x      Q5_0: (q5 - 16) * x      Q8_0: q8 * x (q8 signed)
//    where x is the position's activation quant; and, for Q4_1, s[l] = the sum of x over the lane's positions.
// 3. fp32, per lane, in this order, each operation rounded to fp32 (fma: one rounding), starting from acc = +0,
//    with d, m the weight block's fp16 fields converted exactly, dx the activation block's scale of the lane's
//    positions and float() int32 -> fp32 round-to-nearest-even:
//      acc = fma(float(I), d * dx, acc)
//      Q4_1: acc = fma(float(s), m * dx, acc)
//    for chunks c = 0, 1, 2, ... in increasing order; then the 16 lanes are summed by the tree
//    acc_i += acc_{i+8} (i < 8), acc_i += acc_{i+4} (i < 4), acc_i += acc_{i+2} (i < 2), acc_0 + acc_1; then
//    + bias[n] if there is a bias.
//
// This is llama.cpp's shape of the work: integer dot products inside a block, fp32 scales applied lane-wise, one
// horizontal sum per output. The integers are exact whatever instructions compute them (VNNI's vpdpbusd, or
// AVX-512BW's vpmaddubsw and vpmaddwd, where no int16 pair sum can saturate: a quant <= 31 times |x| <= 127,
// twice, or |q8| <= 128 against the sign-adjusted x), and the fp32 steps are the same operations on every path,
// so the AVX512-VNNI, AVX-512BW and portable scalar paths give identical bits. A row's quantization and sums
// never read another row, so its output is bitwise the same alone or in any batch.
//
// Work: every activation row is quantized once per call, before the threads start. Threads split groups of 1, 2
// or 4 weight rows (more at fewer activation rows, so that enough independent chains are in flight); each weight
// chunk is decoded once into registers and meets every activation row of the call, up to 8 at a time (a template
// argument, so the row loop unrolls), before the next chunk.
//
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

constexpr int kLanes = 16;
constexpr int kChunk = 64;    // positions per chunk: 16 lanes of 4
constexpr int kMaxRows = 8;   // activation rows per pass over a weight chunk
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
    int64_t K = 0, stride = 0, QB = 0;  // stride: K rounded up to a chunk; the padding quants are 0
    std::vector<int8_t> q;      // [rows, stride]
    std::vector<float> d;       // [rows, K / QB]
    std::vector<float> dl;      // [rows, stride / 4]: each lane position group's dx (32-weight types; 0 in padding)
    std::vector<int32_t> s4;    // [rows, stride / 4]: the sum of the quants of each group of 4 positions
    std::vector<int32_t> off;   // [rows, stride / 4]: -(s4 << offset_shift), the offset a lane's integer starts from
    std::vector<int16_t> s16;   // [rows, K / 16]
    std::vector<int16_t> s32;   // [rows, K / 32]
};

// One block's dx and quants, as step 1 defines them (the portable code every path's result must equal).
float quantize_block_portable(const float* x, int64_t n, float shared_amax, bool shared, int8_t* q) {
    float amax = 0.0f;
    for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float dx = (shared ? shared_amax : amax) / 127.0f;
    if (dx != 0.0f) {
        for (int64_t i = 0; i < n; ++i) {
            const float r = std::nearbyint(x[i] / dx);  // the default rounding mode: half to even
            q[i] = int8_t(std::min(127.0f, std::max(-127.0f, r)));
        }
    }
    return dx;
}

#if QUANT_INT8_X86
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw")
// The same block with AVX-512: max, division and rounding are exact operations, so the bits are the portable ones.
float quantize_block_avx(const float* x, int64_t n, float shared_amax, bool shared, int8_t* q) {
    __m512 m = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(x + i)));
    const float dx = (shared ? shared_amax : _mm512_reduce_max_ps(m)) / 127.0f;
    if (dx != 0.0f) {
        const __m512 vdx = _mm512_set1_ps(dx), lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
        for (int64_t i = 0; i < n; i += 16) {
            const __m512 r = _mm512_roundscale_ps(_mm512_div_ps(_mm512_loadu_ps(x + i), vdx),
                                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i),
                             _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_min_ps(hi, _mm512_max_ps(lo, r)))));
        }
    }
    return dx;
}
#pragma GCC pop_options
#endif

// offset_shift: Q5_0's quants are stored + 16 (shift 4), Q8_0's go to VNNI + 128 (shift 7); the lane integers
// start from -(s4 << shift) instead of subtracting it after the dot product (the same integers). < 0: no offsets.
void quantize(const float* x, int64_t rows, int64_t K, int64_t QB, bool shared, bool vector, int offset_shift,
              Acts& a) {
    a.K = K, a.QB = QB, a.stride = (K + kChunk - 1) / kChunk * kChunk;
    const int64_t nb = K / QB, groups = a.stride / 4;
    a.q.assign(rows * a.stride, 0);
    a.d.assign(rows * nb, 0.0f);
    a.dl.assign(rows * groups, 0.0f);
    a.s4.assign(rows * groups, 0);
    a.off.assign(offset_shift >= 0 ? rows * groups : 0, 0);
    a.s16.assign(rows * (K / 16), 0);
    a.s32.assign(rows * (K / 32), 0);
    for (int64_t b = 0; b < nb; ++b) {
        float batch_amax = 0.0f;  // only the shared-scale fault reads it
        for (int64_t m = 0; shared && m < rows; ++m)
            for (int64_t i = 0; i < QB; ++i) batch_amax = std::max(batch_amax, std::fabs(x[m * K + b * QB + i]));
        for (int64_t m = 0; m < rows; ++m) {
            const float* xb = x + m * K + b * QB;
            int8_t* qb = a.q.data() + m * a.stride + b * QB;
#if QUANT_INT8_X86
            if (vector) {
                a.d[m * nb + b] = quantize_block_avx(xb, QB, batch_amax, shared, qb);
                continue;
            }
#endif
            a.d[m * nb + b] = quantize_block_portable(xb, QB, batch_amax, shared, qb);
        }
    }
    for (int64_t m = 0; m < rows; ++m) {
        const int8_t* q = a.q.data() + m * a.stride;
        for (int64_t g = 0; g < groups; ++g) {
            a.s4[m * groups + g] = q[4 * g] + q[4 * g + 1] + q[4 * g + 2] + q[4 * g + 3];
            if (4 * g < K) a.dl[m * groups + g] = a.d[m * nb + 4 * g / QB];
            if (offset_shift >= 0) a.off[m * groups + g] = -(a.s4[m * groups + g] * (1 << offset_shift));
        }
        for (int64_t c = 0; c < K / 16; ++c)
            a.s16[m * (K / 16) + c] = int16_t(a.s4[m * groups + 4 * c] + a.s4[m * groups + 4 * c + 1] +
                                              a.s4[m * groups + 4 * c + 2] + a.s4[m * groups + 4 * c + 3]);
        for (int64_t c = 0; c < K / 32; ++c)
            a.s32[m * (K / 32) + c] = int16_t(a.s16[m * (K / 16) + 2 * c] + a.s16[m * (K / 16) + 2 * c + 1]);
    }
}

// ---- weights: the scalar fields and the quants in natural order (the portable decoding) ----

// One weight block: fields and quants as stored (q: Q4_1 0..15; Q5_0 0..31, the value + 16; Q8_0 signed).
struct WBlock {
    int32_t q[32];
    float d = 0, d2 = 0;  // d; and m (Q4_1)
};

// The fp16 scale of 32-weight block b of a row: its own, or under the fault its neighbour's.
template <int64_t T>
float block_d(const uint8_t* row, int64_t b, bool fault) {
    return half_to_float(row + (fault && b % 8 == kFaultSub ? b - 1 : b) * Layout<T>::kBytes);
}

template <int64_t T>
void decode_portable(const uint8_t* row, int64_t b, bool fault, WBlock& w) {
    const uint8_t* blk = row + b * Layout<T>::kBytes;
    if constexpr (T == kQ8_0) {
        w.d = block_d<T>(row, b, fault);
        for (int i = 0; i < 32; ++i) w.q[i] = int8_t(blk[2 + i]);
    } else if constexpr (T == kQ5_0) {
        w.d = block_d<T>(row, b, fault);
        uint32_t qh;
        std::memcpy(&qh, blk + 2, 4);
        for (int j = 0; j < 16; ++j) {
            w.q[j] = (blk[6 + j] & 0xf) | (((qh >> j) & 1) << 4);
            w.q[j + 16] = (blk[6 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
        }
    } else {
        w.d = block_d<T>(row, b, fault), w.d2 = half_to_float(blk + 2);
        for (int j = 0; j < 16; ++j) w.q[j] = blk[4 + j] & 0xf, w.q[j + 16] = blk[4 + j] >> 4;
    }
}

struct Args {
    const Acts* acts;
    const uint8_t* w;    // [N, row_bytes]
    const float* bias;   // [N] or nullptr
    float* out;          // [M, N]
    int64_t M, K, N, row_bytes;
    bool fault;
};

// The fixed tree of step 3, then the bias.
float reduce_lanes(const float* acc, float bias) {
    float v[kLanes];
    std::memcpy(v, acc, sizeof v);
    for (int width = kLanes / 2; width >= 1; width /= 2)
        for (int i = 0; i < width; ++i) v[i] = v[i] + v[i + width];
    return v[0] + bias;
}

// ---- the portable path: steps 2 and 3 written out per lane ----

template <int64_t T>
void row_portable(const Args& a, int64_t n, int64_t m) {
    const Acts& A = *a.acts;
    const uint8_t* row = a.w + n * a.row_bytes;
    const int8_t* x = A.q.data() + m * A.stride;
    const int64_t groups = A.stride / 4;
    float acc[kLanes] = {};
    WBlock w, w2;
    {
        const int64_t nb = a.K / 32;
        for (int64_t c = 0; c < (nb + 1) / 2; ++c) {
            const bool two = 2 * c + 1 < nb;
            decode_portable<T>(row, 2 * c, a.fault, w);
            if (two) decode_portable<T>(row, 2 * c + 1, a.fault, w2);
            for (int l = 0; l < kLanes; ++l) {
                const bool second = l >= 8;
                const WBlock& wb = second ? w2 : w;
                int32_t I = 0;
                float d = 0.0f, d2 = 0.0f;
                if (!second || two) {
                    for (int t = 0; t < 4; ++t) {
                        const int p = 4 * (l % 8) + t;
                        const int32_t q = T == kQ5_0 ? wb.q[p] - 16 : wb.q[p];
                        I += q * x[64 * c + 32 * second + p];
                    }
                    d = wb.d, d2 = wb.d2;
                }
                const float dl = A.dl[m * groups + 16 * c + l];
                acc[l] = std::fma(float(I), d * dl, acc[l]);
                if constexpr (T == kQ4_1) acc[l] = std::fma(float(A.s4[m * groups + 16 * c + l]), d2 * dl, acc[l]);
            }
        }
    }
    a.out[m * a.N + n] = reduce_lanes(acc, a.bias ? a.bias[n] : 0.0f);
}

// ---- the vector paths (AVX512-VNNI, or AVX-512BW without it): the same integers and fp32 operations ----
#if QUANT_INT8_X86

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,f16c")

float half_hw(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

// The lane sums of u * s (u unsigned <= 63, s signed: no int16 pair sum saturates).
template <bool V>
__m512i dot_quads(__m512i u, __m512i s) {
    if constexpr (V) return _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, s);
    else return _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1));
}

// Nibbles in natural order from bytes laid out twice: each 16-bit lane shifted right by its count in `shifts`
// (0 or 4), then the low nibble of every byte.
__m512i nibbles(__m512i twice, __m512i shifts) {
    return _mm512_and_si512(_mm512_srlv_epi16(twice, shifts), _mm512_set1_epi8(0xf));
}
constexpr long long kBy4 = 0x0004000400040004LL;
// 32-weight types: blocks a, b's 16 bytes laid out [a, a, b, b] -> a's 32 weights, then b's.
__m512i quarters_shift() { return _mm512_setr_epi64(0, 0, kBy4, kBy4, 0, 0, kBy4, kBy4); }

// The G weight rows from n0, clamped to the last row (the duplicates compute the same value), and their bytes.
template <int G>
void weight_rows(const Args& a, int64_t n0, int64_t* n, const uint8_t** w) {
    for (int g = 0; g < G; ++g) n[g] = std::min(n0 + g, a.N - 1), w[g] = a.w + n[g] * a.row_bytes;
}

// Step 3's tree over each accumulator's 16 lanes, then the bias, into the outputs.
template <int G, int R>
void store_outputs(const Args& a, const int64_t* n, int64_t m0, const __m512 (&acc)[G][R]) {
    for (int g = 0; g < G; ++g)
        for (int m = 0; m < R; ++m) {
            alignas(64) float v[kLanes];
            _mm512_store_ps(v, acc[g][m]);
            a.out[(m0 + m) * a.N + n[g]] = reduce_lanes(v, a.bias ? a.bias[n[g]] : 0.0f);
        }
}

// ---- 32-weight types: chunk c = blocks 2c (lanes 0-7) and 2c + 1 (lanes 8-15) ----

// [lo] * 8 then [hi] * 8 (AVX-512F only: insertf32x8 would need DQ).
__m512 halves(float lo, float hi) {
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_set1_ps(lo)), _mm256_castps_pd(_mm256_set1_ps(hi)), 1));
}

struct Chunk32 {
    __m512i q;   // the quants as the lane dot takes them
    __m512 d, m; // the blocks' d (and Q4_1's m) per lane; 0 for a missing block
};

template <int64_t T, bool V>
Chunk32 chunk32(const uint8_t* row, int64_t c, int64_t nb, bool fault) {
    constexpr int kB = Layout<T>::kBytes;
    const bool two = 2 * c + 1 < nb;
    const uint8_t* a = row + 2 * c * kB;
    const uint8_t* b = two ? a + kB : a;  // read but zeroed below when missing
    Chunk32 k;
    const float da = half_hw(row + (fault && (2 * c) % 8 == kFaultSub ? 2 * c - 1 : 2 * c) * kB);
    const float db = two ? half_hw(row + (fault && (2 * c + 1) % 8 == kFaultSub ? 2 * c : 2 * c + 1) * kB) : 0.0f;
    k.d = halves(da, db);
    const __mmask64 keep = two ? ~__mmask64(0) : __mmask64(0xffffffffULL);
    if constexpr (T == kQ8_0) {
        const __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 2))),
                                             _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2)), 1);
        k.q = _mm512_maskz_mov_epi8(keep, q);  // signed; VNNI's vpdpbusd takes q + 128, the sign bit flipped
        if constexpr (V) k.q = _mm512_xor_si512(k.q, _mm512_set1_epi8(char(0x80)));
    } else {
        constexpr int off = T == kQ4_1 ? 4 : 6;
        const __m512i both = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + off)))),
            _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + off))), 1);
        __m512i q = nibbles(both, quarters_shift());
        if constexpr (T == kQ5_0) {  // weight j's fifth bit is qh bit j
            uint32_t ha, hb;
            std::memcpy(&ha, a + 2, 4);
            std::memcpy(&hb, b + 2, 4);
            q = _mm512_mask_add_epi8(q, _cvtu64_mask64(uint64_t(ha) | (uint64_t(hb) << 32)), q, _mm512_set1_epi8(16));
        }
        k.q = _mm512_maskz_mov_epi8(keep, q);
        if constexpr (T == kQ4_1)
            k.m = halves(half_hw(a + 2), two ? half_hw(b + 2) : 0.0f);
    }
    return k;
}

// Step 2's lane integers of one chunk against one activation row (x its 64 quants; off its lane offsets, see
// quantize: Q5_0, and Q8_0 on VNNI).
template <int64_t T, bool V>
__m512i lane_ints(__m512i q, __m512i x, __m512i off) {
    if constexpr (T == kQ8_0) {
        if constexpr (V) return _mm512_dpbusd_epi32(off, q, x);  // q + 128 (see chunk32), from -128 * the lane sum
        // |q| against x with q's sign: pair sums <= 2 * 128 * 127, no saturation
        const __m512i xs = _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(q), _mm512_setzero_si512(), x);
        return _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_abs_epi8(q), xs), _mm512_set1_epi16(1));
    } else if constexpr (T == kQ5_0) {
        if constexpr (V) return _mm512_dpbusd_epi32(off, q, x);  // (q5 + 16) * x from -16 * the lane sum
        return _mm512_add_epi32(off, dot_quads<V>(q, x));
    } else {
        return dot_quads<V>(q, x);
    }
}

template <int64_t T, bool V, int G, int R>
void block32_rows(const Args& a, int64_t n0, int64_t m0) {
    const Acts& A = *a.acts;
    const int64_t nb = a.K / 32, groups = A.stride / 4;
    const uint8_t* w[G];
    int64_t n[G];
    weight_rows<G>(a, n0, n, w);
    __m512 acc[G][R];
    for (int g = 0; g < G; ++g)
        for (int m = 0; m < R; ++m) acc[g][m] = _mm512_setzero_ps();
    for (int64_t c = 0; c < (nb + 1) / 2; ++c) {
        Chunk32 k[G];
        for (int g = 0; g < G; ++g) k[g] = chunk32<T, V>(w[g], c, nb, a.fault);
        for (int m = 0; m < R; ++m) {
            const int64_t row = m0 + m;
            const __m512i x = _mm512_loadu_si512(A.q.data() + row * A.stride + 64 * c);
            // Q4_1: the lane sums s4; Q5_0 (and Q8_0 on VNNI): the lane offsets
            constexpr bool kOff = T == kQ5_0 || (T == kQ8_0 && V);
            const __m512i s = T == kQ4_1 || kOff ? _mm512_loadu_si512((kOff ? A.off : A.s4).data() + row * groups + 16 * c)
                                                 : _mm512_setzero_si512();
            const __m512 dl = _mm512_loadu_ps(A.dl.data() + row * groups + 16 * c);
            for (int g = 0; g < G; ++g) {
                const __m512i I = lane_ints<T, V>(k[g].q, x, s);
                acc[g][m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I), _mm512_mul_ps(k[g].d, dl), acc[g][m]);
                if constexpr (T == kQ4_1)
                    acc[g][m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(k[g].m, dl), acc[g][m]);
            }
        }
    }
    store_outputs<G, R>(a, n, m0, acc);
}

template <int64_t T, bool V, int G, int R>
void rows_avx(const Args& a, int64_t n0, int64_t m0) {
    block32_rows<T, V, G, R>(a, n0, m0);
}

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

using RowsFn = void (*)(const Args&, int64_t, int64_t);

// Weight rows per task: 4 at 1-2 activation rows, 2 at 3-5, else 1 (the rows then give the independent chains;
// passes then hold 4-8 rows each). 2 rather than 1 at 4-5 rows: 20-30% faster on Q4_K; 4 rather than 2 at 2 rows:
// 0.62 -> 0.40 ms for 8960 x 1536 Q4_K (one thread, 2-core AMD EPYC).
constexpr int group_for(int rows) { return rows <= 2 ? 4 : rows <= 5 ? 2 : 1; }

#if QUANT_INT8_X86
// The function for `rows` activation rows at weight group G: the pairs run_avx asks for (G = 4: 1-2 rows; G = 2:
// 3-5 rows; G = 1: passes of 6-8 rows, or 4-8 when a call has more than 8), so that only those are compiled.
template <int64_t T, bool V>
RowsFn pick(int group, int rows) {
    static constexpr RowsFn one[kMaxRows + 1] = {nullptr,
                                                 nullptr,
                                                 nullptr,
                                                 nullptr,
                                                 rows_avx<T, V, 1, 4>,
                                                 rows_avx<T, V, 1, 5>,
                                                 rows_avx<T, V, 1, 6>,
                                                 rows_avx<T, V, 1, 7>,
                                                 rows_avx<T, V, 1, 8>};
    if (group == 4) return rows == 1 ? rows_avx<T, V, 4, 1> : rows_avx<T, V, 4, 2>;
    if (group == 2) {
        static constexpr RowsFn two[6] = {nullptr, nullptr, rows_avx<T, V, 2, 2>, rows_avx<T, V, 2, 3>,
                                          rows_avx<T, V, 2, 4>, rows_avx<T, V, 2, 5>};
        return two[rows];
    }
    return one[rows];
}

template <int64_t T, bool V>
void run_avx(const Args& a) {
    const int G = group_for(int(std::min<int64_t>(a.M, kMaxRows)));
    const int64_t tasks = (a.N + G - 1) / G;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < tasks; ++t) {
        // Passes of near-equal rows (9 = 5 + 4, not 8 + 1: a lone row would run one dependent chain); the task's
        // weight rows stay in L1 for the later passes.
        const int64_t passes = (a.M + kMaxRows - 1) / kMaxRows;
        for (int64_t p = 0, m0 = 0; p < passes; ++p) {
            const int rows = int((a.M - m0 + (passes - p) - 1) / (passes - p));
            pick<T, V>(G, rows)(a, t * G, m0);
            m0 += rows;
        }
    }
}
#endif

template <int64_t T>
void run(const Args& a, int64_t path) {
#if QUANT_INT8_X86
    if (path == kVnni) return run_avx<T, true>(a);
    if (path == kBw) return run_avx<T, false>(a);
#endif
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < a.N; ++n)
        for (int64_t m = 0; m < a.M; ++m) row_portable<T>(a, n, m);
}

std::pair<int64_t, int64_t> layout(int64_t qtype) {
    switch (qtype) {
        case kQ4_1: return {Layout<kQ4_1>::kWeights, Layout<kQ4_1>::kBytes};
        case kQ5_0: return {Layout<kQ5_0>::kWeights, Layout<kQ5_0>::kBytes};
        case kQ8_0: return {Layout<kQ8_0>::kWeights, Layout<kQ8_0>::kBytes};
        default: return {0, 0};  // K-quants: quant_int8_grouped_linear
    }
}

// path: 0 = the best this CPU has (VNNI, else BW, else portable); 1 = VNNI, 2 = BW (errors where missing);
// 3 = portable.
at::Tensor quant_int8_linear(const at::Tensor& x, const at::Tensor& blocks, int64_t qtype, int64_t in_features,
                             const std::optional<at::Tensor>& bias, int64_t path) {
    const auto [weights, bytes] = layout(qtype);
    TORCH_CHECK(qtype != kQ4_K && qtype != kQ6_K, "quant_int8_linear: K-quants (GGML type ", qtype,
                ") take quant_int8_grouped_linear over grouped rows (models/kquant_groups.py)");
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
        const int offset_shift = qtype == kQ5_0 ? 4 : qtype == kQ8_0 && path == kVnni ? 7 : -1;
        quantize(rows.data_ptr<float>(), M, in_features, weights, g_fault == kFaultShared, path != kPortable,
                 offset_shift, acts);
        const Args a{&acts, blocks.data_ptr<uint8_t>(), bias ? bias->data_ptr<float>() : nullptr,
                     out.data_ptr<float>(), M, in_features, n, blocks.size(1), g_fault == kFaultScale};
        switch (qtype) {
            case kQ4_1: run<kQ4_1>(a, path); break;
            case kQ5_0: run<kQ5_0>(a, path); break;
            case kQ8_0: run<kQ8_0>(a, path); break;
        }
    }
    std::vector<int64_t> sizes = x.sizes().vec();
    sizes.back() = n;
    return out.view(sizes);
}

// ---- K-quants, grouped (models/kquant_groups.py): 16 weight rows per group, one per lane ----
//
// specdecode::quant_int8_grouped_linear(x [..., K], groups [G, K / 256 * group_bytes], qtype, K, N, bias?, path)
// -> [..., N], N <= 16 G. The activations are quantized as step 1 defines (per 256-value super-block). For output
// n, row m and super-block b, with q the weight's stored quants (Q4_K 0..15; Q6_K 0..63, the value + 32), x the
// activation quants, sc/mn the sub-block scales and mins, s16/s32 the sums of x over 16/32 positions:
//   Q4_K: I = sum_j sc[j] * sum_{t in j} q[t] x[t]  (j: 8 sub-blocks of 32);  Mn = sum_j mn[j] * s32[j]
//   Q6_K: I = sum_j sc[j] * (sum_{t in j} q[t] x[t] - 32 * s16[j])  (j: 16 sub-blocks of 16)
// exact integers (int32 holds them), then in fp32, each operation rounded (fma: once), from acc = +0, for
// b = 0, 1, 2, ... in order:
//   acc = fma(float(I), d * dx, acc);   Q4_K also: acc = fma(float(Mn), -(dmin * dx), acc)
// and y = acc (+ bias[n]). float(): int32 -> fp32 round-to-nearest-even. A row's quantization and sums never read
// another row, and every path (VNNI, AVX-512BW, portable) computes these same integers and fp32 operations, so a
// row's output is bitwise the same alone or in any batch, on any path.
//
// Work: the threads split the groups; a group's super-block meets up to 6 activation rows at a time (passes of
// near-equal size), so that each weight byte is loaded and unpacked once per pass. In a pass every integer
// dot product (vpdpbusd, or vpmaddubsw + vpmaddwd) is 16 rows x 4 positions, its activation operand the row's 4
// quants broadcast.

constexpr int kGroupRows = 16, kMaxPass = 6;
constexpr int64_t kQ4KGroupBytes = 2368, kQ6KGroupBytes = 4384;

struct GArgs {
    const Acts* acts;
    const uint8_t* w;   // [G, nb * group_bytes]
    const float* bias;  // [N] or nullptr
    float* out;         // [M, N]
    int64_t M, K, N, G;
    bool fault;
};

// Sub-block j's scale row under the fault: sub-block 5 reads sub-block 4's scales.
inline int scale_row(int j, bool fault) { return fault && j == kFaultSub ? j - 1 : j; }

void grouped_portable(const GArgs& a, int64_t qtype) {
    const Acts& A = *a.acts;
    const int64_t nb = a.K / 256;
    const int64_t gbytes = qtype == kQ4_K ? kQ4KGroupBytes : kQ6KGroupBytes;
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < a.N; ++n) {
        const int64_t g = n / kGroupRows, r = n % kGroupRows;
        for (int64_t m = 0; m < a.M; ++m) {
            const int8_t* x = A.q.data() + m * A.stride;
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; ++b) {
                const uint8_t* blk = a.w + (g * nb + b) * gbytes;
                const float dx = A.d[m * nb + b];
                const int8_t* xb = x + 256 * b;
                int32_t I = 0, Mn = 0;
                if (qtype == kQ4_K) {
                    for (int j = 0; j < 8; ++j) {
                        const int i = j / 2, h = j % 2;
                        int32_t S = 0;
                        for (int k = 0; k < 8; ++k)
                            for (int t = 0; t < 4; ++t) {
                                const uint8_t byte = blk[320 + ((i * 8 + k) * kGroupRows + r) * 4 + t];
                                S += int32_t(h ? byte >> 4 : byte & 0xf) * xb[64 * i + 32 * h + 4 * k + t];
                            }
                        I += int32_t(blk[64 + scale_row(j, a.fault) * kGroupRows + r]) * S;
                        Mn += int32_t(blk[192 + j * kGroupRows + r]) * A.s32[m * (a.K / 32) + 8 * b + j];
                    }
                    acc = std::fma(float(I), half_to_float(blk + 2 * r) * dx, acc);
                    acc = std::fma(float(Mn), -(half_to_float(blk + 32 + 2 * r) * dx), acc);
                } else {
                    for (int j = 0; j < 16; ++j) {
                        int32_t S = -32 * int32_t(A.s16[m * (a.K / 16) + 16 * b + j]);
                        for (int k = 0; k < 4; ++k)
                            for (int t = 0; t < 4; ++t)
                                S += int32_t(blk[288 + ((4 * j + k) * kGroupRows + r) * 4 + t]) * xb[16 * j + 4 * k + t];
                        I += int32_t(int8_t(blk[32 + scale_row(j, a.fault) * kGroupRows + r])) * S;
                    }
                    acc = std::fma(float(I), half_to_float(blk + 2 * r) * dx, acc);
                }
            }
            a.out[m * a.N + n] = a.bias ? acc + a.bias[n] : acc;
        }
    }
}

#if QUANT_INT8_X86
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,f16c")

// acc + the 16 lane sums of u * s over 4 bytes (u unsigned <= 63, s signed: no int16 pair sum saturates).
template <bool V>
inline __m512i dp4(__m512i acc, __m512i u, __m512i s) {
    if constexpr (V) return _mm512_dpbusd_epi32(acc, u, s);
    else return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1)));
}

// 4 activation quants from p in every lane (a broadcast load the dot product can take as its memory operand).
typedef int32_t __attribute__((may_alias, aligned(1))) unaligned_i32;
inline __m512i quad(const int8_t* p) { return _mm512_set1_epi32(*reinterpret_cast<const unaligned_i32*>(p)); }

inline __m512i u8_lanes(const uint8_t* p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline __m512i i8_lanes(const uint8_t* p) { return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline __m512 half_lanes(const uint8_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }

// One super-block of a Q4_K group against R activation rows (x[m]: the row's quants of this super-block):
// I and Mn of every lane, as the header above defines them.
template <bool V, int R>
inline void q4k_block(const uint8_t* blk, const int8_t* const (&x)[R], const int16_t* const (&s32)[R], bool fault,
                      __m512i (&I)[R], __m512i (&Mn)[R]) {
    const __m512i m4 = _mm512_set1_epi8(0xf);
    for (int m = 0; m < R; ++m) I[m] = _mm512_setzero_si512(), Mn[m] = _mm512_setzero_si512();
    for (int i = 0; i < 4; ++i) {
        __m512i lo[R], hi[R];  // sub-blocks 2i and 2i + 1
        for (int m = 0; m < R; ++m) lo[m] = _mm512_setzero_si512(), hi[m] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int k = 0; k < 8; ++k) {
            const __m512i v = _mm512_loadu_si512(blk + 320 + (i * 8 + k) * 64);
            const __m512i wl = _mm512_and_si512(v, m4), wh = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
            for (int m = 0; m < R; ++m) {
                lo[m] = dp4<V>(lo[m], wl, quad(x[m] + 64 * i + 4 * k));
                hi[m] = dp4<V>(hi[m], wh, quad(x[m] + 64 * i + 32 + 4 * k));
            }
        }
        const __m512i sl = u8_lanes(blk + 64 + scale_row(2 * i, fault) * 16);
        const __m512i sh = u8_lanes(blk + 64 + scale_row(2 * i + 1, fault) * 16);
        for (int m = 0; m < R; ++m)
            I[m] = _mm512_add_epi32(I[m], _mm512_add_epi32(_mm512_mullo_epi32(lo[m], sl), _mm512_mullo_epi32(hi[m], sh)));
    }
    for (int j = 0; j < 8; ++j) {
        const __m512i mn = u8_lanes(blk + 192 + j * 16);
        for (int m = 0; m < R; ++m) Mn[m] = _mm512_add_epi32(Mn[m], _mm512_mullo_epi32(mn, _mm512_set1_epi32(s32[m][j])));
    }
}

// One super-block of a Q6_K group against R activation rows: I of every lane.
template <bool V, int R>
inline void q6k_block(const uint8_t* blk, const int8_t* const (&x)[R], const int16_t* const (&s16)[R], bool fault,
                      __m512i (&I)[R]) {
    for (int m = 0; m < R; ++m) I[m] = _mm512_setzero_si512();
    for (int j = 0; j < 16; j += 2) {  // two sub-blocks at a time: two chains per row
        __m512i S0[R], S1[R];
        for (int m = 0; m < R; ++m)
            S0[m] = _mm512_set1_epi32(-32 * int32_t(s16[m][j])), S1[m] = _mm512_set1_epi32(-32 * int32_t(s16[m][j + 1]));
#pragma GCC unroll 4
        for (int k = 0; k < 4; ++k) {
            const __m512i w0 = _mm512_loadu_si512(blk + 288 + (4 * j + k) * 64);
            const __m512i w1 = _mm512_loadu_si512(blk + 288 + (4 * j + 4 + k) * 64);
            for (int m = 0; m < R; ++m) {
                S0[m] = dp4<V>(S0[m], w0, quad(x[m] + 16 * j + 4 * k));
                S1[m] = dp4<V>(S1[m], w1, quad(x[m] + 16 * j + 16 + 4 * k));
            }
        }
        const __m512i c0 = i8_lanes(blk + 32 + scale_row(j, fault) * 16);
        const __m512i c1 = i8_lanes(blk + 32 + scale_row(j + 1, fault) * 16);
        for (int m = 0; m < R; ++m)
            I[m] = _mm512_add_epi32(I[m], _mm512_add_epi32(_mm512_mullo_epi32(S0[m], c0), _mm512_mullo_epi32(S1[m], c1)));
    }
}

// Group g (16 outputs) x activation rows m0 .. m0 + R.
template <int64_t T, bool V, int R>
void grouped_rows(const GArgs& a, int64_t g, int64_t m0) {
    const Acts& A = *a.acts;
    const int64_t nb = a.K / 256;
    constexpr int64_t kBytes = T == kQ4_K ? kQ4KGroupBytes : kQ6KGroupBytes;
    __m512 acc[R];
    for (int m = 0; m < R; ++m) acc[m] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = a.w + (g * nb + b) * kBytes;
        const int8_t* x[R];
        const int16_t* sums[R];
        for (int m = 0; m < R; ++m) {
            x[m] = A.q.data() + (m0 + m) * A.stride + 256 * b;
            sums[m] = T == kQ4_K ? A.s32.data() + (m0 + m) * (a.K / 32) + 8 * b : A.s16.data() + (m0 + m) * (a.K / 16) + 16 * b;
        }
        __m512i I[R], Mn[R];
        if constexpr (T == kQ4_K) q4k_block<V, R>(blk, x, sums, a.fault, I, Mn);
        else q6k_block<V, R>(blk, x, sums, a.fault, I);
        const __m512 d = half_lanes(blk);
        for (int m = 0; m < R; ++m) {
            const __m512 dx = _mm512_set1_ps(A.d[(m0 + m) * nb + b]);
            acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I[m]), _mm512_mul_ps(d, dx), acc[m]);
            if constexpr (T == kQ4_K) {  // -(dmin * dx) == (-dmin) * dx exactly
                const __m512 ndmin = _mm512_sub_ps(_mm512_setzero_ps(), half_lanes(blk + 32));
                acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(Mn[m]), _mm512_mul_ps(ndmin, dx), acc[m]);
            }
        }
    }
    const int64_t n0 = g * kGroupRows;
    const __mmask16 keep = __mmask16((1u << std::min<int64_t>(kGroupRows, a.N - n0)) - 1);
    const __m512 bias = a.bias ? _mm512_maskz_loadu_ps(keep, a.bias + n0) : _mm512_setzero_ps();
    for (int m = 0; m < R; ++m)
        _mm512_mask_storeu_ps(a.out + (m0 + m) * a.N + n0, keep, a.bias ? _mm512_add_ps(acc[m], bias) : acc[m]);
}

template <int64_t T, bool V>
void grouped_avx(const GArgs& a) {
    using Fn = void (*)(const GArgs&, int64_t, int64_t);
    static constexpr Fn by_rows[kMaxPass + 1] = {nullptr,
                                                 grouped_rows<T, V, 1>,
                                                 grouped_rows<T, V, 2>,
                                                 grouped_rows<T, V, 3>,
                                                 grouped_rows<T, V, 4>,
                                                 grouped_rows<T, V, 5>,
                                                 grouped_rows<T, V, 6>};
    const int64_t passes = (a.M + kMaxPass - 1) / kMaxPass;
#pragma omp parallel for schedule(static)
    for (int64_t g = 0; g < a.G; ++g) {
        for (int64_t p = 0, m0 = 0; p < passes; ++p) {  // near-equal passes; the group's bytes stay in cache
            const int rows = int((a.M - m0 + (passes - p) - 1) / (passes - p));
            by_rows[rows](a, g, m0);
            m0 += rows;
        }
    }
}

#pragma GCC pop_options
#endif  // QUANT_INT8_X86

at::Tensor quant_int8_grouped_linear(const at::Tensor& x, const at::Tensor& groups, int64_t qtype, int64_t in_features,
                                     int64_t out_features, const std::optional<at::Tensor>& bias, int64_t path) {
    TORCH_CHECK(qtype == kQ4_K || qtype == kQ6_K, "quant_int8_grouped_linear: Q4_K or Q6_K, not GGML type ", qtype);
    TORCH_CHECK(x.scalar_type() == at::kFloat && x.device().is_cpu(), "quant_int8_grouped_linear: x must be fp32 on the CPU");
    TORCH_CHECK(in_features > 0 && in_features % 256 == 0, "quant_int8_grouped_linear: in_features ", in_features,
                " is not a multiple of 256");
    const int64_t gbytes = qtype == kQ4_K ? kQ4KGroupBytes : kQ6KGroupBytes;
    const int64_t G = (out_features + kGroupRows - 1) / kGroupRows;
    TORCH_CHECK(groups.scalar_type() == at::kByte && groups.dim() == 2 && groups.is_contiguous() && groups.device().is_cpu() &&
                    groups.size(0) == G && groups.size(1) == in_features / 256 * gbytes,
                "quant_int8_grouped_linear: groups must be a contiguous uint8 [", G, ", ", in_features / 256 * gbytes,
                "] CPU tensor (models/kquant_groups.py)");
    TORCH_CHECK(x.size(-1) == in_features, "quant_int8_grouped_linear: x has ", x.size(-1), " features, the weight ",
                in_features);
    if (bias) {
        TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->dim() == 1 && bias->size(0) == out_features &&
                        bias->is_contiguous() && bias->device().is_cpu(),
                    "quant_int8_grouped_linear: bias must be a contiguous fp32 [out] CPU tensor");
    }
    TORCH_CHECK(path >= kAuto && path <= kPortable, "quant_int8_grouped_linear: path is 0 (auto), 1 (VNNI), 2 (BW) or 3 "
                                                    "(portable)");
    TORCH_CHECK(path != kVnni || (features() & 1), "quant_int8_grouped_linear: this CPU has no AVX512-VNNI");
    TORCH_CHECK(path != kBw || (features() & 2), "quant_int8_grouped_linear: this CPU has no AVX-512BW");
    if (path == kAuto) path = (features() & 1) ? kVnni : (features() & 2) ? kBw : kPortable;

    const at::Tensor rows = x.reshape({-1, in_features}).contiguous();  // [M, K]
    at::Tensor out = at::empty({rows.size(0), out_features}, x.options());  // [M, N]
    const int64_t M = rows.size(0);
    if (M > 0 && out_features > 0) {
        Acts acts;
        quantize(rows.data_ptr<float>(), M, in_features, 256, g_fault == kFaultShared, path != kPortable, -1, acts);
        const GArgs a{&acts, groups.data_ptr<uint8_t>(), bias ? bias->data_ptr<float>() : nullptr, out.data_ptr<float>(),
                      M, in_features, out_features, G, g_fault == kFaultScale};
#if QUANT_INT8_X86
        if (path != kPortable) {
            const bool v = path == kVnni;
            if (qtype == kQ4_K) v ? grouped_avx<kQ4_K, true>(a) : grouped_avx<kQ4_K, false>(a);
            else v ? grouped_avx<kQ6_K, true>(a) : grouped_avx<kQ6_K, false>(a);
        } else
#endif
            grouped_portable(a, qtype);
    }
    std::vector<int64_t> sizes = x.sizes().vec();
    sizes.back() = out_features;
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
    m.def("quant_int8_grouped_linear(Tensor x, Tensor groups, int qtype, int in_features, int out_features, "
          "Tensor? bias=None, int path=0) -> Tensor");
    m.def("quant_int8_features() -> int", &features);
}

TORCH_LIBRARY_IMPL(specdecode, CPU, m) {
    m.impl("quant_int8_linear", &quant_int8_linear);
    m.impl("quant_int8_grouped_linear", &quant_int8_grouped_linear);
}
