// specdecode::quant_int8_grouped_linear(x [..., K], groups [G, ...], qtype, K, N, bias?, path) -> [..., N]: the
// "fast" arithmetic. y ~= x @ dequant(W)^T (+ bias) for a weight W of one of Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K (ggml's
// type numbers) kept as its quants, its rows grouped 16 at a time (models/row_groups.py: N <= 16 G), and the
// activations quantized to int8, as llama.cpp's CPU kernels do. It is NOT the dequantized model's product (that is
// quant_rows.cpp's); it is this fixed arithmetic:
//
// 1. Activations. Each row of x is quantized on its own, per block of QB consecutive values: QB = 32 for the
//    32-weight types (Q4_0, Q4_1, Q5_0, Q8_0), QB = 256 (one super-block) for Q4_K and Q6_K. For a block x[0..QB):
//      amax = max |x[i]|;  dx = amax / 127.0f (fp32 division);
//      q[i] = 0 if dx == 0, else clamp(round_half_even(x[i] / dx), -127, 127)   (fp32 division, int8 result).
//    Non-finite x are undefined. s16[j], s32[j]: the sums of the quants over positions 16j.., 32j.. (exact).
// 2. Integers, per output n, activation row m and weight block b (32 weights, or a K-quant's super-block of 256
//    in sub-blocks j), with x the activation quants and w the weight's quants as the file defines their values:
//      Q4_0, Q4_1, Q5_0, Q8_0: S = sum_t w[t] x[t]    (Q4_0 w = q4 - 8; Q4_1 w = q4 in 0..15; Q5_0 w = q5 - 16;
//                                                       Q8_0 w = q8)
//      Q4_K: S = sum_j sc[j] * sum_{t in j} q4[t] x[t],  Mn = sum_j mn[j] * s32[j]   (8 sub-blocks of 32)
//      Q6_K: S = sum_j sc[j] * sum_{t in j} (q6[t] - 32) x[t]                        (16 sub-blocks of 16)
//    all exact (int32 holds every one).
// 3. fp32, each operation rounded to fp32 (fma: one rounding), from acc = +0, for b = 0, 1, 2, ... in order, with
//    d, m, dmin the block's fp16 fields converted exactly, dx the activation block's scale and float() int32 ->
//    fp32 round-to-nearest-even:
//      acc = fma(float(S), d * dx, acc)
//      Q4_1: acc = fma(float(s32 of the block), m * dx, acc);   Q4_K: acc = fma(float(Mn), -(dmin * dx), acc)
//    then y = acc (+ bias[n]).
//
// The integers are exact whatever instructions compute them (VNNI's vpdpbusd, AMX's tdpbssd, or AVX-512BW's
// vpmaddubsw and vpmaddwd, where no int16 pair sum can saturate: an unsigned quant <= 63 times |x| <= 127, twice, or
// |q8| <= 128 against the sign-adjusted x; AVX2's 256-bit forms of the same), and the fp32 steps are the same
// operations on every path, so the AVX512-VNNI, AMX, AVX-512BW, AVX2 and portable scalar paths give identical bits. A row's quantization and sums never
// read another row, so its output is bitwise the same alone or in any batch.
//
// Work: a vector lane is an output row. Every integer dot product is 16 weight rows x 4 positions against the
// activation row's 4 quants broadcast, so one instruction serves 16 outputs and a block's fp32 steps are one vector
// operation for all 16, with no horizontal sums. Every activation row is quantized once per call, before the
// threads start; the threads split the groups; a group meets up to 6 activation rows at a time (passes of
// near-equal size), each weight byte loaded and unpacked once per pass, and asked into cache ahead (by vendor). With
// AMX (16 rows and more), the 32-weight types' integer sums come from tiles instead (the AMX section).
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
#include <cpuid.h>
#include <immintrin.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#else
#define QUANT_INT8_X86 0
#endif

namespace {

enum QType : int64_t { kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ8_0 = 8, kQ4_K = 12, kQ6_K = 14 };
enum Path : int64_t { kAuto = 0, kVnni = 1, kBw = 2, kPortable = 3, kAmx = 4, kAvx2 = 5 };

constexpr int kChunk = 64;  // an activation row's quants are padded to a multiple of this (zeros)
// Faults for negative controls (specdecode_quant_int8_fault): kFaultScale makes sub-block 5 of each K-quant
// super-block (or every 32-weight block b with b % 8 == 5) take its neighbour's scale; kFaultShared quantizes
// every activation block with one scale shared by all the rows of the call (the largest amax among them).
constexpr int kFaultScale = 1, kFaultShared = 2, kFaultSub = 5;
int g_fault = 0;

// The CPU's vendor, which sets how the vector paths prefetch (see prefetch_ahead).
enum Vendor { kOtherVendor, kIntel, kAmd };
Vendor cpu_vendor() {
#if QUANT_INT8_X86
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    __get_cpuid(0, &eax, &ebx, &ecx, &edx);
    if (ebx == 0x756e6547u && edx == 0x49656e69u && ecx == 0x6c65746eu) return kIntel;  // "GenuineIntel"
    if (ebx == 0x68747541u && edx == 0x69746e65u && ecx == 0x444d4163u) return kAmd;    // "AuthenticAMD"
#endif
    return kOtherVendor;
}
const Vendor g_vendor = cpu_vendor();
// The vector paths' prefetch distance in bytes.
int64_t g_prefetch = QUANT_INT8_X86 ? (g_vendor == kIntel ? 2048 : 8192) : 0;
// Whether a call of several rows prefetches into L2: on AMD's CPUs.
const bool g_l2 = g_vendor == kAmd;

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
    int64_t stride = 0;  // K rounded up to a chunk; the padding quants are 0
    std::vector<int8_t> q;      // [rows, stride]
    std::vector<float> d;       // [rows, K / QB]
    std::vector<int16_t> s16;   // [rows, K / 16]: the sum of the quants of each 16 positions
    std::vector<int16_t> s32;   // [rows, K / 32]: of each 32
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

namespace avx2 {
float quantize_block(const float* x, int64_t n, float shared_amax, bool shared, int8_t* q);  // the AVX2 section
}

enum Quantizer { kQuantPortable, kQuantAvx512, kQuantAvx2 };

// pad_rows >= rows: the quants hold that many rows, the ones past `rows` zero (AMX's tiles load whole passes).
void quantize(const float* x, int64_t rows, int64_t pad_rows, int64_t K, int64_t QB, bool shared, Quantizer how, Acts& a) {
    a.stride = (K + kChunk - 1) / kChunk * kChunk;
    const int64_t nb = K / QB;
    a.q.assign(std::max(rows, pad_rows) * a.stride, 0);
    a.d.assign(rows * nb, 0.0f);
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
            if (how != kQuantPortable) {
                a.d[m * nb + b] = how == kQuantAvx512 ? quantize_block_avx(xb, QB, batch_amax, shared, qb)
                                                      : avx2::quantize_block(xb, QB, batch_amax, shared, qb);
                continue;
            }
#endif
            a.d[m * nb + b] = quantize_block_portable(xb, QB, batch_amax, shared, qb);
        }
    }
    for (int64_t m = 0; m < rows; ++m) {
        const int8_t* q = a.q.data() + m * a.stride;
        for (int64_t c = 0; c < K / 16; ++c) {
            int32_t sum = 0;
            for (int t = 0; t < 16; ++t) sum += q[16 * c + t];
            a.s16[m * (K / 16) + c] = int16_t(sum);
        }
        for (int64_t c = 0; c < K / 32; ++c)
            a.s32[m * (K / 32) + c] = int16_t(a.s16[m * (K / 16) + 2 * c] + a.s16[m * (K / 16) + 2 * c + 1]);
    }
}

// AMX's int8 tiles: the CPU has them (CPUID leaf 7: AMX-TILE, AMX-INT8) and Linux lets this process use their
// state (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA, asked once; a kernel or hypervisor that refuses it says so).
bool amx_granted() {
#if QUANT_INT8_X86 && defined(__linux__)
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) || !((edx >> 24) & 1) || !((edx >> 25) & 1)) return false;
    constexpr long kReqXcompPerm = 0x1023, kXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXtiledata) == 0;
#else
    return false;
#endif
}

// Which vector paths this CPU runs: bit 0 AVX512-VNNI (with BW and VL), bit 1 AVX-512BW (with VL), bit 2 AMX-INT8
// (with VNNI's vector instructions for the rest of the work), bit 3 AVX2 (with FMA and F16C). Asked of the CPU (CPUID and the OS's XSAVE state,
// through GCC's builtins) and of the OS, never assumed.
int64_t features() {
#if QUANT_INT8_X86
    static const int64_t f = [] {
        __builtin_cpu_init();
        const bool bw = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("f16c");
        const bool vnni = bw && __builtin_cpu_supports("avx512vnni");
        const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
        return int64_t(vnni) | (int64_t(bw) << 1) | (int64_t(vnni && amx_granted()) << 2) | (int64_t(avx2) << 3);
    }();
    return f;
#else
    return 0;
#endif
}

// ---- weights: grouped rows (models/row_groups.py) ----

constexpr int kGroupRows = 16, kMaxPass = 6;
// AUTO takes AMX (where the CPU and OS give it) from this many activation rows, VNNI below (the AMX section);
// specdecode_quant_int8_amx_from overrides it (experiments; 0 turns AMX off for AUTO).
int64_t g_amx_from = 16;

// Bytes per group of 16 rows and weight block (32 weights; a K-quant's super-block), and weights per block.
constexpr int64_t group_bytes(int64_t t) {
    return t == kQ4_K   ? 2368
           : t == kQ6_K ? 3360
           : t == kQ8_0 ? 544
           : t == kQ5_0 ? 352
           : t == kQ4_1 ? 320
           : t == kQ4_0 ? 288
                        : 0;
}
constexpr int64_t block_weights(int64_t t) { return t == kQ4_K || t == kQ6_K ? 256 : 32; }

struct GArgs {
    const Acts* acts;
    const uint8_t* w;   // [G, nb * group_bytes]
    const float* bias;  // [N] or nullptr
    float* out;         // [M, N]
    int64_t M, K, N, G;
    bool fault;
    int64_t prefetch;  // bytes ahead (g_prefetch, read once per call)
    bool l2;           // a few rows' prefetches go to L2 (g_l2; see prefetch_ahead)
};

// Sub-block j's scale row under the fault: sub-block 5 reads sub-block 4's scales.
inline int scale_row(int j, bool fault) { return fault && j == kFaultSub ? j - 1 : j; }

// A 32-weight block's d fields: its own, or under the fault (b % 8 == 5) the previous block's.
inline const uint8_t* d_fields(const uint8_t* blk, int64_t b, int64_t bytes, bool fault) {
    return fault && b % 8 == kFaultSub ? blk - bytes : blk;
}

// Row r's weight at position p (0..31) of a 32-weight block, as step 2 defines its value.
int32_t block32_weight(int64_t t, const uint8_t* blk, int r, int p) {
    if (t == kQ8_0) return int8_t(blk[32 + ((p / 4) * kGroupRows + r) * 4 + p % 4]);
    const int half = p / 16, k = (p % 16) / 4, i = p % 4;
    const uint8_t byte = blk[(t == kQ4_1 ? 64 : 32) + (k * kGroupRows + r) * 4 + i];
    const int32_t q = half ? byte >> 4 : byte & 0xf;
    if (t == kQ4_1) return q;
    if (t == kQ4_0) return q - 8;
    uint64_t mask;  // Q5_0: vector 4 half + k's mask, bit 4r + i: the fifth bit
    std::memcpy(&mask, blk + 288 + 8 * (4 * half + k), 8);
    return q + 16 * int32_t((mask >> (4 * r + i)) & 1) - 16;
}

// Row r's stored Q6_K quant (0..63) at position 4 quad + u of a super-block: its low 4 bits from ql, its top 2
// from qh (models/row_groups.py: quad 8p + 4s + c, c = 0..3, in pair p's ql vector c at nibble s and its qh
// vector c / 2 at bit 2(2(c % 2) + s); pair p's 384 bytes from 288 + 384 p, ql's 4 vectors then qh's 2).
inline const uint8_t* q6k_ql(const uint8_t* blk, int p, int c) { return blk + 288 + 384 * p + 64 * c; }
inline const uint8_t* q6k_qh(const uint8_t* blk, int p, int c) { return blk + 288 + 384 * p + 256 + 64 * (c / 2); }
int32_t q6k_weight(const uint8_t* blk, int quad, int r, int u) {
    const int p = quad / 8, s = (quad % 8) / 4, c = quad % 4;
    const uint8_t low = q6k_ql(blk, p, c)[r * 4 + u];
    const uint8_t high = q6k_qh(blk, p, c)[r * 4 + u];
    return int32_t(((low >> (4 * s)) & 0xf) | (((high >> (2 * (2 * (c % 2) + s))) & 3) << 4));
}

void grouped_portable(const GArgs& a, int64_t t) {
    const Acts& A = *a.acts;
    const int64_t nb = a.K / block_weights(t), bytes = group_bytes(t);
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < a.N; ++n) {
        const int64_t g = n / kGroupRows;
        const int r = int(n % kGroupRows);
        for (int64_t m = 0; m < a.M; ++m) {
            const int8_t* x = A.q.data() + m * A.stride;
            const int16_t* s16 = A.s16.data() + m * (a.K / 16);
            const int16_t* s32 = A.s32.data() + m * (a.K / 32);
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; ++b) {
                const uint8_t* blk = a.w + (g * nb + b) * bytes;
                const float dx = A.d[m * nb + b];
                int32_t S = 0, Mn = 0;
                if (t == kQ4_K) {
                    const int8_t* xb = x + 256 * b;
                    for (int j = 0; j < 8; ++j) {
                        const int i = j / 2, h = j % 2;
                        int32_t sub = 0;
                        for (int k = 0; k < 8; ++k)
                            for (int u = 0; u < 4; ++u) {
                                const uint8_t byte = blk[320 + ((i * 8 + k) * kGroupRows + r) * 4 + u];
                                sub += int32_t(h ? byte >> 4 : byte & 0xf) * xb[64 * i + 32 * h + 4 * k + u];
                            }
                        S += int32_t(blk[64 + scale_row(j, a.fault) * kGroupRows + r]) * sub;
                        Mn += int32_t(blk[192 + j * kGroupRows + r]) * s32[8 * b + j];
                    }
                    acc = std::fma(float(S), half_to_float(blk + 2 * r) * dx, acc);
                    acc = std::fma(float(Mn), -(half_to_float(blk + 32 + 2 * r) * dx), acc);
                } else if (t == kQ6_K) {
                    const int8_t* xb = x + 256 * b;
                    for (int j = 0; j < 16; ++j) {
                        int32_t sub = -32 * int32_t(s16[16 * b + j]);
                        for (int k = 0; k < 4; ++k)
                            for (int u = 0; u < 4; ++u)
                                sub += q6k_weight(blk, 4 * j + k, r, u) * xb[16 * j + 4 * k + u];
                        S += int32_t(int8_t(blk[32 + scale_row(j, a.fault) * kGroupRows + r])) * sub;
                    }
                    acc = std::fma(float(S), half_to_float(blk + 2 * r) * dx, acc);
                } else {
                    const int8_t* xb = x + 32 * b;
                    for (int p = 0; p < 32; ++p) S += block32_weight(t, blk, r, p) * xb[p];
                    const uint8_t* dd = d_fields(blk, b, bytes, a.fault);
                    acc = std::fma(float(S), half_to_float(dd + 2 * r) * dx, acc);
                    if (t == kQ4_1) acc = std::fma(float(s32[b]), half_to_float(blk + 32 + 2 * r) * dx, acc);
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

// acc + the 16 lane sums of w * s over 4 bytes, w signed (Q8_0). VNNI: w + 128 against s, from an accumulator that
// started at -128 * sum(s) (see block32); BW: |w| against s with w's sign (pair sums <= 2 * 128 * 127).
template <bool V>
inline __m512i dp4_signed(__m512i acc, __m512i w, __m512i s) {
    if constexpr (V) return _mm512_dpbusd_epi32(acc, _mm512_xor_si512(w, _mm512_set1_epi8(char(0x80))), s);
    const __m512i ss = _mm512_mask_sub_epi8(s, _mm512_movepi8_mask(w), _mm512_setzero_si512(), s);
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_abs_epi8(w), ss), _mm512_set1_epi16(1)));
}

// 4 activation quants from p in every lane.
typedef int32_t __attribute__((may_alias, aligned(1))) unaligned_i32;
inline __m512i quad(const int8_t* p) { return _mm512_set1_epi32(*reinterpret_cast<const unaligned_i32*>(p)); }
// 2 int16 from p in every lane.
inline __m512i pair16(const int16_t* p) { return _mm512_set1_epi32(*reinterpret_cast<const unaligned_i32*>(p)); }

// acc + the 16 lane sums of a * b over 2 int16 (no product or sum near int32's range: Q4_K's 6-bit mins against
// a row's sums of 32 quants).
template <bool V>
inline __m512i dp2(__m512i acc, __m512i a, __m512i b) {
    if constexpr (V) return _mm512_dpwssd_epi32(acc, a, b);
    else return _mm512_add_epi32(acc, _mm512_madd_epi16(a, b));
}

inline __m512i u8_lanes(const uint8_t* p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline __m512i i8_lanes(const uint8_t* p) { return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline __m512 half_lanes(const uint8_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
inline __m512i load(const uint8_t* p) { return _mm512_loadu_si512(p); }

// Per activation row of a pass: its quants and sums at the block, and dx. L2: its prefetches go to L2 (see
// prefetch_ahead).
template <int R, bool L2 = false>
struct RowsAt {
    const int8_t* x[R];
    const int16_t* s16[R];
    const int16_t* s32[R];
    float dx[R];
    int64_t ahead;  // the prefetch distance in bytes (g_prefetch)
};

// The block g_prefetch bytes ahead of blk (a thread's groups are consecutive, so its bytes are one stream) is asked
// into cache while this one is worked on. Without it, at 5-9 rows the loads waited on memory between bursts of
// arithmetic (the 1.5B's linears at 5 rows: ~38 ms against ~23 with it, AMD EPYC). A prefetch never faults, so the
// last blocks may point past the weight. How far ahead pays depends on the CPU's memory system: 8 KiB on the AMD
// EPYC it was tuned on; on an Intel Xeon (Sapphire Rapids class, AMX) 8 KiB was the slowest distance tried and
// 2 KiB took 0.70-0.94x its time at 1-9 rows (experiments/prefetch_distance.py). Read once per call
// (`GArgs::prefetch`); specdecode_quant_int8_prefetch overrides it (experiments).
// Into L1 (T0) or, where L2 is true, L2 (T1): on a Zen 4 EPYC, into L1 a call of 2-9 rows still waited on memory, its
// core's L1 miss buffers full; all rows into L2 took 1.03-1.13x the time at one row, which streams at the memory's
// speed either way (earlier runs of the A/B below, not kept). So on AMD (GArgs::l2) passes of 2 rows and more prefetch into L2, elsewhere L1 (not tried on
// Intel): the 1.5B's linears then took 0.70-0.85x the time at 2-9 rows, the 0.5B's 0.89-0.98x, 1.00x at one row
// (experiments.int8_ab, results/int8_ab_l2_zen4.json, 2026-12-07).
// The hint is a template argument: as a run-time choice (T1 in an if, T0 in its else) GCC 12 at -O3 dropped every
// prefetch of a kernel, and in asm the prefetches slowed the loops they sat in.
template <bool L2 = false>
inline void prefetch_ahead(const uint8_t* blk, int64_t bytes, int64_t ahead) {
    for (int64_t o = 0; o < bytes; o += 64)
        _mm_prefetch(reinterpret_cast<const char*>(blk + ahead + o), L2 ? _MM_HINT_T1 : _MM_HINT_T0);
}
// A K-quant's block (2-3 KiB) asks for its quants one line at a time, beside the load of the same line here: asked
// all at once at the block's start, the 37-53 requests filled the core's miss buffers and the prefetch loop stalled
// (14% of Q4_K's samples at 5 rows, which ran at 0.65x Q4_1's speed per weight).
template <bool L2 = false>
inline void prefetch_line(const uint8_t* p, int64_t ahead) {
    _mm_prefetch(reinterpret_cast<const char*>(p + ahead), L2 ? _MM_HINT_T1 : _MM_HINT_T0);
}

// One Q4_K super-block of a group against R rows: S and Mn of every lane.
template <bool V, int R, bool L2>
inline void q4k_block(const uint8_t* blk, const RowsAt<R, L2>& at, bool fault, __m512i (&S)[R], __m512i (&Mn)[R]) {
    const __m512i m4 = _mm512_set1_epi8(0xf);
    for (int m = 0; m < R; ++m) S[m] = _mm512_setzero_si512(), Mn[m] = _mm512_setzero_si512();
    for (int i = 0; i < 4; ++i) {
        __m512i lo[R], hi[R];  // sub-blocks 2i and 2i + 1
        for (int m = 0; m < R; ++m) lo[m] = _mm512_setzero_si512(), hi[m] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int k = 0; k < 8; ++k) {
            const __m512i v = load(blk + 320 + (i * 8 + k) * 64);
            prefetch_line<L2>(blk + 320 + (i * 8 + k) * 64, at.ahead);
            const __m512i wl = _mm512_and_si512(v, m4), wh = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
            for (int m = 0; m < R; ++m) {
                lo[m] = dp4<V>(lo[m], wl, quad(at.x[m] + 64 * i + 4 * k));
                hi[m] = dp4<V>(hi[m], wh, quad(at.x[m] + 64 * i + 32 + 4 * k));
            }
        }
        const __m512i sl = u8_lanes(blk + 64 + scale_row(2 * i, fault) * 16);
        const __m512i sh = u8_lanes(blk + 64 + scale_row(2 * i + 1, fault) * 16);
        for (int m = 0; m < R; ++m)
            S[m] = _mm512_add_epi32(S[m], _mm512_add_epi32(_mm512_mullo_epi32(lo[m], sl), _mm512_mullo_epi32(hi[m], sh)));
    }
    // Mn two sub-blocks at a time: the mins of 2p and 2p + 1 as an int16 pair in each lane against the row's two
    // sums, one dot product (a vpmulld a sub-block and row before: 2 uops each on Intel, the most of Q4_K's work at
    // several rows after the quants' own dot products)
    for (int p = 0; p < 4; ++p) {
        const __m512i mn = _mm512_or_si512(u8_lanes(blk + 192 + 32 * p), _mm512_slli_epi32(u8_lanes(blk + 208 + 32 * p), 16));
        for (int m = 0; m < R; ++m) Mn[m] = dp2<V>(Mn[m], mn, pair16(at.s32[m] + 2 * p));
    }
}

// Quad 4j + 4S + k's stored Q6_K quants (0..63) of the 16 rows, for sub-block j + S (j even, S = 0, 1): ql's nibble
// S, or'ed with qh's 2 bits 2(2(k % 2) + S) moved to bits 4-5 (16-bit shifts: bits that cross a byte are masked).
template <int S>
inline __m512i q6k_quads(const uint8_t* blk, int j, int k) {
    const __m512i ql = load(q6k_ql(blk, j / 2, k)), qh = load(q6k_qh(blk, j / 2, k));
    const __m512i low = _mm512_and_si512(S ? _mm512_srli_epi16(ql, 4) : ql, _mm512_set1_epi8(0xf));
    const int shift = 2 * (2 * (k % 2) + S);  // the top bits' place in qh: 0, 2, 4 or 6; wanted at 4
    const __m512i moved = shift < 4 ? _mm512_slli_epi16(qh, 4 - shift) : _mm512_srli_epi16(qh, shift - 4);
    return _mm512_or_si512(low, _mm512_and_si512(moved, _mm512_set1_epi8(0x30)));
}

// One Q6_K super-block of a group against R rows: S of every lane.
template <bool V, int R, bool L2>
inline void q6k_block(const uint8_t* blk, const RowsAt<R, L2>& at, bool fault, __m512i (&S)[R]) {
    for (int m = 0; m < R; ++m) S[m] = _mm512_setzero_si512();
    for (int j = 0; j < 16; j += 2) {  // two sub-blocks at a time: two chains per row
        __m512i S0[R], S1[R];
        for (int m = 0; m < R; ++m)
            S0[m] = _mm512_set1_epi32(-32 * int32_t(at.s16[m][j])), S1[m] = _mm512_set1_epi32(-32 * int32_t(at.s16[m][j + 1]));
#pragma GCC unroll 4
        for (int k = 0; k < 4; ++k) {
            const __m512i w0 = q6k_quads<0>(blk, j, k), w1 = q6k_quads<1>(blk, j, k);
            prefetch_line<L2>(q6k_ql(blk, j / 2, k), at.ahead);
            if (k % 2 == 0) prefetch_line<L2>(q6k_qh(blk, j / 2, k), at.ahead);
            for (int m = 0; m < R; ++m) {
                S0[m] = dp4<V>(S0[m], w0, quad(at.x[m] + 16 * j + 4 * k));
                S1[m] = dp4<V>(S1[m], w1, quad(at.x[m] + 16 * j + 16 + 4 * k));
            }
        }
        const __m512i c0 = i8_lanes(blk + 32 + scale_row(j, fault) * 16);
        const __m512i c1 = i8_lanes(blk + 32 + scale_row(j + 1, fault) * 16);
        for (int m = 0; m < R; ++m)
            S[m] = _mm512_add_epi32(S[m], _mm512_add_epi32(_mm512_mullo_epi32(S0[m], c0), _mm512_mullo_epi32(S1[m], c1)));
    }
}

// A 4-bit 32-weight block's (Q4_0, Q4_1, Q5_0) quads k (positions 4k .. 4k + 3) and 4 + k (16 + 4k ..) of the 16 rows,
// one byte a weight (Q5_0 with its fifth bit: one 64-bit mask per vector of quants).
template <int64_t T>
inline void quads4(const uint8_t* blk, int k, __m512i& wl, __m512i& wh) {
    const __m512i m4 = _mm512_set1_epi8(0xf), v = load(blk + (T == kQ4_1 ? 64 : 32) + k * 64);
    wl = _mm512_and_si512(v, m4), wh = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
    if constexpr (T == kQ5_0) {
        const __m512i b16 = _mm512_set1_epi8(16);
        uint64_t ml, mh;
        std::memcpy(&ml, blk + 288 + 8 * k, 8);
        std::memcpy(&mh, blk + 288 + 8 * (4 + k), 8);
        wl = _mm512_mask_add_epi8(wl, _cvtu64_mask64(ml), wl, b16);
        wh = _mm512_mask_add_epi8(wh, _cvtu64_mask64(mh), wh, b16);
    }
}

// One 32-weight block of a group against R rows: S of every lane. Two chains per row (positions 0-15, 16-31).
template <int64_t T, bool V, int R, bool L2>
inline void block32(const uint8_t* blk, const RowsAt<R, L2>& at, __m512i (&S)[R]) {
    __m512i hi[R];
    for (int m = 0; m < R; ++m) {
        const int32_t sum = at.s32[m][0];
        // the offsets of stored quants, taken away from the start: Q4_0's + 8, Q5_0's + 16, Q8_0's + 128 on VNNI
        S[m] = _mm512_set1_epi32(T == kQ4_0 ? -8 * sum : T == kQ5_0 ? -16 * sum : T == kQ8_0 && V ? -128 * sum : 0);
        hi[m] = _mm512_setzero_si512();
    }
    if constexpr (T == kQ8_0) {
#pragma GCC unroll 4
        for (int k = 0; k < 4; ++k) {
            const __m512i w0 = load(blk + 32 + k * 64), w1 = load(blk + 32 + (4 + k) * 64);
            for (int m = 0; m < R; ++m) {
                S[m] = dp4_signed<V>(S[m], w0, quad(at.x[m] + 4 * k));
                hi[m] = dp4_signed<V>(hi[m], w1, quad(at.x[m] + 16 + 4 * k));
            }
        }
    } else {
#pragma GCC unroll 4
        for (int k = 0; k < 4; ++k) {
            __m512i wl, wh;
            quads4<T>(blk, k, wl, wh);
            for (int m = 0; m < R; ++m) {
                S[m] = dp4<V>(S[m], wl, quad(at.x[m] + 4 * k));
                hi[m] = dp4<V>(hi[m], wh, quad(at.x[m] + 16 + 4 * k));
            }
        }
    }
    for (int m = 0; m < R; ++m) S[m] = _mm512_add_epi32(S[m], hi[m]);
}

// Step 3 for one activation row and block, 16 outputs at a time: acc + the block's fp32 terms. d: the block's d
// of the 16 rows; dx: the row's activation scale there; sum32: the row's quant sum over the block (Q4_1).
template <int64_t T>
inline __m512 block_fp32(__m512 acc, __m512i S, __m512i Mn, __m512 d, const uint8_t* blk, float dx, int32_t sum32) {
    const __m512 vdx = _mm512_set1_ps(dx);
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(S), _mm512_mul_ps(d, vdx), acc);
    if constexpr (T == kQ4_K) {  // -(dmin * dx) == (-dmin) * dx exactly
        const __m512 ndmin = _mm512_sub_ps(_mm512_setzero_ps(), half_lanes(blk + 32));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(Mn), _mm512_mul_ps(ndmin, vdx), acc);
    } else if constexpr (T == kQ4_1) {
        acc = _mm512_fmadd_ps(_mm512_set1_ps(float(sum32)), _mm512_mul_ps(half_lanes(blk + 32), vdx), acc);
    }
    return acc;
}

// Group g's 16 outputs (+ bias) of activation rows m0 .. m0 + rows, from their accumulators.
inline void store_group(const GArgs& a, int64_t g, int64_t m0, int rows, const __m512* acc) {
    const int64_t n0 = g * kGroupRows;
    const __mmask16 keep = __mmask16((1u << std::min<int64_t>(kGroupRows, a.N - n0)) - 1);
    const __m512 bias = a.bias ? _mm512_maskz_loadu_ps(keep, a.bias + n0) : _mm512_setzero_ps();
    for (int m = 0; m < rows; ++m)
        _mm512_mask_storeu_ps(a.out + (m0 + m) * a.N + n0, keep, a.bias ? _mm512_add_ps(acc[m], bias) : acc[m]);
}

// Group g (16 outputs) x activation rows m0 .. m0 + R, prefetching into L2 where L2 (prefetch_ahead).
template <int64_t T, bool V, int R, bool L2>
void grouped_rows(const GArgs& a, int64_t g, int64_t m0) {
    const Acts& A = *a.acts;
    constexpr int64_t kW = block_weights(T), kBytes = group_bytes(T);
    constexpr int64_t kQuantsAt = T == kQ4_K ? 320 : T == kQ6_K ? 288 : kBytes;  // bytes before the quants
    const int64_t nb = a.K / kW;
    __m512 acc[R];
    for (int m = 0; m < R; ++m) acc[m] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = a.w + (g * nb + b) * kBytes;
        prefetch_ahead<L2>(blk, kQuantsAt, a.prefetch);  // a K-quant's quants: line by line as read (prefetch_line)
        RowsAt<R, L2> at;
        at.ahead = a.prefetch;
        for (int m = 0; m < R; ++m) {
            at.x[m] = A.q.data() + (m0 + m) * A.stride + kW * b;
            at.s16[m] = A.s16.data() + (m0 + m) * (a.K / 16) + kW / 16 * b;
            at.s32[m] = A.s32.data() + (m0 + m) * (a.K / 32) + kW / 32 * b;
            at.dx[m] = A.d[(m0 + m) * nb + b];
        }
        __m512i S[R], Mn[R] = {};
        if constexpr (T == kQ4_K) q4k_block<V, R>(blk, at, a.fault, S, Mn);
        else if constexpr (T == kQ6_K) q6k_block<V, R>(blk, at, a.fault, S);
        else block32<T, V, R>(blk, at, S);
        const __m512 d = half_lanes(kW == 256 ? blk : d_fields(blk, b, kBytes, a.fault));
        for (int m = 0; m < R; ++m) acc[m] = block_fp32<T>(acc[m], S[m], Mn[m], d, blk, at.dx[m], at.s32[m][0]);
    }
    store_group(a, g, m0, R, acc);
}

using Fn = void (*)(const GArgs&, int64_t, int64_t);
// grouped_rows by a pass's rows (index 0 unused); where L2 (GArgs::l2), passes of 2 rows and more prefetch into L2.
template <int64_t T, bool V, bool L2, int... Rs>
constexpr Fn kByRows[] = {nullptr, grouped_rows<T, V, Rs, L2 && Rs >= 2>...};

template <int64_t T, bool V>
void grouped_avx(const GArgs& a) {
    static_assert(sizeof(kByRows<T, V, false, 1, 2, 3, 4, 5, 6>) == (kMaxPass + 1) * sizeof(Fn), "a pass's rows");
    const Fn* fns = a.l2 ? kByRows<T, V, true, 1, 2, 3, 4, 5, 6> : kByRows<T, V, false, 1, 2, 3, 4, 5, 6>;
    const int64_t passes = (a.M + kMaxPass - 1) / kMaxPass;
#pragma omp parallel for schedule(static)
    for (int64_t g = 0; g < a.G; ++g) {
        for (int64_t p = 0, m0 = 0; p < passes; ++p) {  // near-equal passes; the group's bytes stay in cache
            const int rows = int((a.M - m0 + (passes - p) - 1) / (passes - p));
            fns[rows](a, g, m0);
            m0 += rows;
        }
    }
}

template <bool V>
void grouped_avx(const GArgs& a, int64_t t) {
    switch (t) {
        case kQ4_0: return grouped_avx<kQ4_0, V>(a);
        case kQ4_1: return grouped_avx<kQ4_1, V>(a);
        case kQ5_0: return grouped_avx<kQ5_0, V>(a);
        case kQ8_0: return grouped_avx<kQ8_0, V>(a);
        case kQ4_K: return grouped_avx<kQ4_K, V>(a);
        case kQ6_K: return grouped_avx<kQ6_K, V>(a);
    }
}

#pragma GCC pop_options

// ---- AVX2: the same integers and fp32 steps, 8 lanes at a time ----
// For x86 CPUs without AVX-512 (AMD Zen 2-3, Intel's client cores since Alder Lake). A group's 16 outputs are two
// halves of 8 lanes: rows 8h .. 8h + 7 are bytes 32h .. 32h + 31 of every 64-byte vector of quants, and their fp16
// and 8-bit fields are at 16h and 8h of each 16-row array. Each block is worked half 0, then half 1, so its bytes
// are read from memory once. The integer sums use vpmaddubsw and vpmaddwd as AVX-512BW's do (no pair sum
// saturates, as above; Q8_0's signs ride on the activations, vpsignb), and the fp32 steps are the same operations
// per lane, so the bits are the other paths'. AVX2 has 16 vector registers, not 32; a pass takes up to 6 rows all the same.
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace avx2 {

// Rows a pass: 6 took 0.6-0.95x the time of 4 at 5 and 9 rows, 8 no less than 6 (Q4_K, Q6_K, Q8_0 of the 1.5B's
// FFN shapes, 2-core AMD EPYC Zen 4 running this path, 2026-12-07).
constexpr int kMaxPass = 6;

inline __m256i dp4(__m256i acc, __m256i u, __m256i s) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}
// w signed (Q8_0): |w| against s with w's sign (vpsignb: s, -s or 0 as w is positive, negative or 0).
inline __m256i dp4_signed(__m256i acc, __m256i w, __m256i s) {
    return dp4(acc, _mm256_abs_epi8(w), _mm256_sign_epi8(s, w));
}
inline __m256i dp2(__m256i acc, __m256i a, __m256i b) { return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b)); }
// acc16 + the int16 pair sums of u * s (vpmaddubsw alone): several quads' pair sums add up in int16 before one
// vpmaddwd widens them (and applies a sub-block scale), where the bounds below leave room; int16 adds of values that
// never leave int16's range are exact.
inline __m256i dp4_16(__m256i acc16, __m256i u, __m256i s) { return _mm256_add_epi16(acc16, _mm256_maddubs_epi16(u, s)); }
// Each lane's value v (|v| < 2^15) as an int16 pair (v, v): vpmaddwd against it adds a lane's two int16 and
// multiplies by v.
inline __m256i pairs(__m256i v) {
    return _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi32(0xffff)), _mm256_slli_epi32(v, 16));
}
inline __m256i quad(const int8_t* p) { return _mm256_set1_epi32(*reinterpret_cast<const unaligned_i32*>(p)); }
inline __m256i pair16(const int16_t* p) { return _mm256_set1_epi32(*reinterpret_cast<const unaligned_i32*>(p)); }
inline __m128i bytes8(const uint8_t* p) { return _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)); }
inline __m256i u8_lanes(const uint8_t* p) { return _mm256_cvtepu8_epi32(bytes8(p)); }
inline __m256i i8_lanes(const uint8_t* p) { return _mm256_cvtepi8_epi32(bytes8(p)); }
inline __m256 half_lanes(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline __m256i load(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline void prefetch_line(const uint8_t* p, int64_t ahead) {
    _mm_prefetch(reinterpret_cast<const char*>(p + ahead), _MM_HINT_T0);
}
inline void prefetch_ahead(const uint8_t* blk, int64_t bytes, int64_t ahead) {
    for (int64_t o = 0; o < bytes; o += 64) prefetch_line(blk + o, ahead);
}

// The 32 bits of m as 32 bytes, 0xff where the bit is set (byte i from bit i).
inline __m256i bit_bytes(uint32_t m) {
    const __m256i byte_of_bit = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,  //
                                                 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(int(m)), byte_of_bit);
    const __m256i bit = _mm256_set1_epi64x(int64_t(0x8040201008040201ull));
    return _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
}

// One activation block's dx and quants (step 1): max and division and rounding are exact, the portable bits.
float quantize_block(const float* x, int64_t n, float shared_amax, bool shared, int8_t* q) {
    __m256 m = _mm256_setzero_ps();
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t i = 0; i < n; i += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    const float dx = (shared ? shared_amax : _mm_cvtss_f32(h)) / 127.0f;
    if (dx != 0.0f) {
        const __m256 vdx = _mm256_set1_ps(dx), lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
        for (int64_t i = 0; i < n; i += 32) {
            __m256i v[4];
            for (int c = 0; c < 4; ++c) {
                const __m256 r = _mm256_round_ps(_mm256_div_ps(_mm256_loadu_ps(x + i + 8 * c), vdx),
                                                 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                v[c] = _mm256_cvtps_epi32(_mm256_min_ps(hi, _mm256_max_ps(lo, r)));
            }
            // The packs (exact: |v| <= 127) interleave 128-bit lanes: 4-byte pieces come out as v0 0-3, v1 0-3, v2
            // 0-3, v3 0-3, v0 4-7, ...; the permute puts them in order.
            const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + i),
                                _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
        }
    }
    return dx;
}

// Half h of one Q4_K super-block against R rows: S and Mn of its 8 lanes.
template <int R>
inline void q4k_block(const uint8_t* blk, int h, const RowsAt<R>& at, bool fault, __m256i (&S)[R], __m256i (&Mn)[R]) {
    const __m256i m4 = _mm256_set1_epi8(0xf);
    for (int m = 0; m < R; ++m) S[m] = _mm256_setzero_si256(), Mn[m] = _mm256_setzero_si256();
    for (int i = 0; i < 4; ++i) {
        // Sub-blocks 2i and 2i + 1 in int16 pair sums: |sum| <= 8 quads x 2 x 15 x 127 = 30,480.
        __m256i lo[R], hi[R];
        for (int m = 0; m < R; ++m) lo[m] = _mm256_setzero_si256(), hi[m] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int k = 0; k < 8; ++k) {
            const uint8_t* line = blk + 320 + (i * 8 + k) * 64;
            if (h == 0) prefetch_line(line, at.ahead);
            const __m256i v = load(line + 32 * h);
            const __m256i wl = _mm256_and_si256(v, m4), wh = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            for (int m = 0; m < R; ++m) {
                lo[m] = dp4_16(lo[m], wl, quad(at.x[m] + 64 * i + 4 * k));
                hi[m] = dp4_16(hi[m], wh, quad(at.x[m] + 64 * i + 32 + 4 * k));
            }
        }
        const __m256i sl = pairs(u8_lanes(blk + 64 + scale_row(2 * i, fault) * 16 + 8 * h));
        const __m256i sh = pairs(u8_lanes(blk + 64 + scale_row(2 * i + 1, fault) * 16 + 8 * h));
        for (int m = 0; m < R; ++m) S[m] = dp2(dp2(S[m], lo[m], sl), hi[m], sh);
    }
    for (int p = 0; p < 4; ++p) {  // the mins of sub-blocks 2p and 2p + 1 as an int16 pair against the row's sums
        const __m256i mn = _mm256_or_si256(u8_lanes(blk + 192 + 32 * p + 8 * h),
                                           _mm256_slli_epi32(u8_lanes(blk + 208 + 32 * p + 8 * h), 16));
        for (int m = 0; m < R; ++m) Mn[m] = dp2(Mn[m], mn, pair16(at.s32[m] + 2 * p));
    }
}

// Half h of quad 4j + 4S + k's stored Q6_K quants (as q6k_quads above).
template <int S>
inline __m256i q6k_quads(const uint8_t* blk, int h, int j, int k) {
    const __m256i ql = load(q6k_ql(blk, j / 2, k) + 32 * h), qh = load(q6k_qh(blk, j / 2, k) + 32 * h);
    const __m256i low = _mm256_and_si256(S ? _mm256_srli_epi16(ql, 4) : ql, _mm256_set1_epi8(0xf));
    const int shift = 2 * (2 * (k % 2) + S);
    const __m256i moved = shift < 4 ? _mm256_slli_epi16(qh, 4 - shift) : _mm256_srli_epi16(qh, shift - 4);
    return _mm256_or_si256(low, _mm256_and_si256(moved, _mm256_set1_epi8(0x30)));
}

// Half h of one Q6_K super-block against R rows: S of its 8 lanes.
template <int R>
inline void q6k_block(const uint8_t* blk, int h, const RowsAt<R>& at, bool fault, __m256i (&S)[R]) {
    // S = sum_j sc_j (sum q6 x - 32 s16_j): the quants' part by sub-block, two quads at a time in int16 pair sums
    // (|sum| <= 2 x 2 x 63 x 127 = 32,004) widened and scaled by one vpmaddwd; the offsets' part, sum_j sc_j s16_j,
    // two sub-blocks per vpmaddwd (Off), then times -32.
    __m256i Off[R];
    for (int m = 0; m < R; ++m) S[m] = _mm256_setzero_si256(), Off[m] = _mm256_setzero_si256();
    for (int j = 0; j < 16; j += 2) {
        const __m256i c0 = i8_lanes(blk + 32 + scale_row(j, fault) * 16 + 8 * h);
        const __m256i c1 = i8_lanes(blk + 32 + scale_row(j + 1, fault) * 16 + 8 * h);
        const __m256i p0 = pairs(c0), p1 = pairs(c1);
#pragma GCC unroll 2
        for (int k = 0; k < 4; k += 2) {
            const __m256i w0 = q6k_quads<0>(blk, h, j, k), w1 = q6k_quads<1>(blk, h, j, k);
            const __m256i v0 = q6k_quads<0>(blk, h, j, k + 1), v1 = q6k_quads<1>(blk, h, j, k + 1);
            if (h == 0) {
                prefetch_line(q6k_ql(blk, j / 2, k), at.ahead);
                prefetch_line(q6k_ql(blk, j / 2, k + 1), at.ahead);
                prefetch_line(q6k_qh(blk, j / 2, k), at.ahead);
            }
            for (int m = 0; m < R; ++m) {
                const int8_t* x = at.x[m] + 16 * j + 4 * k;
                const __m256i t0 = dp4_16(_mm256_maddubs_epi16(w0, quad(x)), v0, quad(x + 4));
                const __m256i t1 = dp4_16(_mm256_maddubs_epi16(w1, quad(x + 16)), v1, quad(x + 20));
                S[m] = dp2(dp2(S[m], t0, p0), t1, p1);
            }
        }
        // (sc_j, sc_j+1) against (s16_j, s16_j+1) as int16 pairs: |sc| <= 128, |s16| <= 2,032
        const __m256i cc = _mm256_blend_epi16(c0, _mm256_slli_epi32(c1, 16), 0xaa);
        for (int m = 0; m < R; ++m) Off[m] = dp2(Off[m], cc, pair16(at.s16[m] + j));
    }
    for (int m = 0; m < R; ++m) S[m] = _mm256_sub_epi32(S[m], _mm256_slli_epi32(Off[m], 5));
}

// Half h of a 4-bit 32-weight block's quads k and 4 + k (as quads4 above; Q5_0's fifth bits from its masks).
template <int64_t T>
inline void quads4(const uint8_t* blk, int h, int k, __m256i& wl, __m256i& wh) {
    const __m256i m4 = _mm256_set1_epi8(0xf), v = load(blk + (T == kQ4_1 ? 64 : 32) + k * 64 + 32 * h);
    wl = _mm256_and_si256(v, m4), wh = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    if constexpr (T == kQ5_0) {
        uint32_t ml, mh;
        std::memcpy(&ml, blk + 288 + 8 * k + 4 * h, 4);
        std::memcpy(&mh, blk + 288 + 8 * (4 + k) + 4 * h, 4);
        const __m256i b16 = _mm256_set1_epi8(16);
        wl = _mm256_add_epi8(wl, _mm256_and_si256(bit_bytes(ml), b16));
        wh = _mm256_add_epi8(wh, _mm256_and_si256(bit_bytes(mh), b16));
    }
}

// Half h of one 32-weight block against R rows: S of its 8 lanes.
// The 4-bit types' quads add up in int16 pair sums: |sum| <= 4 quads x 2 x 31 x 127 = 31,496 per half-block (Q5_0),
// 8 x 2 x 15 x 127 = 30,480 for the whole block (Q4_0, Q4_1). Q8_0's pair sums reach 32,512: one vpmaddwd each.
template <int64_t T, int R>
inline void block32(const uint8_t* blk, int h, const RowsAt<R>& at, __m256i (&S)[R]) {
    __m256i lo[R], hi[R];
    for (int m = 0; m < R; ++m) lo[m] = _mm256_setzero_si256(), hi[m] = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
        __m256i wl, wh;
        if constexpr (T == kQ8_0) {
            wl = load(blk + 32 + k * 64 + 32 * h), wh = load(blk + 32 + (4 + k) * 64 + 32 * h);
            for (int m = 0; m < R; ++m) {
                lo[m] = dp4_signed(lo[m], wl, quad(at.x[m] + 4 * k));
                hi[m] = dp4_signed(hi[m], wh, quad(at.x[m] + 16 + 4 * k));
            }
        } else {
            quads4<T>(blk, h, k, wl, wh);
            for (int m = 0; m < R; ++m) {
                lo[m] = dp4_16(lo[m], wl, quad(at.x[m] + 4 * k));
                hi[m] = dp4_16(hi[m], wh, quad(at.x[m] + 16 + 4 * k));
            }
        }
    }
    const __m256i ones = _mm256_set1_epi16(1);
    for (int m = 0; m < R; ++m) {
        const int32_t sum = at.s32[m][0];  // the offsets of stored quants: Q4_0's + 8, Q5_0's + 16
        const __m256i start = _mm256_set1_epi32(T == kQ4_0 ? -8 * sum : T == kQ5_0 ? -16 * sum : 0);
        if constexpr (T == kQ8_0) S[m] = _mm256_add_epi32(lo[m], hi[m]);
        else if constexpr (T == kQ5_0) S[m] = dp2(dp2(start, lo[m], ones), hi[m], ones);
        else S[m] = dp2(start, _mm256_add_epi16(lo[m], hi[m]), ones);
    }
}

// Step 3 for half h of one activation row and block (as block_fp32 above).
template <int64_t T>
inline __m256 block_fp32(__m256 acc, __m256i S, __m256i Mn, __m256 d, const uint8_t* blk, int h, float dx, int32_t sum32) {
    const __m256 vdx = _mm256_set1_ps(dx);
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(S), _mm256_mul_ps(d, vdx), acc);
    if constexpr (T == kQ4_K) {
        const __m256 ndmin = _mm256_sub_ps(_mm256_setzero_ps(), half_lanes(blk + 32 + 16 * h));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(Mn), _mm256_mul_ps(ndmin, vdx), acc);
    } else if constexpr (T == kQ4_1) {
        acc = _mm256_fmadd_ps(_mm256_set1_ps(float(sum32)), _mm256_mul_ps(half_lanes(blk + 32 + 16 * h), vdx), acc);
    }
    return acc;
}

// Group g's 16 outputs (+ bias) of activation rows m0 .. m0 + rows, from their accumulators ([half][row]).
template <int R>
inline void store_group(const GArgs& a, int64_t g, int64_t m0, const __m256 (&acc)[2][R]) {
    for (int h = 0; h < 2; ++h) {
        const int64_t n0 = g * kGroupRows + 8 * h, live = std::min<int64_t>(8, a.N - n0);
        if (live <= 0) return;
        const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(int(live)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        const __m256 bias = a.bias ? _mm256_maskload_ps(a.bias + n0, keep) : _mm256_setzero_ps();
        for (int m = 0; m < R; ++m)
            _mm256_maskstore_ps(a.out + (m0 + m) * a.N + n0, keep, a.bias ? _mm256_add_ps(acc[h][m], bias) : acc[h][m]);
    }
}

// Group g (16 outputs) x activation rows m0 .. m0 + R.
template <int64_t T, int R>
void grouped_rows(const GArgs& a, int64_t g, int64_t m0) {
    const Acts& A = *a.acts;
    constexpr int64_t kW = block_weights(T), kBytes = group_bytes(T);
    constexpr int64_t kQuantsAt = T == kQ4_K ? 320 : T == kQ6_K ? 288 : kBytes;
    const int64_t nb = a.K / kW;
    __m256 acc[2][R];
    for (int h = 0; h < 2; ++h)
        for (int m = 0; m < R; ++m) acc[h][m] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = a.w + (g * nb + b) * kBytes;
        prefetch_ahead(blk, kQuantsAt, a.prefetch);
        RowsAt<R> at;
        at.ahead = a.prefetch;
        for (int m = 0; m < R; ++m) {
            at.x[m] = A.q.data() + (m0 + m) * A.stride + kW * b;
            at.s16[m] = A.s16.data() + (m0 + m) * (a.K / 16) + kW / 16 * b;
            at.s32[m] = A.s32.data() + (m0 + m) * (a.K / 32) + kW / 32 * b;
            at.dx[m] = A.d[(m0 + m) * nb + b];
        }
        for (int h = 0; h < 2; ++h) {
            __m256i S[R], Mn[R] = {};
            if constexpr (T == kQ4_K) q4k_block<R>(blk, h, at, a.fault, S, Mn);
            else if constexpr (T == kQ6_K) q6k_block<R>(blk, h, at, a.fault, S);
            else block32<T, R>(blk, h, at, S);
            const __m256 d = half_lanes((kW == 256 ? blk : d_fields(blk, b, kBytes, a.fault)) + 16 * h);
            for (int m = 0; m < R; ++m) acc[h][m] = block_fp32<T>(acc[h][m], S[m], Mn[m], d, blk, h, at.dx[m], at.s32[m][0]);
        }
    }
    store_group<R>(a, g, m0, acc);
}

template <int64_t T>
void grouped(const GArgs& a) {
    using Fn = void (*)(const GArgs&, int64_t, int64_t);
    static constexpr Fn by_rows[kMaxPass + 1] = {nullptr,            grouped_rows<T, 1>, grouped_rows<T, 2>,
                                                 grouped_rows<T, 3>, grouped_rows<T, 4>, grouped_rows<T, 5>,
                                                 grouped_rows<T, 6>};
    const int64_t passes = (a.M + kMaxPass - 1) / kMaxPass;
#pragma omp parallel for schedule(static)
    for (int64_t g = 0; g < a.G; ++g) {
        for (int64_t p = 0, m0 = 0; p < passes; ++p) {
            const int rows = int((a.M - m0 + (passes - p) - 1) / (passes - p));
            by_rows[rows](a, g, m0);
            m0 += rows;
        }
    }
}

void grouped(const GArgs& a, int64_t t) {
    switch (t) {
        case kQ4_0: return grouped<kQ4_0>(a);
        case kQ4_1: return grouped<kQ4_1>(a);
        case kQ5_0: return grouped<kQ5_0>(a);
        case kQ8_0: return grouped<kQ8_0>(a);
        case kQ4_K: return grouped<kQ4_K>(a);
        case kQ6_K: return grouped<kQ6_K>(a);
    }
}

}  // namespace avx2
#pragma GCC pop_options

// ---- AMX: the same integers from int8 tiles (many rows: prompt chunks) ----
// A tile product C[m][n] += sum_k A[m][k] * B[k / 4][4 n + k % 4] (TDPBSSD: int8 x int8, int32 sums, exact) takes
// the activation quants of up to 16 rows at one 32-weight block as A and the block's weights of 16 outputs in the
// groups' own order (16 outputs x 4 positions per 64 bytes, models/row_groups.py) as B: C is S of that block for
// 16 rows x 16 outputs. Each C is stored and finished by the vector code's fp32 steps (block_fp32), so the bits are
// VNNI's: the same exact integers, whichever unit adds them. On a 2-core Intel Xeon, 4,864 x 896 weights: 0.60-0.83x
// VNNI's time at 16-128 rows, about 1.0x at 8 (experiments/amx_prefill.py).
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,f16c,amx-tile,amx-int8")

constexpr int kAmxRows = 16;  // a tile's rows: activation rows per pass

struct alignas(64) TileConfig {
    uint8_t palette = 1, start_row = 0;
    uint8_t reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
};

// This thread's tiles: 0, 1 sums [R rows x 16 outputs int32]; 2, 3 quants [R x 32]; 4, 5 weights [8 x 64].
void configure_tiles(int R) {
    TileConfig c;
    for (int t : {0, 1}) c.rows[t] = uint8_t(R), c.colsb[t] = 64;
    for (int t : {2, 3}) c.rows[t] = uint8_t(R), c.colsb[t] = 32;
    for (int t : {4, 5}) c.rows[t] = 8, c.colsb[t] = 64;
    // Not _tile_loadconfig: GCC 12's tells the compiler that only 8 bytes are read, and the other stores go.
    asm volatile("ldtilecfg %0" : : "m"(c));
}

// Two blocks: quants at x and x + 32 (rows `stride` bytes apart) against weights w0, w1 (8 tile rows of 64 bytes);
// the sums to c0, c1 ([R][16] int32).
inline void tiles_pair(const int8_t* x, int64_t stride, const void* w0, const void* w1, int32_t* c0, int32_t* c1) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_loadd(2, x, stride);
    _tile_loadd(3, x + 32, stride);
    _tile_loadd(4, w0, 64);
    _tile_loadd(5, w1, 64);
    _tile_dpbssd(0, 2, 4);
    _tile_dpbssd(1, 3, 5);
    _tile_stored(0, c0, 64);
    _tile_stored(1, c1, 64);
}

inline void tiles_one(const int8_t* x, int64_t stride, const void* w, int32_t* c) {
    _tile_zero(0);
    _tile_loadd(2, x, stride);
    _tile_loadd(4, w, 64);
    _tile_dpbssd(0, 2, 4);
    _tile_stored(0, c, 64);
}

inline __m512i sums(const int32_t* c, int m) { return _mm512_load_si512(c + 16 * m); }

// Group g's 4-bit weights, every block, as tile rows (64 bytes: 16 outputs x 4 positions), 8 rows a block: done
// once per group and call, before any tile reads them (a tile load waits for stores just made: unpacked block by
// block, these types ran no faster than on VNNI). Q8_0's quants are tile rows as stored and are read in place.
template <int64_t T>
void unpack_group(const GArgs& a, int64_t g, int8_t* out) {
    constexpr int64_t kBytes = group_bytes(T);
    const int64_t nb = a.K / 32;
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = a.w + (g * nb + b) * kBytes;
        prefetch_ahead(blk, kBytes, a.prefetch);
        for (int k = 0; k < 4; ++k) {  // positions 4k.. to tile row k, 16 + 4k.. to row 4 + k
            __m512i wl, wh;
            quads4<T>(blk, k, wl, wh);
            _mm512_store_si512(out + 512 * b + 64 * k, wl);
            _mm512_store_si512(out + 512 * b + 64 * (4 + k), wh);
        }
    }
}

// Group g x activation rows m0 .. m0 + rows (rows <= the tiles' R; the quants are padded to whole tiles), its 4-bit
// weights unpacked in wt: two blocks' tile products at a time, then each block's steps.
template <int64_t T>
void amx_rows(const GArgs& a, int64_t g, int64_t m0, int rows, const int8_t* wt) {
    const Acts& A = *a.acts;
    constexpr int64_t kBytes = group_bytes(T);
    const int64_t nb = a.K / 32;
    alignas(64) int32_t c[2][kAmxRows * 16];
    __m512 acc[kAmxRows];
    for (int m = 0; m < rows; ++m) acc[m] = _mm512_setzero_ps();
    const int8_t* x0 = A.q.data() + m0 * A.stride;
    const uint8_t* w = a.w + g * nb * kBytes;
    for (int64_t b = 0; b < nb; b += 2) {
        const int n = nb - b >= 2 ? 2 : 1;
        const void* w0 = T == kQ8_0 ? static_cast<const void*>(w + b * kBytes + 32) : wt + 512 * b;
        const void* w1 = T == kQ8_0 ? static_cast<const void*>(w + (b + 1) * kBytes + 32) : wt + 512 * (b + 1);
        if (n == 2) tiles_pair(x0 + 32 * b, A.stride, w0, w1, c[0], c[1]);
        else tiles_one(x0 + 32 * b, A.stride, w0, c[0]);
        for (int i = 0; i < n; ++i) {
            const uint8_t* blk = w + (b + i) * kBytes;
            if (T == kQ8_0) prefetch_ahead(blk, kBytes, a.prefetch);
            const __m512 d = half_lanes(d_fields(blk, b + i, kBytes, a.fault));
            for (int m = 0; m < rows; ++m) {  // Q4_0's stored + 8 and Q5_0's + 16, taken away
                const int32_t sum = A.s32[(m0 + m) * (a.K / 32) + b + i];
                const int32_t offset = T == kQ4_0 ? -8 * sum : T == kQ5_0 ? -16 * sum : 0;
                const __m512i S = _mm512_add_epi32(sums(c[i], m), _mm512_set1_epi32(offset));
                acc[m] = block_fp32<T>(acc[m], S, S, d, blk, A.d[(m0 + m) * nb + b + i], sum);
            }
        }
    }
    store_group(a, g, m0, rows, acc);
}

// Passes of R rows (the last one may have fewer real rows): one tile shape for the whole call.
int64_t amx_passes(int64_t M) { return (M + kAmxRows - 1) / kAmxRows; }
int amx_pass_rows(int64_t M) { return int((M + amx_passes(M) - 1) / amx_passes(M)); }
// The activation rows quantized for a call on path AMX: whole passes for the 32-weight types' tiles (the padding
// rows' quants are zeros); the K-quants take VNNI's code there, which reads only the real rows.
int64_t amx_padded_rows(int64_t M, int64_t t) { return block_weights(t) == 32 ? amx_passes(M) * amx_pass_rows(M) : M; }

template <int64_t T>
void grouped_amx(const GArgs& a) {
    const int R = amx_pass_rows(a.M);
#pragma omp parallel
    {
        configure_tiles(R);
        std::vector<int8_t> wt(T == kQ8_0 ? 0 : 16 * a.K + 64);  // a group's 4-bit weights as tile rows
        int8_t* w = wt.data() + (64 - reinterpret_cast<uintptr_t>(wt.data()) % 64) % 64;
#pragma omp for schedule(static)
        for (int64_t g = 0; g < a.G; ++g) {
            if (T != kQ8_0) unpack_group<T>(a, g, w);
            for (int64_t m0 = 0; m0 < a.M; m0 += R) amx_rows<T>(a, g, m0, int(std::min<int64_t>(R, a.M - m0)), w);
        }
        _tile_release();
    }
}

// The K-quants take VNNI's code on this path: their sub-block scales are applied to each sub-block's sums in
// integers, one vpmulld per row and sub-block, and that, not the dot products, bounds them (taken through tiles
// too, they ran no faster than VNNI).
void grouped_amx(const GArgs& a, int64_t t) {
    switch (t) {
        case kQ4_0: return grouped_amx<kQ4_0>(a);
        case kQ4_1: return grouped_amx<kQ4_1>(a);
        case kQ5_0: return grouped_amx<kQ5_0>(a);
        case kQ8_0: return grouped_amx<kQ8_0>(a);
        case kQ4_K: return grouped_avx<kQ4_K, true>(a);
        case kQ6_K: return grouped_avx<kQ6_K, true>(a);
    }
}

#pragma GCC pop_options
#endif  // QUANT_INT8_X86

at::Tensor quant_int8_grouped_linear(const at::Tensor& x, const at::Tensor& groups, int64_t qtype, int64_t in_features,
                                     int64_t out_features, const std::optional<at::Tensor>& bias, int64_t path) {
    const int64_t bytes = group_bytes(qtype), kw = block_weights(qtype);
    TORCH_CHECK(bytes > 0, "quant_int8_grouped_linear: unsupported GGML type ", qtype);
    TORCH_CHECK(x.scalar_type() == at::kFloat && x.device().is_cpu(), "quant_int8_grouped_linear: x must be fp32 on the CPU");
    TORCH_CHECK(in_features > 0 && in_features % kw == 0, "quant_int8_grouped_linear: in_features ", in_features,
                " is not a multiple of the block size ", kw);
    const int64_t G = (out_features + kGroupRows - 1) / kGroupRows;
    TORCH_CHECK(groups.scalar_type() == at::kByte && groups.dim() == 2 && groups.is_contiguous() && groups.device().is_cpu() &&
                    groups.size(0) == G && groups.size(1) == in_features / kw * bytes,
                "quant_int8_grouped_linear: groups must be a contiguous uint8 [", G, ", ", in_features / kw * bytes,
                "] CPU tensor (models/row_groups.py)");
    TORCH_CHECK(x.size(-1) == in_features, "quant_int8_grouped_linear: x has ", x.size(-1), " features, the weight ",
                in_features);
    if (bias) {
        TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->dim() == 1 && bias->size(0) == out_features &&
                        bias->is_contiguous() && bias->device().is_cpu(),
                    "quant_int8_grouped_linear: bias must be a contiguous fp32 [out] CPU tensor");
    }
    TORCH_CHECK(path >= kAuto && path <= kAvx2, "quant_int8_grouped_linear: path is 0 (auto), 1 (VNNI), 2 (BW), 3 "
                                                "(portable), 4 (AMX) or 5 (AVX2)");
    TORCH_CHECK(path != kVnni || (features() & 1), "quant_int8_grouped_linear: this CPU has no AVX512-VNNI");
    TORCH_CHECK(path != kBw || (features() & 2), "quant_int8_grouped_linear: this CPU has no AVX-512BW");
    TORCH_CHECK(path != kAmx || (features() & 4), "quant_int8_grouped_linear: this CPU (or its OS) gives no AMX-INT8");
    TORCH_CHECK(path != kAvx2 || (features() & 8), "quant_int8_grouped_linear: this CPU has no AVX2 (with FMA, F16C)");
    const int64_t M = x.numel() / in_features;
    if (path == kAuto) {
        const bool amx = (features() & 4) && g_amx_from > 0 && M >= g_amx_from;
        path = amx ? kAmx : (features() & 1) ? kVnni : (features() & 2) ? kBw : (features() & 8) ? kAvx2 : kPortable;
    }

    const at::Tensor rows = x.reshape({-1, in_features}).contiguous();     // [M, K]
    at::Tensor out = at::empty({rows.size(0), out_features}, x.options());  // [M, N]
    if (M > 0 && out_features > 0) {
        Acts acts;
        int64_t pad_rows = M;
#if QUANT_INT8_X86
        if (path == kAmx) pad_rows = amx_padded_rows(M, qtype);
#endif
        const Quantizer how = path == kPortable ? kQuantPortable : path == kAvx2 ? kQuantAvx2 : kQuantAvx512;
        quantize(rows.data_ptr<float>(), M, pad_rows, in_features, kw, g_fault == kFaultShared, how, acts);
        const GArgs a{&acts, groups.data_ptr<uint8_t>(), bias ? bias->data_ptr<float>() : nullptr, out.data_ptr<float>(),
                      M, in_features, out_features, G, g_fault == kFaultScale, g_prefetch, g_l2};
#if QUANT_INT8_X86
        if (path == kAmx) grouped_amx(a, qtype);
        else if (path == kVnni) grouped_avx<true>(a, qtype);
        else if (path == kBw) grouped_avx<false>(a, qtype);
        else if (path == kAvx2) avx2::grouped(a, qtype);
        else
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
// The prefetch distance in bytes (a multiple of 64): set it (experiments) when `bytes` >= 0; returns the one in use.
int64_t specdecode_quant_int8_prefetch(int64_t bytes) {
    if (bytes >= 0) g_prefetch = bytes / 64 * 64;
    return g_prefetch;
}
// The rows from which AUTO takes AMX: set it when `rows` >= 0 (0: never); returns the one in use.
int64_t specdecode_quant_int8_amx_from(int64_t rows) {
    if (rows >= 0) g_amx_from = rows;
    return g_amx_from;
}
}

TORCH_LIBRARY_FRAGMENT(specdecode, m) {
    m.def("quant_int8_grouped_linear(Tensor x, Tensor groups, int qtype, int in_features, int out_features, "
          "Tensor? bias=None, int path=0) -> Tensor");
    m.def("quant_int8_features() -> int", &features);
}

TORCH_LIBRARY_IMPL(specdecode, CPU, m) { m.impl("quant_int8_grouped_linear", &quant_int8_grouped_linear); }
