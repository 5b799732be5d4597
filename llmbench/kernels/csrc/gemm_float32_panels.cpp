// Products of many rows of x with int8 or int4 W on AVX2 FMAs in float32, for CPUs without
// bfloat16 products (an AMD EPYC of the Zen 3 kind, where torch's bfloat16 matmul runs 16-20
// GFLOP/s and its float32 one 137). Each block of 16 rows of W is dequantised once a call, in
// cache, into a float32 panel
//     panel[16·k + n] = w[16b + n][k]
// (each value as quant_dequantize computes it, rounded to bfloat16: the weights every other
// path multiplies) and met by every row of x:
//     acc[m][n] += panel[16·k + n] · x[m][k]     (x[m][k] broadcast; the 16 lanes: 2 vectors)
// kRows = 6 rows of x hold 12 accumulators, a panel row's two vectors and the broadcast: 15 of
// the 16 registers. The sums go through gemm_panels.h's Epilogue (bias, residual, one rounding).
// Dequantising W whole for each call, then one float32 oneDNN matmul, spent more time writing
// and reading W than multiplying up to a few hundred rows (SmolLM2's 120 matrices at 17 rows:
// 288 ms, where the decode kernel takes 35 at 16).
#include "gemm_panels.h"

#include <cstring>

#include "simd.h"

namespace llmbench_gemm {

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && !defined(__AVX512BF16__)
namespace {

constexpr int kRows = 6;  // rows of x a pass over one panel

// The 64 bytes of a chunk (lane n, byte j: row n, k = 4t + j) regrouped by k: bytes[j] holds
// rows 0 .. 15 at k = 4t + j.
inline void chunk_by_k(const uint8_t* chunk, __m128i bytes[4]) {
  const __m128i by_k = _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  __m128i quad[4];  // quad[q]: dword j = rows 4q .. 4q + 3 at k = 4t + j
  for (int q = 0; q < 4; ++q)
    quad[q] = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(chunk + 16 * q)),
                               by_k);
  const __m128i j01_lo = _mm_unpacklo_epi32(quad[0], quad[1]);
  const __m128i j23_lo = _mm_unpackhi_epi32(quad[0], quad[1]);
  const __m128i j01_hi = _mm_unpacklo_epi32(quad[2], quad[3]);
  const __m128i j23_hi = _mm_unpackhi_epi32(quad[2], quad[3]);
  bytes[0] = _mm_unpacklo_epi64(j01_lo, j01_hi);
  bytes[1] = _mm_unpackhi_epi64(j01_lo, j01_hi);
  bytes[2] = _mm_unpacklo_epi64(j23_lo, j23_hi);
  bytes[3] = _mm_unpackhi_epi64(j23_lo, j23_hi);
}

// v rounded to bfloat16 and widened back (to nearest, ties to even, as c10 rounds; W's values
// are finite).
inline __m256 through_bf16(__m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF)));
  return _mm256_castsi256_ps(_mm256_and_si256(rounded, _mm256_set1_epi32(~0xFFFF)));
}

// Rows 0 .. 7 and 8 .. 15 of 16 bytes as float32, signed or not.
template <bool kSigned>
inline void to_floats(__m128i bytes, __m256 v[2]) {
  const __m128i high = _mm_srli_si128(bytes, 8);
  v[0] = _mm256_cvtepi32_ps(kSigned ? _mm256_cvtepi8_epi32(bytes) : _mm256_cvtepu8_epi32(bytes));
  v[1] = _mm256_cvtepi32_ps(kSigned ? _mm256_cvtepi8_epi32(high) : _mm256_cvtepu8_epi32(high));
}

// Block b of int8 W as its panel: w = s·q.
void int8_panel(const QuantWeights& w, int64_t b, float* panel) {
  const uint8_t* codes = w.codes + b * w.groups * 512;
  const __m256 s[2] = {_mm256_loadu_ps(w.scale + b * kBlockRows),
                       _mm256_loadu_ps(w.scale + b * kBlockRows + 8)};
  for (int64_t t = 0; t < w.groups * 8; ++t) {  // chunks of 4 k
    __m128i bytes[4];
    chunk_by_k(codes + t * 64, bytes);
    for (int j = 0; j < 4; ++j) {
      __m256 v[2];
      to_floats<true>(bytes[j], v);
      float* row = panel + (4 * t + j) * kBlockRows;
      _mm256_store_ps(row, through_bf16(_mm256_mul_ps(v[0], s[0])));
      _mm256_store_ps(row + 8, through_bf16(_mm256_mul_ps(v[1], s[1])));
    }
  }
}

// The same for int4: w = s·(q − 8), then + z, each rounded (no FMA, as quant_dequantize
// computes it).
__attribute__((optimize("fp-contract=off"))) void int4_panel(const QuantWeights& w, int64_t b,
                                                            float* panel) {
  const uint8_t* codes = w.codes + b * w.groups * 256;
  const __m128i low4 = _mm_set1_epi8(0x0F);
  const __m256 eight = _mm256_set1_ps(8.0f);
  for (int64_t g = 0; g < w.groups; ++g) {
    const auto* sz = reinterpret_cast<const __m128i*>(w.scale_zero + (b * w.groups + g) * 32);
    const __m256 s[2] = {_mm256_cvtph_ps(_mm_loadu_si128(sz)),
                         _mm256_cvtph_ps(_mm_loadu_si128(sz + 1))};
    const __m256 z[2] = {_mm256_cvtph_ps(_mm_loadu_si128(sz + 2)),
                         _mm256_cvtph_ps(_mm_loadu_si128(sz + 3))};
    for (int64_t t = 0; t < 4; ++t) {  // chunk t: k 8t .. 8t + 3 (low nibbles), 8t + 4 .. (high)
      __m128i bytes[4];
      chunk_by_k(codes + (g * 4 + t) * 64, bytes);
      for (int j = 0; j < 4; ++j) {
        const __m128i nibbles[2] = {_mm_and_si128(bytes[j], low4),
                                    _mm_and_si128(_mm_srli_epi16(bytes[j], 4), low4)};
        for (int h = 0; h < 2; ++h) {
          __m256 v[2];
          to_floats<false>(nibbles[h], v);
          float* row = panel + (32 * g + 8 * t + 4 * h + j) * kBlockRows;
          for (int half = 0; half < 2; ++half) {
            const __m256 scaled = _mm256_mul_ps(_mm256_sub_ps(v[half], eight), s[half]);
            _mm256_store_ps(row + 8 * half, through_bf16(_mm256_add_ps(scaled, z[half])));
          }
        }
      }
    }
  }
}

// Rows m .. m + R of y at the 16 columns from n0: x rows x_row apart, K values each.
template <int R>
void rows_times_panel(const float* x, int64_t x_row, int64_t K, const float* panel,
                      const Epilogue& e, int64_t N, int64_t m, int64_t n0) {
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    const __m256 w0 = _mm256_load_ps(panel + kBlockRows * k);
    const __m256 w1 = _mm256_load_ps(panel + kBlockRows * k + 8);
    for (int r = 0; r < R; ++r) {
      const __m256 xb = _mm256_broadcast_ss(x + r * x_row + k);
      acc[r][0] = _mm256_fmadd_ps(w0, xb, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(w1, xb, acc[r][1]);
    }
  }
  // Every row's sums stored at a constant index: with a loop over r, GCC kept acc in memory
  // and stored all 12 accumulators on every k (half the speed).
  float sums[R][kBlockRows];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(sums[r], acc[r][0]);
    _mm256_storeu_ps(sums[r] + 8, acc[r][1]);
  }
  const int64_t cols = std::min(kBlockRows, N - n0);  // the rest is padding
  for (int r = 0; r < R; ++r) {
    const int64_t row = m + r;
    for (int64_t i = 0; i < cols; ++i) {  // + bias, + residual, rounded once: finish_row's order
      float v = sums[r][i];
      if (e.bias) v += static_cast<float>(e.bias[n0 + i]);
      if (e.residual) v += static_cast<float>(e.residual[row * e.res_row + n0 + i]);
      e.y[row * N + n0 + i] = c10::BFloat16(v);
    }
  }
}

// Rows m_begin .. m_end of y against one panel: kRows at a time, the rest by 4, 2, 1.
void rows_of_x(const float* x, int64_t x_row, int64_t K, const float* panel, const Epilogue& e,
               int64_t N, int64_t m_begin, int64_t m_end, int64_t n0) {
  for (int64_t m = m_begin; m < m_end;) {
    const int64_t left = m_end - m;
    const float* xm = x + m * x_row;
    if (left >= kRows) {
      rows_times_panel<kRows>(xm, x_row, K, panel, e, N, m, n0);
      m += kRows;
    } else if (left >= 4) {
      rows_times_panel<4>(xm, x_row, K, panel, e, N, m, n0);
      m += 4;
    } else if (left >= 2) {
      rows_times_panel<2>(xm, x_row, K, panel, e, N, m, n0);
      m += 2;
    } else {
      rows_times_panel<1>(xm, x_row, K, panel, e, N, m, n0);
      m += 1;
    }
  }
}

}  // namespace

bool float32_panels_available() { return true; }

void gemm_quant_float32_panels(const float* x, int64_t x_row, int64_t M, int64_t N,
                               const QuantWeights& w, int64_t block_begin, int64_t block_end,
                               const Epilogue& e) {
  const int64_t K = w.groups * kChunkK, m_chunks = (M + kBlockRows - 1) / kBlockRows;
  auto fill = [&](int64_t b, float* panel) {
    if (w.is_int4)
      int4_panel(w, b, panel);
    else
      int8_panel(w, b, panel);
  };
  auto multiply = [&](int64_t b, bool two_n, const float* p0, const float* p1, int64_t mc_begin,
                      int64_t mc_end) {
    const int64_t m_begin = mc_begin * kBlockRows, m_end = std::min(mc_end * kBlockRows, M);
    rows_of_x(x, x_row, K, p0, e, N, m_begin, m_end, b * kBlockRows);
    if (two_n) rows_of_x(x, x_row, K, p1, e, N, m_begin, m_end, (b + 1) * kBlockRows);
  };
  over_panels<float>(K * kBlockRows, m_chunks, block_begin, block_end, fill, multiply);
}
#else
bool float32_panels_available() { return false; }

void gemm_quant_float32_panels(const float*, int64_t, int64_t, int64_t, const QuantWeights&,
                               int64_t, int64_t, const Epilogue&) {}
#endif

}  // namespace llmbench_gemm
