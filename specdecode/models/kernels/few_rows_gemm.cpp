// out[M, N] = x[M, K] @ W^T for a few rows M, fp32, W packed once as [N / 16, K, 16] panels.
//
// Threads split the panels in groups of P (3 panels up to 7 rows, else 2). For a group and a block of at most
// 12 rows, one 16-wide accumulator per (row, panel) stays in registers while k walks from 0 to K - 1: P loads
// of 16 weights, then each x[m, k] is broadcast once and feeds P FMAs. A group's weights come from memory once
// (a second row block finds them in L2), so at up to ~9 rows the FMAs hide under the weight stream and a
// verify of several tokens costs about what one token does. Every output element is the same k-ordered chain
// of FMAs whatever M, the blocking or the thread count: a row's result does not depend on the rows beside it.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

namespace {

constexpr int kPanel = 16;
constexpr int kBlockRows = 12;  // 12 rows x 2 panels = 24 accumulators of the 32 AVX-512 registers

template <int M, int P>
void block(const float* x, const float* w, float* out, int64_t K, int64_t N) {
    __m512 acc[P][M];
    for (int p = 0; p < P; ++p)
        for (int m = 0; m < M; ++m) acc[p][m] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; ++k) {
        __m512 wk[P];
        for (int p = 0; p < P; ++p) wk[p] = _mm512_loadu_ps(w + (p * K + k) * kPanel);
#pragma GCC unroll 12
        for (int m = 0; m < M; ++m) {
            const __m512 xm = _mm512_set1_ps(x[m * K + k]);
            for (int p = 0; p < P; ++p) acc[p][m] = _mm512_fmadd_ps(xm, wk[p], acc[p][m]);
        }
    }
    for (int p = 0; p < P; ++p)
        for (int m = 0; m < M; ++m) _mm512_storeu_ps(out + m * N + p * kPanel, acc[p][m]);
}

using BlockFn = void (*)(const float*, const float*, float*, int64_t, int64_t);

template <int P, int... Ms>
constexpr BlockFn kBlocks[] = {nullptr, block<Ms, P>...};

// The blocks of up to kBlockRows rows over P panels, indexed by row count.
const BlockFn* blocks(int P) {
    if (P == 3) return kBlocks<3, 1, 2, 3, 4, 5, 6, 7>;
    if (P == 2) return kBlocks<2, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12>;
    return kBlocks<1, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12>;
}

// Panels [first, first + P) for every row block.
void group(const float* x, const float* packed, float* out, int64_t M, int64_t K, int64_t N, int64_t first, int P) {
    const BlockFn* fns = blocks(P);
    for (int64_t r = 0; r < M; r += kBlockRows) {
        const int64_t m = std::min<int64_t>(kBlockRows, M - r);
        fns[m](x + r * K, packed + first * K * kPanel, out + r * N + first * kPanel, K, N);
    }
}

}  // namespace

extern "C" {

// x [M, K] row-major, packed [N / 16, K, 16], out [M, N] row-major; N % 16 == 0, any M >= 1.
void few_rows_gemm(const float* x, const float* packed, float* out, int64_t M, int64_t K, int64_t N) {
    const int P = M <= 7 ? 3 : 2;
    const int64_t num_panels = N / kPanel, num_groups = num_panels / P;
#pragma omp parallel for schedule(static)
    for (int64_t g = 0; g < num_groups; ++g) group(x, packed, out, M, K, N, g * P, P);
    for (int64_t p = num_groups * P; p < num_panels; ++p) group(x, packed, out, M, K, N, p, 1);  // the rest
}

}
