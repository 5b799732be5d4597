// Products of many rows of bfloat16 x with bfloat16, int8 or int4 W on AVX-512 BF16 vectors, for
// without AMX tiles (an AMD EPYC): gemm_panels.h's panels, each met by every row of x with
// VDPBF16PS, one row of W per 32-bit lane:
//     acc[m][lane n] += w[n][2p]·x[m][2p] + w[n][2p + 1]·x[m][2p + 1]
// x's pair (2p, 2p + 1) broadcast to every lane from memory, the panel's pair row loaded once
// for kRows rows of x. Lanes are rows of W, so the 16 sums of a row of y are one vector: no
// lane sums (gemv.cpp's lane-per-k loops need a tree of them per 16 results), and the bias, the
// residual and one rounding go straight onto it. kRows = 14 rows of x against two panels hold
// 28 accumulators, two panel rows and a broadcast in 31 of the 32 registers (12 rows ran 2-7%
// slower: [3072, 576] warm, 32 to 1,024 rows, the AMX-less path forced on the Intel Xeon).
//
// Rounding is the tiles': bfloat16 products summed in float32 (in another order), then bias and
// residual, rounded once.
#include "gemm_panels.h"

#include <cstring>

namespace llmbench_gemm {

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
namespace {

constexpr int kRows = 14;  // rows of x a pass over one or two panels

// Rows m .. m + R of y for blocks n0 and (kTwo) n0 + 16: x rows x_row apart, `pairs` pairs of k.
template <int R, bool kTwo>
void rows_times_panels(const uint16_t* x, int64_t x_row, int64_t pairs, const uint16_t* p0,
                       const uint16_t* p1, const Epilogue& e, int64_t N, int64_t m, int64_t n0) {
  __m512 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    const __m512bh w0 = reinterpret_cast<__m512bh>(_mm512_load_si512(p0 + 2 * kBlockRows * p));
    __m512bh w1;
    if (kTwo) w1 = reinterpret_cast<__m512bh>(_mm512_load_si512(p1 + 2 * kBlockRows * p));
    for (int r = 0; r < R; ++r) {
      int32_t pair;
      std::memcpy(&pair, x + r * x_row + 2 * p, sizeof pair);
      const __m512bh xb = reinterpret_cast<__m512bh>(_mm512_set1_epi32(pair));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], w0, xb);
      if (kTwo) acc[r][1] = _mm512_dpbf16_ps(acc[r][1], w1, xb);
    }
  }
  const __mmask16 valid0 = valid_columns(N, n0);
  for (int r = 0; r < R; ++r) finish_row(e, N, m + r, n0, valid0, acc[r][0]);
  if (kTwo) {
    const __mmask16 valid1 = valid_columns(N, n0 + kBlockRows);
    for (int r = 0; r < R; ++r) finish_row(e, N, m + r, n0 + kBlockRows, valid1, acc[r][1]);
  }
}

// Rows m_begin .. m_end of y for one or two blocks: kRows at a time, the rest by 8, 4, 2, 1.
template <bool kTwo>
void rows_of_x(const uint16_t* x, int64_t x_row, int64_t pairs, const uint16_t* p0,
               const uint16_t* p1, const Epilogue& e, int64_t N, int64_t m_begin, int64_t m_end,
               int64_t n0) {
  for (int64_t m = m_begin; m < m_end;) {
    const int64_t left = m_end - m;
    const uint16_t* xm = x + m * x_row;
    int step;
    if (left >= kRows) {
      rows_times_panels<kRows, kTwo>(xm, x_row, pairs, p0, p1, e, N, m, n0);
      step = kRows;
    } else if (left >= 8) {
      rows_times_panels<8, kTwo>(xm, x_row, pairs, p0, p1, e, N, m, n0);
      step = 8;
    } else if (left >= 4) {
      rows_times_panels<4, kTwo>(xm, x_row, pairs, p0, p1, e, N, m, n0);
      step = 4;
    } else if (left >= 2) {
      rows_times_panels<2, kTwo>(xm, x_row, pairs, p0, p1, e, N, m, n0);
      step = 2;
    } else {
      rows_times_panels<1, kTwo>(xm, x_row, pairs, p0, p1, e, N, m, n0);
      step = 1;
    }
    m += step;
  }
}

// Every row of x against the blocks from block_begin to block_end, filled by fill(b, panel).
template <typename Fill>
void rows_times_blocks(const uint16_t* x, int64_t x_row, int64_t M, int64_t N, int64_t K,
                       int64_t block_begin, int64_t block_end, const Epilogue& e, Fill&& fill) {
  const int64_t m_chunks = (M + kBlockRows - 1) / kBlockRows;
  auto multiply = [&](int64_t b, bool two_n, const uint16_t* p0, const uint16_t* p1,
                      int64_t mc_begin, int64_t mc_end) {
    const int64_t m_begin = mc_begin * kBlockRows, m_end = std::min(mc_end * kBlockRows, M);
    if (two_n)
      rows_of_x<true>(x, x_row, K / 2, p0, p1, e, N, m_begin, m_end, b * kBlockRows);
    else
      rows_of_x<false>(x, x_row, K / 2, p0, p1, e, N, m_begin, m_end, b * kBlockRows);
  };
  over_panels(K * kBlockRows, m_chunks, block_begin, block_end, fill, multiply);
}

}  // namespace

bool vectors_available() { return true; }

void gemm_quant_vectors(const uint16_t* x, int64_t x_row, int64_t M, int64_t N,
                        const QuantWeights& w, int64_t block_begin, int64_t block_end,
                        const Epilogue& e) {
  rows_times_blocks(x, x_row, M, N, w.groups * kChunkK, block_begin, block_end, e,
                    [&](int64_t b, uint16_t* panel) { quant_panel(w, b, panel); });
}

void gemm_bf16_vectors(const uint16_t* x, int64_t x_row, int64_t M, int64_t N, int64_t K,
                       const uint16_t* w, int64_t block_begin, int64_t block_end,
                       const Epilogue& e) {
  rows_times_blocks(x, x_row, M, N, K, block_begin, block_end, e, [&](int64_t b, uint16_t* panel) {
    const int64_t n0 = b * kBlockRows, rows = std::min(kBlockRows, N - n0);
    const uint16_t* row[kBlockRows];
    for (int64_t i = 0; i < rows; ++i) row[i] = w + (n0 + i) * K;
    llmbench_simd::pack_pair_rows(row, rows, K, panel);
  });
}
#else
bool vectors_available() { return false; }

void gemm_quant_vectors(const uint16_t*, int64_t, int64_t, int64_t, const QuantWeights&, int64_t,
                        int64_t, const Epilogue&) {}

void gemm_bf16_vectors(const uint16_t*, int64_t, int64_t, int64_t, int64_t, const uint16_t*,
                       int64_t, int64_t, const Epilogue&) {}
#endif

}  // namespace llmbench_gemm
