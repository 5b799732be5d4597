// Products of many rows of x with int8, int4 or bfloat16 W on AVX2 FMAs in float32, for CPUs
// without bfloat16 products (an AMD EPYC of the Zen 3 kind, where torch's bfloat16 matmul runs
// 16-20 GFLOP/s and its float32 one 137). Each block of 16 rows of W is written once a call, in
// cache, into a float32 panel
//     panel[16·k + n] = w[16b + n][k]
// (quantised values as quant_dequantize computes them, rounded to bfloat16: the weights every
// other path multiplies; bfloat16 ones widened, 8 × 8 at a time) and met by every row of x:
//     acc[m][n] += panel[16·k + n] · x[m][k]     (x[m][k] broadcast; the 16 lanes: 2 vectors)
// kRows = 6 rows of x hold 12 accumulators, a panel row's two vectors and the broadcast: 15 of
// the 16 registers. The sums go through gemm_panels.h's Epilogue (bias, residual, one rounding).
// Dequantising W whole for each call, then one float32 oneDNN matmul, spent more time writing
// and reading W than multiplying up to a few hundred rows (SmolLM2's 120 matrices at 17 rows:
// 288 ms, where the decode kernel takes 35 at 16). Callers: `quant_gemm` (gemv_quant.cpp) and
// the bfloat16 `gemv` from 16 rows (gemv.cpp).
#include "gemm_panels.h"

#include <vector>

#include "simd.h"

namespace llmbench_gemm {

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && !defined(__AVX512BF16__)
namespace {

constexpr int kRows = 6;  // rows of x a pass over one panel
// A fill prefetches the block two ahead into L2: read from memory while the two blocks before it
// are multiplied (without it a fill waited on its rows of W: bfloat16 W from memory at 8 rows of
// x took 40 ms a pass over SmolLM2's matrices where the row loops take 25).
constexpr auto kAhead = _MM_HINT_T1;

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

// Block b of int8 W as its panel: w = s·q (`ahead`: prefetching block b + 2's codes).
void int8_panel(const QuantWeights& w, int64_t b, bool ahead, float* panel) {
  const int64_t block_bytes = w.groups * 512;
  const uint8_t* codes = w.codes + b * block_bytes;
  const __m256 s[2] = {_mm256_loadu_ps(w.scale + b * kBlockRows),
                       _mm256_loadu_ps(w.scale + b * kBlockRows + 8)};
  for (int64_t t = 0; t < w.groups * 8; ++t) {  // chunks of 4 k
    if (ahead)
      _mm_prefetch(reinterpret_cast<const char*>(codes + 2 * block_bytes + t * 64), kAhead);
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
                                                            bool ahead, float* panel) {
  const int64_t block_bytes = w.groups * 256;
  const uint8_t* codes = w.codes + b * block_bytes;
  const __m128i low4 = _mm_set1_epi8(0x0F);
  const __m256 eight = _mm256_set1_ps(8.0f);
  for (int64_t g = 0; g < w.groups; ++g) {
    const auto* sz = reinterpret_cast<const __m128i*>(w.scale_zero + (b * w.groups + g) * 32);
    if (ahead) _mm_prefetch(reinterpret_cast<const char*>(sz + 4 * 2 * w.groups), kAhead);
    const __m256 s[2] = {_mm256_cvtph_ps(_mm_loadu_si128(sz)),
                         _mm256_cvtph_ps(_mm_loadu_si128(sz + 1))};
    const __m256 z[2] = {_mm256_cvtph_ps(_mm_loadu_si128(sz + 2)),
                         _mm256_cvtph_ps(_mm_loadu_si128(sz + 3))};
    for (int64_t t = 0; t < 4; ++t) {  // chunk t: k 8t .. 8t + 3 (low nibbles), 8t + 4 .. (high)
      const uint8_t* chunk = codes + (g * 4 + t) * 64;
      if (ahead) _mm_prefetch(reinterpret_cast<const char*>(chunk + 2 * block_bytes), kAhead);
      __m128i bytes[4];
      chunk_by_k(chunk, bytes);
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

// 8 rows × 8 k in float32 transposed in registers: r[i] (row i at k .. k + 7) becomes r[j]
// (k + j for rows 0 .. 7).
inline void transpose_8x8(__m256 r[8]) {
  __m256 t[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  __m256 u[8];
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int j = 0; j < 4; ++j) {
    r[j] = _mm256_permute2f128_ps(u[j], u[j + 4], 0x20);
    r[j + 4] = _mm256_permute2f128_ps(u[j], u[j + 4], 0x31);
  }
}

// Block b of bfloat16 W [N, K] (K a multiple of 8) as its panel, exactly (a bfloat16 is the
// top half of its float32); rows past N read `zeros` (`ahead`: prefetching block b + 2's rows;
// a prefetch past the end of W is dropped, never a fault).
void bf16_panel(const uint16_t* w, int64_t N, int64_t K, int64_t b, bool ahead,
                const uint16_t* zeros, float* panel) {
  for (int half = 0; half < 2; ++half) {
    const uint16_t* rows[8];
    for (int i = 0; i < 8; ++i) {
      const int64_t n = b * kBlockRows + 8 * half + i;
      rows[i] = n < N ? w + n * K : zeros;
    }
    for (int64_t k = 0; k < K; k += 8) {
      if (ahead && k % 32 == 0)  // a 64-byte line of each of the 8 rows
        for (int i = 0; i < 8; ++i)
          _mm_prefetch(reinterpret_cast<const char*>(rows[i] + 2 * kBlockRows * K + k), kAhead);
      __m256 r[8];
      for (int i = 0; i < 8; ++i) {
        const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[i] + k));
        r[i] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
      }
      transpose_8x8(r);
      for (int j = 0; j < 8; ++j) _mm256_store_ps(panel + (k + j) * kBlockRows + 8 * half, r[j]);
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

// Every row of x [M, K] against W's blocks from block_begin to block_end, filled by
// fill(b, panel, ahead): `ahead` says whether block b + 2 is one of them, to prefetch as block b
// is read (it is then on its way while blocks b and b + 1 are multiplied).
template <typename Fill>
void rows_times_blocks(const float* x, int64_t x_row, int64_t M, int64_t N, int64_t K,
                       int64_t block_begin, int64_t block_end, const Epilogue& e, Fill&& fill) {
  const int64_t m_chunks = (M + kBlockRows - 1) / kBlockRows;
  auto fill_ahead = [&](int64_t b, float* panel) { fill(b, panel, b + 2 < block_end); };
  auto multiply = [&](int64_t b, bool two_n, const float* p0, const float* p1, int64_t mc_begin,
                      int64_t mc_end) {
    const int64_t m_begin = mc_begin * kBlockRows, m_end = std::min(mc_end * kBlockRows, M);
    rows_of_x(x, x_row, K, p0, e, N, m_begin, m_end, b * kBlockRows);
    if (two_n) rows_of_x(x, x_row, K, p1, e, N, m_begin, m_end, (b + 1) * kBlockRows);
  };
  over_panels<float>(K * kBlockRows, m_chunks, block_begin, block_end, fill_ahead, multiply);
}

}  // namespace

bool float32_panels_available() { return true; }

void gemm_quant_float32_panels(const float* x, int64_t x_row, int64_t M, int64_t N,
                               const QuantWeights& w, int64_t block_begin, int64_t block_end,
                               const Epilogue& e) {
  auto fill = [&](int64_t b, float* panel, bool ahead) {
    if (w.is_int4)
      int4_panel(w, b, ahead, panel);
    else
      int8_panel(w, b, ahead, panel);
  };
  rows_times_blocks(x, x_row, M, N, w.groups * kChunkK, block_begin, block_end, e, fill);
}

void gemm_bf16_float32_panels(const float* x, int64_t x_row, int64_t M, int64_t N, int64_t K,
                              const uint16_t* w, int64_t block_begin, int64_t block_end,
                              const Epilogue& e) {
  const std::vector<uint16_t> zeros(K, 0);
  auto fill = [&](int64_t b, float* panel, bool ahead) {
    bf16_panel(w, N, K, b, ahead, zeros.data(), panel);
  };
  rows_times_blocks(x, x_row, M, N, K, block_begin, block_end, e, fill);
}
#else
bool float32_panels_available() { return false; }

void gemm_quant_float32_panels(const float*, int64_t, int64_t, int64_t, const QuantWeights&,
                               int64_t, int64_t, const Epilogue&) {}

void gemm_bf16_float32_panels(const float*, int64_t, int64_t, int64_t, int64_t, const uint16_t*,
                              int64_t, int64_t, const Epilogue&) {}
#endif

}  // namespace llmbench_gemm
