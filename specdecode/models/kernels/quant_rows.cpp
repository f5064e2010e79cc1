// specdecode::quant_rows_linear(x [..., K], blocks [N, bytes_per_row], qtype, K, bias?, path) -> [..., N]:
// y = x @ dequant(W)^T (+ bias) for a few rows of fp32 activations, with W kept as the raw GGUF blocks of one
// of Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K (ggml's type numbers). Each block of each weight row is decoded once per
// call for up to 12 activation rows (6 on the AVX2 path), so a verify of several tokens reads the quantized bytes
// once.
//
// Exactness. A block decodes to exactly the fp32 values gguf.quants.dequantize gives (the same fp16 -> fp32
// conversions, the same products and sums in numpy's order, each rounded to fp32; every product there is exact
// in fp32, an fp16 d times an 8-bit scale times a 6-bit quant at most, so only Q4_1's + m and Q4_K's - dmin * min
// round; the vector paths compute those two as one fma of the exact product, the same single rounding). The dot
// product of a weight row with an activation row is then one fixed
// order, whatever the path, the number of rows or the threads:
//   lane j (0..15) accumulates acc_j = fma(x[k], w[k], acc_j) for k = j, j + 16, j + 32, ... in increasing k,
//   starting from +0; then the 16 lanes are summed by the tree acc_i += acc_{i+8} (i < 8), acc_i += acc_{i+4}
//   (i < 4), acc_i += acc_{i+2} (i < 2), acc_0 + acc_1; then + bias[n] if there is a bias.
// Three paths follow it and give the same bits: AVX-512 (16 lanes in one register), AVX2 (the same 16 lanes as two
// 8-wide halves, for CPUs without AVX-512: AMD's before Zen 4, Intel's client ones since Alder Lake) and the
// portable one (std::fma, for any other CPU). The op's path 0 takes the first of them the CPU has, at run time; a
// row's output does not depend on the rows beside it.
//
// Work (AVX-512): threads take groups of 2-4 weight rows (more for fewer activation rows); each 16-weight chunk
// is decoded into a register and meets every activation row (in blocks of 12) in 16-wide FMAs before the next.
// A thread's groups are one stream of bytes, and each block asks for the next group's block ahead of use.
// AVX2 the same with 16 registers, not 32: two 8-lane halves a chunk, groups of 2 weight rows at one activation row
// and 1 beyond, blocks of at most 6 rows, and weights decoded by arithmetic where AVX-512 looks them up in a
// 16-entry table (AVX2 has no 16-entry permute).
// The portable path takes pairs of weight rows, decoded a block at a time into a small buffer.
//
// specdecode::quant_rows_embedding(ids [...], blocks [V, bytes_per_row], qtype, dim) -> [..., dim]: the rows ids
// of the same kind of table (a GGUF token embedding), each decoded to the fp32 values gguf.quants.dequantize gives.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <type_traits>

// The AVX-512 and AVX2 paths need x86-64 and GCC's target pragma; elsewhere (or with -DSPECDECODE_PORTABLE_ONLY)
// only the portable path is built.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(SPECDECODE_PORTABLE_ONLY)
#define QUANT_ROWS_X86 1
#include <immintrin.h>
#else
#define QUANT_ROWS_X86 0
#endif

namespace {

enum QType : int64_t { kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ8_0 = 8, kQ4_K = 12, kQ6_K = 14 };

template <int64_t T>
struct Layout;  // weights and bytes per block, as gguf.constants.GGML_QUANT_SIZES
template <>
struct Layout<kQ4_0> { static constexpr int kWeights = 32, kBytes = 18; };  // d fp16; 16 bytes of nibbles
template <>
struct Layout<kQ4_1> { static constexpr int kWeights = 32, kBytes = 20; };  // d, m fp16; 16 bytes of nibbles
template <>
struct Layout<kQ5_0> { static constexpr int kWeights = 32, kBytes = 22; };  // d fp16; 32 high bits; nibbles
template <>
struct Layout<kQ8_0> { static constexpr int kWeights = 32, kBytes = 34; };  // d fp16; 32 int8
template <>
struct Layout<kQ4_K> { static constexpr int kWeights = 256, kBytes = 144; };  // d, dmin; 12 scale bytes; nibbles
template <>
struct Layout<kQ6_K> { static constexpr int kWeights = 256, kBytes = 210; };  // ql 128, qh 64, 16 int8 scales, d

constexpr int kLanes = 16;    // one AVX-512 register of fp32, two AVX2 ones
constexpr int kMaxRows = 12;  // 12 rows x 2 weight rows = 24 accumulators of AVX-512's 32 registers
constexpr int kPair = 2;      // weight rows per task: each activation load feeds two FMAs
// The fault a negative control injects (specdecode_quant_rows_fault): one sub-block's scale is read from its
// neighbour, sub-block 5 of each K-quant super-block or every block b with b % 8 == 5 of a 32-weight type.
constexpr int kFaultSub = 5;
int g_fault = 0;
// Whether the AVX-512 path's few-row calls prefetch into L2, two tasks ahead (see prefetch): on AMD's CPUs. The AVX2
// path keeps L1 (not measured on the CPUs that run it).
#if defined(__x86_64__) && defined(__GNUC__)
const bool g_l2 = (__builtin_cpu_init(), __builtin_cpu_is("amd"));
#else
const bool g_l2 = false;
#endif

struct Args {
    const float* x;         // [M, K]
    const uint8_t* w;       // [N, row_bytes]
    const float* bias;      // [N] or nullptr
    float* out;             // [M, N]
    int64_t M, K, N, row_bytes;
    bool fault;
    bool l2;  // the CPU's prefetches pay into L2 (g_l2; see prefetch)
};

// Exact fp16 -> fp32 (normals, subnormals, infinities, NaN), read unaligned.
float half_to_float(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    const uint32_t sign = uint32_t(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    uint32_t bits;
    if (exp == 0) {
        const float mag = float(mant) * 0x1p-24f;  // a subnormal half is mant * 2^-24, exact in fp32
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

// The byte offset of block b's scale (d) in a 32-weight row: its own, or under the fault its neighbour's.
template <int64_t T>
int64_t scale_block(int64_t b, bool fault) {
    return (fault && b % 8 == kFaultSub ? b - 1 : b) * Layout<T>::kBytes;
}

// ---- the portable path: block b of a weight row -> its kWeights fp32 values, as numpy computes them ----

template <int64_t T>
void decode_portable(const uint8_t* row, int64_t b, bool fault, float* w);

template <>
void decode_portable<kQ8_0>(const uint8_t* row, int64_t b, bool fault, float* w) {
    const uint8_t* blk = row + b * 34;
    const float d = half_to_float(row + scale_block<kQ8_0>(b, fault));
    for (int i = 0; i < 32; ++i) w[i] = float(int8_t(blk[2 + i])) * d;
}

template <>
void decode_portable<kQ5_0>(const uint8_t* row, int64_t b, bool fault, float* w) {
    const uint8_t* blk = row + b * 22;
    const float d = half_to_float(row + scale_block<kQ5_0>(b, fault));
    uint32_t qh;
    std::memcpy(&qh, blk + 2, 4);
    for (int j = 0; j < 16; ++j) {
        const int lo = (blk[6 + j] & 0xf) | (((qh >> j) & 1) << 4);
        const int hi = (blk[6 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
        w[j] = d * float(lo - 16);
        w[j + 16] = d * float(hi - 16);
    }
}

template <>
void decode_portable<kQ4_0>(const uint8_t* row, int64_t b, bool fault, float* w) {
    const uint8_t* blk = row + b * 18;
    const float d = half_to_float(row + scale_block<kQ4_0>(b, fault));
    for (int j = 0; j < 16; ++j) {  // d * (q - 8): an exact product
        w[j] = d * float((blk[2 + j] & 0xf) - 8);
        w[j + 16] = d * float((blk[2 + j] >> 4) - 8);
    }
}

template <>
void decode_portable<kQ4_1>(const uint8_t* row, int64_t b, bool fault, float* w) {
    const uint8_t* blk = row + b * 20;
    const float d = half_to_float(row + scale_block<kQ4_1>(b, fault)), m = half_to_float(blk + 2);
    for (int j = 0; j < 16; ++j) {
        w[j] = d * float(blk[4 + j] & 0xf) + m;  // two roundings: -ffp-contract=off
        w[j + 16] = d * float(blk[4 + j] >> 4) + m;
    }
}

template <>
void decode_portable<kQ4_K>(const uint8_t* row, int64_t b, bool fault, float* w) {
    const uint8_t* blk = row + b * 144;
    const float d = half_to_float(blk), dmin = half_to_float(blk + 2);
    for (int j = 0; j < 8; ++j) {
        int sc, mn, unused;
        q4k_scale_min(blk + 4, j, sc, mn);
        if (fault && j == kFaultSub) q4k_scale_min(blk + 4, j - 1, sc, unused);
        const float ds = d * float(sc), dm = dmin * float(mn);
        const uint8_t* q = blk + 16 + 32 * (j / 2);
        const int shift = 4 * (j % 2);
        for (int i = 0; i < 32; ++i) w[32 * j + i] = ds * float((q[i] >> shift) & 0xf) - dm;
    }
}

template <>
void decode_portable<kQ6_K>(const uint8_t* row, int64_t b, bool fault, float* w) {
    const uint8_t* blk = row + b * 210;
    const uint8_t *ql = blk, *qh = blk + 128;
    const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192);
    const float d = half_to_float(blk + 208);
    for (int l = 0; l < 256; ++l) {
        const int h = l / 128, r = l % 128, s = l / 16;
        const int lo = (ql[64 * h + r % 64] >> (4 * (r / 64))) & 0xf;
        const int hi = (qh[32 * h + r % 32] >> (2 * (r / 32))) & 3;
        const float ds = d * float(sc[fault && s == kFaultSub ? s - 1 : s]);
        w[l] = ds * float((lo | (hi << 4)) - 32);
    }
}

// The fixed reduction tree of 16 lanes (v is overwritten), then the bias: shared by every path, and inlined into each
// as it was when each spelled it out.
__attribute__((always_inline)) inline float lane_sum(float* v, const float* bias) {
    for (int width = kLanes / 2; width >= 1; width /= 2)
        for (int i = 0; i < width; ++i) v[i] = v[i] + v[i + width];
    return bias ? v[0] + *bias : v[0];
}

void finish(const Args& a, float (*acc)[kMaxRows][kLanes], const int64_t* n, int64_t m0, int rows) {
    for (int g = 0; g < kPair; ++g)
        for (int m = 0; m < rows; ++m)
            a.out[(m0 + m) * a.N + n[g]] = lane_sum(acc[g][m], a.bias ? a.bias + n[g] : nullptr);
}

template <int64_t T>
void pair_portable(const Args& a, const int64_t* n, int64_t m0, int rows) {
    constexpr int kW = Layout<T>::kWeights;
    float acc[kPair][kMaxRows][kLanes] = {};
    float w[kPair][kW];
    for (int64_t b = 0; b < a.K / kW; ++b) {
        for (int g = 0; g < kPair; ++g) decode_portable<T>(a.w + n[g] * a.row_bytes, b, a.fault, w[g]);
        for (int c = 0; c < kW; c += kLanes) {
            for (int m = 0; m < rows; ++m) {
                const float* xm = a.x + (m0 + m) * a.K + b * kW + c;
                for (int g = 0; g < kPair; ++g)
                    for (int j = 0; j < kLanes; ++j) acc[g][m][j] = std::fma(xm[j], w[g][c + j], acc[g][m][j]);
            }
        }
    }
    finish(a, acc, n, m0, rows);
}

// ---- the AVX-512 path: the same values and the same order, 16 lanes at a time ----
// Each 16-weight chunk is decoded straight into a register and meets every activation row before the next chunk
// is decoded (no store and reload through a buffer). A task takes G weight rows: one output's sum is a single
// chain of dependent FMAs (the defined order), so G x R independent chains (>= 4) keep the FMA unit busy.
// The 4-bit types decode through a 16-entry table per (sub-)block: table[q] = fma(scale, q, offset), which is
// numpy's value (scale * q is exact in fp32, so its one rounding is the one of `scale * q + offset`), and a
// chunk is one vpermps of its nibbles; Q5_0 through a 32-entry table, d * (q - 16), and one vpermt2ps.
// A block's header (fp16 scales by F16C, the K-quants' packed sub-block scales) is decoded with vector
// instructions once per block, where scalar code had run per block and sub-block: at one activation row that
// alone took 0.73-0.88x the time by type (before the prefetch below; experiments/quant_rows_ab.py).
#if QUANT_ROWS_X86

using RowsFn = void (*)(const Args&, int64_t, int64_t);  // (args, first weight row, first activation row)

// Ask for the next task's bytes (the G weight rows after these, a thread's tasks being one contiguous stream) at
// the offset this task has reached: without it the kernel waited on memory, streaming 5-11 GB/s from DRAM.
// On AMD (a.l2), where the loop waits on memory (l2_rows), two tasks ahead and into L2 (_MM_HINT_T1): into L1 a
// core's misses stayed few (its L1 miss buffers full), and the kernel's way through memory alone, 4 rows' blocks in
// turn, read 19-20 GB/s where one stream reads 28; into L2 it read 32-34. Elsewhere one task ahead into L1, as
// measured before.
// Up to how many activation rows a type's loop waits on memory, so that L2 prefetches pay. On the 2-core Zen 4 EPYC
// (2026-12-07, an earlier run of the A/B below, every row count prefetched into L2, not kept) that took: Q4_K and Q6_K 0.78-0.97x the time at 1-4 rows, ~1.0x beyond; the
// 0.5B's Q8_0 head 0.60x at one row and 0.76x at two, 1.07-1.28x at 3-9; Q4_1 and Q5_0, whose loops are held by their
// instructions, 1.02-1.06x at 1-2 rows and up to 1.31x beyond. With this table (and Scratch's fix), against the
// kernel before: Q4_K 0.80-0.94x at 1-9 rows, Q6_K 0.78-0.91x at 1-4, Q8_0 0.60x and 0.76x at 1 and 2, the others
// 0.98-1.02x (experiments.quant_rows_ab, results/quant_rows_ab_l2_zen4.json).
template <int64_t T>
constexpr int64_t l2_rows() {
    return T == kQ4_K || T == kQ6_K ? 4 : T == kQ8_0 ? 2 : 0;
}

// The hint is a template argument: chosen at run time (_mm_prefetch with T1 in an if, T0 in its else), GCC 12 at -O3
// dropped every prefetch of the kernel, and prefetches in asm slowed the loops they sat in.
template <int64_t T, bool L2>
void prefetch(const Args& a, const uint8_t* const* w, int groups, int64_t b) {
    constexpr int kBytes = Layout<T>::kBytes;
    const int64_t ahead = (L2 ? 2 : 1) * groups * a.row_bytes;
    for (int g = 0; g < groups; ++g) {
        const char* p = reinterpret_cast<const char*>(w[g] + ahead + b * kBytes);
        for (int off = 0; off < kBytes; off += 64) _mm_prefetch(p + off, L2 ? _MM_HINT_T1 : _MM_HINT_T0);
    }
}

#pragma GCC push_options
#pragma GCC target("avx512f,f16c")

__m512i load16_u8(const uint8_t* p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
__m512 iota16() { return _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15); }

// iota * (*s) + (*o), each scalar broadcast from memory inside its instruction ({1to16}): one rounding, the add's,
// as the product is exact in the 4-bit types' tables. A broadcast of its own is a shuffle, and shuffles (the
// permutes that look weights up, the byte widening) are what a 4-bit chunk's decoding waits on.
__m512 table16(const float* s, const float* o) {
    __m512 product, sum;
    asm("vmulps %1%{1to16%}, %2, %0" : "=v"(product) : "m"(*s), "v"(iota16()));
    asm("vaddps %1%{1to16%}, %2, %0" : "=v"(sum) : "m"(*o), "v"(product));
    return sum;
}

// Exact fp16 -> fp32 by the CPU's conversion (the same value as half_to_float for every finite half).
float half_f16c(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

// A Dec's memory outside itself (kScratch floats, 64-byte aligned, given by rows_avx): Q4_K's sub-block scales,
// which table16's asm reads as memory operands. Were they a member, the asm made the whole Dec addressable, and GCC
// stored its table and quant registers to the stack at every sub-block; with the task's accumulators addressable too
// (the final reduction's loop), it stored those before every asm as well: 77 zmm stores a block of 4 weight rows at
// one activation row, each taking 2 cycles on a Zen 4. Without them (8 stores) Q4_K took 0.92-0.96x the time at 1-9
// rows, the same bits (2-core AMD EPYC, 2026-12-07, a scratch A/B of this change alone, not kept).
template <class D, class = void>
struct Scratch { static constexpr int kFloats = 0; };
template <class D>
struct Scratch<D, std::void_t<decltype(D::kScratch)>> { static constexpr int kFloats = D::kScratch; };

// Per type: kSubs sub-blocks of kChunks chunks each per block; block() reads the block's header, sub() a
// sub-block's scale, chunk() the 16 weights (32 * j ... of sub-block j, chunk h) as fp32.
template <int64_t T>
struct Dec;

// A 32-weight 4-bit block (Q4_0, Q4_1): one 16-entry table of its values and its 16 bytes of nibbles.
struct Nibbles32 {
    static constexpr bool kAhead = false;
    static constexpr int kSubs = 1, kChunks = 2;
    __m512 table;
    __m512i bytes;
    void sub(int, bool) {}
    __m512 chunk(int, int h) const {  // weights 0..15 are the low nibbles, 16..31 the high ones
        return _mm512_permutexvar_ps(h ? _mm512_srli_epi32(bytes, 4) : bytes, table);
    }
};

template <>
struct Dec<kQ4_1> : Nibbles32 {
    void block(const uint8_t* row, int64_t b, bool fault) {
        const uint8_t* blk = row + b * 20;
        const float d = half_f16c(row + scale_block<kQ4_1>(b, fault)), m = half_f16c(blk + 2);
        table = _mm512_fmadd_ps(_mm512_set1_ps(d), iota16(), _mm512_set1_ps(m));  // d * q + m, one rounding
        bytes = load16_u8(blk + 4);
    }
};

template <>
struct Dec<kQ4_0> : Nibbles32 {
    void block(const uint8_t* row, int64_t b, bool fault) {
        // d * (q - 8), exact products: numpy's values (signed zeros too: d * 0 for q = 8)
        table = _mm512_mul_ps(_mm512_set1_ps(half_f16c(row + scale_block<kQ4_0>(b, fault))),
                              _mm512_sub_ps(iota16(), _mm512_set1_ps(8)));
        bytes = load16_u8(row + b * 18 + 2);
    }
};

template <>
struct Dec<kQ4_K> {
    static constexpr bool kAhead = false;
    static constexpr int kSubs = 8, kChunks = 2, kScratch = 16;
    const uint8_t* blk;
    float* scale;  // [16], 64-byte aligned: d * sc of sub-blocks 0..7, then -(dmin * mn) of the same
    __m512 table;
    __m512i bytes[2];  // the 32 bytes whose low nibbles are sub-block 2i and high nibbles 2i + 1
    void block(const uint8_t* row, int64_t b, bool fault) {
        blk = row + b * 144;
        // The 12 packed bytes s, one per lane (lanes 12..15 are unused): lanes 0..7 become sc_j, 8..15 mn_j, as
        // q4k_scale_min has them: j < 4: s[j] & 63 and s[j + 4] & 63; j >= 4: s[j + 4] & 15 | (s[j - 4] >> 6) << 4
        // and s[j + 4] >> 4 | (s[j] >> 6) << 4.
        const __m512i s = load16_u8(blk + 4);
        const __m512i low = _mm512_and_si512(
            _mm512_srlv_epi32(_mm512_permutexvar_epi32(_mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11), s),
                              _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4)),
            _mm512_setr_epi32(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 15, 15, 15, 15));
        const __m512i high = _mm512_maskz_slli_epi32(
            0xf0f0,
            _mm512_srli_epi32(_mm512_permutexvar_epi32(_mm512_setr_epi32(0, 0, 0, 0, 0, 1, 2, 3, 0, 0, 0, 0, 4, 5, 6, 7), s), 6),
            4);
        // d * sc and dmin * mn are exact (fp16 times 6 bits); (-dmin) * mn is -(dmin * mn), bit for bit
        const __m512 mult = _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(half_f16c(blk)), _mm512_set1_ps(-half_f16c(blk + 2)));
        _mm512_store_ps(scale, _mm512_mul_ps(mult, _mm512_cvtepi32_ps(_mm512_or_si512(low, high))));
        if (fault) scale[kFaultSub] = scale[kFaultSub - 1];
    }
    void sub(int j, bool few_rows) {
        // table[q] = round(d * sc * q - dmin * mn), numpy's value. At a few activation rows a table serves few FMAs
        // and its two broadcasts would take the shuffle unit from the lookups (Q4_K at 1-2 rows 0.89x the time with
        // them inside the instructions, on a Zen 4 EPYC); at more rows the compiler's own schedule was faster.
        table = few_rows ? table16(scale + j, scale + 8 + j)
                         : _mm512_fmadd_ps(_mm512_set1_ps(scale[j]), iota16(), _mm512_set1_ps(scale[8 + j]));
        if (j % 2 == 0) {
            bytes[0] = load16_u8(blk + 16 + 16 * j);
            bytes[1] = load16_u8(blk + 16 + 16 * j + 16);
        }
    }
    __m512 chunk(int j, int h) const { return _mm512_permutexvar_ps(j % 2 ? _mm512_srli_epi32(bytes[h], 4) : bytes[h], table); }
};

template <>
struct Dec<kQ8_0> {
    static constexpr bool kAhead = false;
    static constexpr int kSubs = 1, kChunks = 2;
    const uint8_t* blk;
    __m512 d;
    void block(const uint8_t* row, int64_t b, bool fault) {
        blk = row + b * 34;
        d = _mm512_set1_ps(half_f16c(row + scale_block<kQ8_0>(b, fault)));
    }
    void sub(int, bool) {}
    __m512 chunk(int, int h) const {
        const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2 + 16 * h));
        return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), d);
    }
};

template <>
struct Dec<kQ5_0> {
    static constexpr bool kAhead = false;
    static constexpr int kSubs = 1, kChunks = 2;
    __m512 low, high;  // d * (q - 16) for q = 0..15 and 16..31: exact products, numpy's values
    __m512i bytes;
    uint32_t qh;
    void block(const uint8_t* row, int64_t b, bool fault) {
        const uint8_t* blk = row + b * 22;
        const __m512 d = _mm512_set1_ps(half_f16c(row + scale_block<kQ5_0>(b, fault)));
        low = _mm512_mul_ps(d, _mm512_sub_ps(iota16(), _mm512_set1_ps(16)));
        high = _mm512_mul_ps(d, iota16());
        std::memcpy(&qh, blk + 2, 4);
        bytes = load16_u8(blk + 6);
    }
    void sub(int, bool) {}
    __m512 chunk(int, int h) const {  // weight j's fifth bit is qh bit j; it picks the table
        const __m512i q = h ? _mm512_srli_epi32(bytes, 4) : _mm512_and_si512(bytes, _mm512_set1_epi32(0xf));
        const __m512i q5 = _mm512_mask_or_epi32(q, __mmask16(h ? qh >> 16 : qh & 0xffff), q, _mm512_set1_epi32(16));
        return _mm512_permutex2var_ps(low, q5, high);
    }
};

template <>
struct Dec<kQ6_K> {
    static constexpr bool kAhead = true;
    static constexpr int kSubs = 16, kChunks = 1;
    alignas(64) float scale[16];  // d * sc[s], exact
    alignas(64) uint8_t q[256];   // the block's 6-bit quants in weight order
    __m512 ds;
    void block(const uint8_t* row, int64_t b, bool fault) {
        const uint8_t* blk = row + b * 210;
        const __m512i sc = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192)));
        _mm512_store_ps(scale, _mm512_mul_ps(_mm512_set1_ps(half_f16c(blk + 208)), _mm512_cvtepi32_ps(sc)));
        if (fault) scale[kFaultSub] = scale[kFaultSub - 1];
        // Weight 128 h + r: low 4 bits (ql[64 h + r % 64] >> 4 (r / 64)) & 15, high 2 bits
        // (qh[32 h + r % 32] >> 2 (r / 32)) & 3. Whole 64-byte registers at a time; 64-bit lane shifts, whose bits
        // that cross into a byte are masked off.
        const __m512i mask4 = _mm512_set1_epi8(0x0f), mask2 = _mm512_set1_epi8(0x03);
        for (int h = 0; h < 2; ++h) {
            const __m512i ql = _mm512_loadu_si512(blk + 64 * h);
            const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * h)));
            const __m512i hi_a = _mm512_and_si512(_mm512_srlv_epi64(qh, _mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2)), mask2);
            const __m512i hi_b = _mm512_and_si512(_mm512_srlv_epi64(qh, _mm512_setr_epi64(4, 4, 4, 4, 6, 6, 6, 6)), mask2);
            const __m512i a = _mm512_or_si512(_mm512_and_si512(ql, mask4), _mm512_slli_epi64(hi_a, 4));  // r < 64
            const __m512i c = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi64(ql, 4), mask4), _mm512_slli_epi64(hi_b, 4));
            _mm512_store_si512(q + 128 * h, a);
            _mm512_store_si512(q + 128 * h + 64, c);
        }
    }
    void sub(int s, bool) { ds = _mm512_set1_ps(scale[s]); }
    __m512 chunk(int s, int) const {
        // ds * (q - 32) as numpy has it (an fma with -32 ds would give +0 where numpy gives -0)
        return _mm512_mul_ps(ds, _mm512_cvtepi32_ps(_mm512_sub_epi32(load16_u8(q + 16 * s), _mm512_set1_epi32(32))));
    }
};

// The fixed reduction tree of one output's 16 lanes, then the bias.
float reduce(__m512 acc, const float* bias) {
    float v[kLanes];
    _mm512_storeu_ps(v, acc);
    return lane_sum(v, bias);
}

// G weight rows from n0 (clamped to the last row: the duplicates compute the same value) x R activation rows.
template <int64_t T, int G, int R, bool L2>
void rows_avx(const Args& a, int64_t n0, int64_t m0) {
    constexpr int kW = Layout<T>::kWeights;
    int64_t n[G];
    const uint8_t* w[G];
    for (int g = 0; g < G; ++g) {
        n[g] = std::min(n0 + g, a.N - 1);
        w[g] = a.w + n[g] * a.row_bytes;
    }
    __m512 acc[G][R];
    for (int g = 0; g < G; ++g)
        for (int m = 0; m < R; ++m) acc[g][m] = _mm512_setzero_ps();
    // A type whose block() stores what it decoded for chunk() to read back (Q6_K's quants and scales) decodes block
    // b + 1 while block b runs (dec[b % 2]): read back at once, the stores held up the reads (Q6_K at one row took
    // 1.2x the time on a 2-core AMD EPYC). The other types keep their block's state in registers: one Dec each.
    constexpr int kBuffers = Dec<T>::kAhead ? 2 : 1;
    Dec<T> dec[kBuffers][G];
    constexpr int kFloats = Scratch<Dec<T>>::kFloats;
    alignas(64) float scratch[kBuffers][G][kFloats > 0 ? kFloats : 1];
    if constexpr (kFloats > 0)
        for (int i = 0; i < kBuffers; ++i)
            for (int g = 0; g < G; ++g) dec[i][g].scale = scratch[i][g];
    const int64_t blocks = a.K / kW;
    if (kBuffers == 2)
        for (int g = 0; g < G; ++g) dec[0][g].block(w[g], 0, a.fault);
    const float* x = a.x + m0 * a.K;
    for (int64_t b = 0; b < blocks; ++b) {
        Dec<T>* now = dec[b % kBuffers];
        if (kBuffers == 1)
            for (int g = 0; g < G; ++g) now[g].block(w[g], b, a.fault);
        else if (b + 1 < blocks)
            for (int g = 0; g < G; ++g) dec[(b + 1) % kBuffers][g].block(w[g], b + 1, a.fault);
        prefetch<T, L2>(a, w, G, b);
#pragma GCC unroll 16
        for (int j = 0; j < Dec<T>::kSubs; ++j) {
            for (int g = 0; g < G; ++g) now[g].sub(j, R <= 4);
#pragma GCC unroll 2
            for (int h = 0; h < Dec<T>::kChunks; ++h) {
                const int64_t k = b * kW + kLanes * (j * Dec<T>::kChunks + h);
                __m512 wv[G];
                for (int g = 0; g < G; ++g) wv[g] = now[g].chunk(j, h);
#pragma GCC unroll 12
                for (int m = 0; m < R; ++m) {
                    const __m512 xm = _mm512_loadu_ps(x + m * a.K + k);
                    for (int g = 0; g < G; ++g) acc[g][m] = _mm512_fmadd_ps(xm, wv[g], acc[g][m]);
                }
            }
        }
    }
    // Q4_K's unrolled, so that acc is never addressed and never stored (see Scratch); unrolled, Q6_K ran 1.07-1.10x
    // slower at one row (a scratch A/B, not kept); no other type's asm makes acc addressable.
    if constexpr (T == kQ4_K) {
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g)
#pragma GCC unroll 12
            for (int m = 0; m < R; ++m) a.out[(m0 + m) * a.N + n[g]] = reduce(acc[g][m], a.bias ? a.bias + n[g] : nullptr);
    } else {
        for (int g = 0; g < G; ++g)
            for (int m = 0; m < R; ++m) a.out[(m0 + m) * a.N + n[g]] = reduce(acc[g][m], a.bias ? a.bias + n[g] : nullptr);
    }
}

#pragma GCC pop_options

// Weight rows per task for R activation rows: 4 up to 4 rows (at one row, 4 independent FMA chains), 2 beyond, which
// halves how often the activation rows are loaded per FMA (G = 4 past 4 rows runs out of registers). Measured on the
// 2-core AMD EPYC, ~100-190 MB of weights streamed from memory: G = 2 against the former G = 1 at 9 and 12 rows
// 0.63-0.73x the time for Q4_K, Q6_K and Q4_1; G = 4 against 2 at 4 rows 0.86-0.98x, at 5-6 rows 1.1-1.3x.
constexpr int group_for(int rows) { return rows <= 4 ? 4 : 2; }

template <int64_t T, int... Rs>
constexpr RowsFn kAvxRows[] = {nullptr, rows_avx<T, group_for(Rs), Rs, false>...};  // indexed by row count
template <int64_t T, int... Rs>  // where the CPU's prefetches pay into L2 (Args::l2)
constexpr RowsFn kAvxRowsL2[] = {nullptr, rows_avx<T, group_for(Rs), Rs, (Rs <= l2_rows<T>())>...};

template <int64_t T>
void run_avx512(const Args& a) {
    for (int64_t m0 = 0; m0 < a.M; m0 += kMaxRows) {
        const int rows = int(std::min<int64_t>(kMaxRows, a.M - m0));
        const RowsFn fn = a.l2 ? kAvxRowsL2<T, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12>[rows]
                               : kAvxRows<T, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12>[rows];
        const int64_t group = group_for(rows), tasks = (a.N + group - 1) / group;
#pragma omp parallel for schedule(static)
        for (int64_t t = 0; t < tasks; ++t) fn(a, t * group, m0);
    }
}

// ---- the AVX2 path: the same values and the same order, each 16-weight chunk as two 8-lane halves ----
// The AVX-512 path's structure (G weight rows x R activation rows a task, each chunk decoded once into registers and
// met by every row, the next task's bytes asked for ahead) with 16 registers instead of 32: a task's accumulators
// are 2 G R registers, so R is at most 6 a pass and G is 1 past one row (group_for). A chunk is decoded half by half
// (lanes 0-7, then 8-15), so that one register holds the weights being multiplied.
// AVX2 has no 16-entry permute (vpermps looks up 8), so a weight is decoded by arithmetic on its quant, as numpy
// computes it: Q8_0 q * d, Q4_0 d * (q - 8), Q5_0 d * (q - 16) and Q6_K (d * sc) * (q - 32), all exact products
// (as products, not as an fma of d * q and a negative offset, which would give +0 where numpy gives -0); Q4_1
// fma(d, q, m) and Q4_K fma(d * sc, q, -(dmin * mn)), whose products are exact, so that the fma's one rounding is
// numpy's `d * q + m`. The quants come as 8 bytes widened to 8 lanes; the K-quants' headers are decoded once per
// block with vector instructions, as on the AVX-512 path.
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

namespace avx2 {

constexpr int kMaxRows = 6;  // a pass: 6 rows x 2 halves = 12 accumulators of the 16 registers

__m128i load8(const void* p) { return _mm_loadl_epi64(static_cast<const __m128i*>(p)); }
__m256i widen_u8(const void* p) { return _mm256_cvtepu8_epi32(load8(p)); }  // 8 bytes -> 8 lanes
__m256i widen_i8(const void* p) { return _mm256_cvtepi8_epi32(load8(p)); }
// The low nibbles of 8 widened bytes, or (high) their high ones.
__m256i nibbles(__m256i bytes, bool high) {
    return high ? _mm256_srli_epi32(bytes, 4) : _mm256_and_si256(bytes, _mm256_set1_epi32(15));
}
__m256 times(__m256 d, __m256i q) { return _mm256_mul_ps(d, _mm256_cvtepi32_ps(q)); }  // d * float(q)

// Exact fp16 -> fp32 by the CPU's conversion (the same value as half_to_float for every finite half), in 8 lanes.
__m256 half8(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return _mm256_set1_ps(_cvtsh_ss(h));
}

// Per type, as the AVX-512 Dec without sub(): block() reads block b's header, eight(j, h, i) gives the weights
// 8 i ... 8 i + 7 of chunk h of sub-block j (of the block's weights 16 (j kChunks + h) ...) as fp32.
template <int64_t T>
struct Dec;

template <>
struct Dec<kQ8_0> {
    static constexpr bool kAhead = false;
    static constexpr int kSubs = 1, kChunks = 2;
    const uint8_t* q;
    __m256 d;
    void block(const uint8_t* row, int64_t b, bool fault) {
        q = row + b * 34 + 2;
        d = half8(row + scale_block<kQ8_0>(b, fault));
    }
    __m256 eight(int, int h, int i) const { return _mm256_mul_ps(_mm256_cvtepi32_ps(widen_i8(q + 16 * h + 8 * i)), d); }
};

template <>
struct Dec<kQ4_0> {
    static constexpr bool kAhead = false;
    static constexpr int kSubs = 1, kChunks = 2;
    const uint8_t* q;  // 16 bytes: weights 0..15 are their low nibbles, 16..31 the high ones
    __m256 d;
    void block(const uint8_t* row, int64_t b, bool fault) {
        q = row + b * 18 + 2;
        d = half8(row + scale_block<kQ4_0>(b, fault));
    }
    __m256 eight(int, int h, int i) const {
        return times(d, _mm256_sub_epi32(nibbles(widen_u8(q + 8 * i), h), _mm256_set1_epi32(8)));
    }
};

template <>
struct Dec<kQ4_1> {
    static constexpr bool kAhead = false;
    static constexpr int kSubs = 1, kChunks = 2;
    const uint8_t* q;  // as Q4_0's
    __m256 d, m;
    void block(const uint8_t* row, int64_t b, bool fault) {
        q = row + b * 20 + 4;
        d = half8(row + scale_block<kQ4_1>(b, fault));
        m = half8(row + b * 20 + 2);
    }
    __m256 eight(int, int h, int i) const {
        return _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(nibbles(widen_u8(q + 8 * i), h)), m);
    }
};

template <>
struct Dec<kQ5_0> {
    static constexpr bool kAhead = false;
    static constexpr int kSubs = 1, kChunks = 2;
    const uint8_t* blk;
    __m256 d;
    void block(const uint8_t* row, int64_t b, bool fault) {
        blk = row + b * 22;
        d = half8(row + scale_block<kQ5_0>(b, fault));
    }
    // Weight l (0..31) has qh bit l as its fifth bit (qh = bytes 2..5): for l = 16 h + 8 i + lane, bit l + 8 - 8 h of
    // the 32-bit word at byte 1 + h, shifted down to bit 4. q - 16 is the nibble less 16 where that bit is clear.
    __m256 eight(int, int h, int i) const {
        uint32_t word;
        std::memcpy(&word, blk + 1 + h, 4);
        const __m256i shift =
            _mm256_add_epi32(_mm256_setr_epi32(4, 5, 6, 7, 8, 9, 10, 11), _mm256_set1_epi32(8 * (h + i)));
        const __m256i bit4 = _mm256_srlv_epi32(_mm256_set1_epi32(int(word)), shift);
        const __m256i clear = _mm256_andnot_si256(bit4, _mm256_set1_epi32(16));
        return times(d, _mm256_sub_epi32(nibbles(widen_u8(blk + 6 + 8 * i), h), clear));
    }
};

template <>
struct Dec<kQ4_K> {
    static constexpr bool kAhead = false;
    static constexpr int kSubs = 8, kChunks = 2;
    const uint8_t* q;             // 128 bytes: sub-blocks 2i and 2i + 1 are the low and high nibbles of bytes 32i...
    alignas(32) float scale[16];  // d * sc of sub-blocks 0..7, then -(dmin * mn) of the same
    void block(const uint8_t* row, int64_t b, bool fault) {
        const uint8_t* blk = row + b * 144;
        q = blk + 16;
        // The 12 packed bytes s: a = s[0..7] and c = s[4..11], one per lane. As q4k_scale_min: sc_j = s[j] & 63 and
        // mn_j = s[j + 4] & 63 for j < 4; sc_j = s[j + 4] & 15 | (s[j - 4] >> 6) << 4 and
        // mn_j = s[j + 4] >> 4 | (s[j] >> 6) << 4 for j >= 4.
        const __m256i a = widen_u8(blk + 4), c = widen_u8(blk + 8), top = _mm256_srli_epi32(a, 6);
        const __m256i low6 = _mm256_set1_epi32(63), low4 = _mm256_set1_epi32(15);
        const __m256i top_before = _mm256_permutevar8x32_epi32(top, _mm256_setr_epi32(0, 1, 2, 3, 0, 1, 2, 3));
        const __m256i sc_high = _mm256_or_si256(_mm256_and_si256(c, low4), _mm256_slli_epi32(top_before, 4));
        const __m256i mn_high = _mm256_or_si256(_mm256_srli_epi32(c, 4), _mm256_slli_epi32(top, 4));
        const __m256i sc = _mm256_blend_epi32(_mm256_and_si256(a, low6), sc_high, 0xf0);  // lanes 4..7: j >= 4
        const __m256i mn = _mm256_blend_epi32(_mm256_and_si256(c, low6), mn_high, 0xf0);
        // d * sc and dmin * mn are exact (fp16 times 6 bits); (-dmin) * mn is -(dmin * mn), bit for bit. -dmin by its
        // sign bit: 0 - dmin would be +0, not -0, for dmin = +0.
        _mm256_store_ps(scale, times(half8(blk), sc));
        _mm256_store_ps(scale + 8, times(_mm256_xor_ps(half8(blk + 2), _mm256_set1_ps(-0.0f)), mn));
        if (fault) scale[kFaultSub] = scale[kFaultSub - 1];
    }
    __m256 eight(int j, int h, int i) const {
        const __m256 quants = _mm256_cvtepi32_ps(nibbles(widen_u8(q + 32 * (j / 2) + 16 * h + 8 * i), j % 2));
        return _mm256_fmadd_ps(_mm256_broadcast_ss(scale + j), quants, _mm256_broadcast_ss(scale + 8 + j));
    }
};

template <>
struct Dec<kQ6_K> {
    static constexpr bool kAhead = true;
    static constexpr int kSubs = 16, kChunks = 1;
    alignas(32) float scale[16];  // d * sc[s], exact
    alignas(32) int8_t q[256];    // the block's 6-bit quants less 32, in weight order
    void block(const uint8_t* row, int64_t b, bool fault) {
        const uint8_t* blk = row + b * 210;
        const __m256 d = half8(blk + 208);
        _mm256_store_ps(scale, times(d, widen_i8(blk + 192)));
        _mm256_store_ps(scale + 8, times(d, widen_i8(blk + 200)));
        if (fault) scale[kFaultSub] = scale[kFaultSub - 1];
        // Weight 128 h + r: low 4 bits (ql[64 h + r % 64] >> 4 (r / 64)) & 15, high 2 bits
        // (qh[32 h + r % 32] >> 2 (r / 32)) & 3, shifted to bits 4-5. 32 bytes at a time; 16-bit lane shifts, whose
        // bits that cross into a byte are masked off.
        const __m256i mask4 = _mm256_set1_epi8(0x0f), mask2 = _mm256_set1_epi8(0x30), off = _mm256_set1_epi8(32);
        const auto load = [blk](int at) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + at)); };
        for (int h = 0; h < 2; ++h) {
            const __m256i ql0 = load(64 * h), ql1 = load(64 * h + 32), qh = load(128 + 32 * h);
            const __m256i part[4] = {
                _mm256_or_si256(_mm256_and_si256(ql0, mask4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), mask2)),
                _mm256_or_si256(_mm256_and_si256(ql1, mask4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), mask2)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), mask4), _mm256_and_si256(qh, mask2)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), mask4),
                                _mm256_and_si256(_mm256_srli_epi16(qh, 2), mask2)),
            };
            for (int i = 0; i < 4; ++i)
                _mm256_store_si256(reinterpret_cast<__m256i*>(q + 128 * h + 32 * i), _mm256_sub_epi8(part[i], off));
        }
    }
    __m256 eight(int s, int, int i) const {
        return times(_mm256_broadcast_ss(scale + s), widen_i8(q + 16 * s + 8 * i));
    }
};

// G weight rows from n0 (clamped to the last row) x R activation rows from m0, as rows_avx.
template <int64_t T, int G, int R>
void rows(const Args& a, int64_t n0, int64_t m0) {
    constexpr int kW = Layout<T>::kWeights;
    int64_t n[G];
    const uint8_t* w[G];
    for (int g = 0; g < G; ++g) {
        n[g] = std::min(n0 + g, a.N - 1);
        w[g] = a.w + n[g] * a.row_bytes;
    }
    __m256 acc[G][R][2];  // [weight row][activation row][lanes 0-7, 8-15]
    for (int g = 0; g < G; ++g)
        for (int m = 0; m < R; ++m) acc[g][m][0] = acc[g][m][1] = _mm256_setzero_ps();
    constexpr int kBuffers = Dec<T>::kAhead ? 2 : 1;  // as rows_avx: Q6_K decodes block b + 1 while b runs
    Dec<T> dec[kBuffers][G];
    const int64_t blocks = a.K / kW;
    if (kBuffers == 2)
        for (int g = 0; g < G; ++g) dec[0][g].block(w[g], 0, a.fault);
    const float* x[R];  // each activation row at block b: one base register a row, the chunks its offsets
    for (int m = 0; m < R; ++m) x[m] = a.x + (m0 + m) * a.K;
    for (int64_t b = 0; b < blocks; ++b) {
        Dec<T>* now = dec[b % kBuffers];
        if (kBuffers == 1)
            for (int g = 0; g < G; ++g) now[g].block(w[g], b, a.fault);
        else if (b + 1 < blocks)
            for (int g = 0; g < G; ++g) dec[(b + 1) % kBuffers][g].block(w[g], b + 1, a.fault);
        prefetch<T, false>(a, w, G, b);
#pragma GCC unroll 16
        for (int j = 0; j < Dec<T>::kSubs; ++j) {
#pragma GCC unroll 2
            for (int h = 0; h < Dec<T>::kChunks; ++h) {
                const int k = kLanes * (j * Dec<T>::kChunks + h);
#pragma GCC unroll 2
                for (int i = 0; i < 2; ++i) {
                    __m256 wv[G];
                    for (int g = 0; g < G; ++g) wv[g] = now[g].eight(j, h, i);
#pragma GCC unroll 6
                    for (int m = 0; m < R; ++m) {
                        const __m256 xm = _mm256_loadu_ps(x[m] + k + 8 * i);
                        for (int g = 0; g < G; ++g) acc[g][m][i] = _mm256_fmadd_ps(xm, wv[g], acc[g][m][i]);
                    }
                }
            }
        }
        for (int m = 0; m < R; ++m) x[m] += kW;
    }
    // Unrolled: acc indexed by variables would live in memory, each block's FMAs storing and reloading it.
#pragma GCC unroll 2
    for (int g = 0; g < G; ++g) {
#pragma GCC unroll 6
        for (int m = 0; m < R; ++m) {
            float v[kLanes];
            _mm256_storeu_ps(v, acc[g][m][0]);
            _mm256_storeu_ps(v + 8, acc[g][m][1]);
            a.out[(m0 + m) * a.N + n[g]] = lane_sum(v, a.bias ? a.bias + n[g] : nullptr);
        }
    }
}

// Weight rows per task for R activation rows: 2 at one row (4 independent FMA chains where one row has 2), else 1,
// whose 2 R accumulators (at most 12) leave room for the chunk being decoded. Measured on the 2-core AMD EPYC
// (Zen 3), weights of 8-15 MB: G = 2 against 1 at one row 0.83-0.96x the time by type, at 2-3 rows 1.05-1.4x;
// G = 3-4 at one row spilled registers (Q4_K 1.2-1.4x G = 2's time).
constexpr int group_for(int rows) { return rows == 1 ? 2 : 1; }

template <int64_t T, int... Rs>
constexpr RowsFn kRows[] = {nullptr, rows<T, group_for(Rs), Rs>...};  // indexed by row count

// Passes of at most kMaxRows activation rows, each over all the weight rows as the AVX-512 path's blocks, of as equal
// sizes as may be (7 = 4 + 3, 9 = 5 + 4): passes of 6 and the rest (6 + 1, 6 + 3) took 1.01-1.14x the time at 7-13
// rows, each pass paying for the decoding of every weight whatever its rows. Running each task's weight rows through every
// pass in turn instead (their bytes read from memory once) took 1.02-1.36x: the passes are held by their
// instructions, not by memory.
template <int64_t T>
void run(const Args& a) {
    const int64_t passes = (a.M + kMaxRows - 1) / kMaxRows, base = a.M / passes, longer = a.M % passes;
    int64_t m0 = 0;
    for (int64_t p = 0; p < passes; ++p) {
        const int rows = int(base + (p < longer));  // the first `longer` passes take one row more
        const int64_t group = group_for(rows), tasks = (a.N + group - 1) / group;
        const RowsFn fn = kRows<T, 1, 2, 3, 4, 5, 6>[rows];
#pragma omp parallel for schedule(static)
        for (int64_t t = 0; t < tasks; ++t) fn(a, t * group, m0);
        m0 += rows;
    }
}

}  // namespace avx2

#pragma GCC pop_options
#endif  // QUANT_ROWS_X86

template <int64_t T>
void run_portable(const Args& a) {
    const int64_t num_pairs = (a.N + 1) / kPair;
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < num_pairs; ++p) {
        // An odd N's last pair computes its one weight row twice: same work, one code path.
        const int64_t n[kPair] = {kPair * p, std::min(kPair * p + 1, a.N - 1)};
        for (int64_t m0 = 0; m0 < a.M; m0 += kMaxRows) pair_portable<T>(a, n, m0, int(std::min<int64_t>(kMaxRows, a.M - m0)));
    }
}

enum Path : int64_t { kAuto = 0, kAvx512 = 1, kPortable = 2, kAvx2 = 3 };  // the op's `path`

template <int64_t T>
void run(const Args& a, int64_t path) {
#if QUANT_ROWS_X86
    if (path == kAvx512) return run_avx512<T>(a);
    if (path == kAvx2) return avx2::run<T>(a);
#else
    (void)path;  // only the portable path is built
#endif
    run_portable<T>(a);
}

bool has_avx512() {
#if QUANT_ROWS_X86
    // CPUID and the OS's XSAVE; F16C for the scales (every AVX-512 CPU has it)
    static const bool has = (__builtin_cpu_init(), __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("f16c"));
    return has;
#else
    return false;
#endif
}

bool has_avx2() {
#if QUANT_ROWS_X86
    // CPUID and the OS's YMM state (libgcc asks XGETBV before it reports AVX2 or FMA)
    static const bool has = (__builtin_cpu_init(), __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                                                   __builtin_cpu_supports("f16c"));
    return has;
#else
    return false;
#endif
}

// (weights, bytes) per block of a supported type, or (0, 0).
std::pair<int64_t, int64_t> layout(int64_t qtype) {
    switch (qtype) {
        case kQ4_0: return {Layout<kQ4_0>::kWeights, Layout<kQ4_0>::kBytes};
        case kQ4_1: return {Layout<kQ4_1>::kWeights, Layout<kQ4_1>::kBytes};
        case kQ5_0: return {Layout<kQ5_0>::kWeights, Layout<kQ5_0>::kBytes};
        case kQ8_0: return {Layout<kQ8_0>::kWeights, Layout<kQ8_0>::kBytes};
        case kQ4_K: return {Layout<kQ4_K>::kWeights, Layout<kQ4_K>::kBytes};
        case kQ6_K: return {Layout<kQ6_K>::kWeights, Layout<kQ6_K>::kBytes};
        default: return {0, 0};
    }
}

// path: 0 = AVX-512 where the CPU has it, else AVX2 where it has that, else portable; 1 = AVX-512, 3 = AVX2 (each an
// error on a CPU without it); 2 = portable.
at::Tensor quant_rows_linear(const at::Tensor& x, const at::Tensor& blocks, int64_t qtype, int64_t in_features,
                             const std::optional<at::Tensor>& bias, int64_t path) {
    const auto [weights, bytes] = layout(qtype);
    TORCH_CHECK(weights > 0, "quant_rows_linear: unsupported GGML type ", qtype);
    TORCH_CHECK(x.scalar_type() == at::kFloat && x.device().is_cpu(), "quant_rows_linear: x must be fp32 on the CPU");
    TORCH_CHECK(blocks.scalar_type() == at::kByte && blocks.dim() == 2 && blocks.is_contiguous() &&
                    blocks.device().is_cpu(),
                "quant_rows_linear: blocks must be a contiguous uint8 [out, bytes_per_row] CPU tensor");
    TORCH_CHECK(in_features > 0 && in_features % weights == 0, "quant_rows_linear: in_features ", in_features,
                " is not a multiple of the block size ", weights);
    TORCH_CHECK(blocks.size(1) == in_features / weights * bytes, "quant_rows_linear: ", blocks.size(1),
                " bytes per row, the type needs ", in_features / weights * bytes);
    TORCH_CHECK(x.size(-1) == in_features, "quant_rows_linear: x has ", x.size(-1), " features, the weight ",
                in_features);
    const int64_t n = blocks.size(0);
    if (bias) {
        TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->dim() == 1 && bias->size(0) == n &&
                        bias->is_contiguous() && bias->device().is_cpu(),
                    "quant_rows_linear: bias must be a contiguous fp32 [out] CPU tensor");
    }
    TORCH_CHECK(path >= 0 && path <= 3, "quant_rows_linear: path is 0 (auto), 1 (AVX-512), 2 (portable) or 3 (AVX2)");
    TORCH_CHECK(path != kAvx512 || has_avx512(), "quant_rows_linear: this CPU has no AVX-512");
    TORCH_CHECK(path != kAvx2 || has_avx2(), "quant_rows_linear: this CPU has no AVX2 (with FMA and F16C)");
    if (path == kAuto) path = has_avx512() ? kAvx512 : has_avx2() ? kAvx2 : kPortable;

    const at::Tensor rows = x.reshape({-1, in_features}).contiguous();  // [M, K]
    at::Tensor out = at::empty({rows.size(0), n}, x.options());        // [M, N]
    const Args a{rows.data_ptr<float>(), blocks.data_ptr<uint8_t>(), bias ? bias->data_ptr<float>() : nullptr,
                 out.data_ptr<float>(), rows.size(0), in_features, n, blocks.size(1), g_fault != 0, g_l2};
    if (a.M > 0 && n > 0) {
        switch (qtype) {
            case kQ4_0: run<kQ4_0>(a, path); break;
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

// Rows `ids` of an embedding table kept as GGUF blocks, each decoded whole by the exact portable decoder: out[i] is
// row ids[i] of gguf.quants.dequantize(blocks), bitwise. Rows are spread over the threads.
template <int64_t T>
void embedding_rows(const int64_t* ids, int64_t n, const uint8_t* w, int64_t row_bytes, int64_t dim, float* out) {
    constexpr int kW = Layout<T>::kWeights;
    const bool fault = g_fault != 0;
#pragma omp parallel for schedule(static) if (n > 1)
    for (int64_t i = 0; i < n; ++i) {
        const uint8_t* row = w + ids[i] * row_bytes;
        for (int64_t b = 0; b < dim / kW; ++b) decode_portable<T>(row, b, fault, out + i * dim + b * kW);
    }
}

// specdecode::quant_rows_embedding(ids [...] int64, blocks [V, bytes_per_row], qtype, dim) -> [..., dim] fp32.
at::Tensor quant_rows_embedding(const at::Tensor& ids, const at::Tensor& blocks, int64_t qtype, int64_t dim) {
    const auto [weights, bytes] = layout(qtype);
    TORCH_CHECK(weights > 0, "quant_rows_embedding: unsupported GGML type ", qtype);
    TORCH_CHECK(ids.scalar_type() == at::kLong && ids.device().is_cpu(),
                "quant_rows_embedding: ids must be int64 on the CPU");
    TORCH_CHECK(blocks.scalar_type() == at::kByte && blocks.dim() == 2 && blocks.is_contiguous() &&
                    blocks.device().is_cpu(),
                "quant_rows_embedding: blocks must be a contiguous uint8 [vocab, bytes_per_row] CPU tensor");
    TORCH_CHECK(dim > 0 && dim % weights == 0 && blocks.size(1) == dim / weights * bytes, "quant_rows_embedding: ",
                blocks.size(1), " bytes per row do not hold ", dim, " weights of type ", qtype);
    const at::Tensor flat = ids.reshape({-1}).contiguous();  // [n]
    const int64_t n = flat.size(0), vocab = blocks.size(0);
    const int64_t* p = flat.data_ptr<int64_t>();
    for (int64_t i = 0; i < n; ++i)
        TORCH_CHECK(p[i] >= 0 && p[i] < vocab, "quant_rows_embedding: index ", p[i], " out of range for ", vocab,
                    " rows");
    at::Tensor out = at::empty({n, dim}, blocks.options().dtype(at::kFloat));  // [n, dim]
    const uint8_t* w = blocks.data_ptr<uint8_t>();
    float* o = out.data_ptr<float>();
    switch (qtype) {
        case kQ4_0: embedding_rows<kQ4_0>(p, n, w, blocks.size(1), dim, o); break;
        case kQ4_1: embedding_rows<kQ4_1>(p, n, w, blocks.size(1), dim, o); break;
        case kQ5_0: embedding_rows<kQ5_0>(p, n, w, blocks.size(1), dim, o); break;
        case kQ8_0: embedding_rows<kQ8_0>(p, n, w, blocks.size(1), dim, o); break;
        case kQ4_K: embedding_rows<kQ4_K>(p, n, w, blocks.size(1), dim, o); break;
        case kQ6_K: embedding_rows<kQ6_K>(p, n, w, blocks.size(1), dim, o); break;
    }
    std::vector<int64_t> sizes = ids.sizes().vec();
    sizes.push_back(dim);
    return out.view(sizes);
}

}  // namespace

extern "C" {
// For the tests' negative control only: nonzero makes every later call misread one sub-block scale.
void specdecode_quant_rows_fault(int on) { g_fault = on; }
}

TORCH_LIBRARY_FRAGMENT(specdecode, m) {
    m.def("quant_rows_linear(Tensor x, Tensor blocks, int qtype, int in_features, Tensor? bias=None, int path=0)"
          " -> Tensor");
    m.def("quant_rows_embedding(Tensor ids, Tensor blocks, int qtype, int dim) -> Tensor");
    m.def("quant_rows_avx512() -> bool", &has_avx512);  // no tensor to dispatch on: one kernel for all
    m.def("quant_rows_avx2() -> bool", &has_avx2);
}

TORCH_LIBRARY_IMPL(specdecode, CPU, m) {
    m.impl("quant_rows_linear", &quant_rows_linear);
    m.impl("quant_rows_embedding", &quant_rows_embedding);
}
