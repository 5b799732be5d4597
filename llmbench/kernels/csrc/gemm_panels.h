// Products of many rows of bfloat16 x with W met one block of 16 rows at a time, each block
// first written, in cache, as a "panel" in the pair layout
//     panel[32·p + 2n + t] = w[16b + n][2p + t]     (K / 2 pairs of k × 16 rows of W)
// which is at once AMX's B operand (a tile per 32 of k: 16 pairs × 16 columns) and VDPBF16PS's,
// one row of W per 32-bit lane (x's pair broadcast to every lane). Two products read panels:
// the tiles' (gemv_amx.cpp, llmbench_amx::gemm_quant_bf16) and the vectors' (gemm_vectors.cpp,
// for CPUs with AVX-512 BF16 and no tiles); on AVX2, float32 panels (gemm_float32_panels.cpp)
// are met the same way. Here is what they share: W's and y's descriptions,
// the panel fills of int8 and int4 codes, the loop that fills panels and hands them on, and the
// write of a row of results.
//
// The quantised layouts (gemv_quant.cpp) put 4 consecutive k of 16 rows in a 64-byte chunk
// (lane n, byte j = q[n][4t + j]), so one chunk's values, in bfloat16, are two rows of the
// panel: pairs j = 0, 1 of every lane, then j = 2, 3 (one two-source permute each). Each value is
// dequantised as gemv_quant.cpp's quant_dequantize does (int8 s·q; int4 s·(q − 8), then + z;
// float32, rounded once to bfloat16), so y is x times exactly that W: the weights are
// dequantised once a call, in cache, never written out whole.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#include <immintrin.h>

#include "simd.h"
#endif

namespace llmbench_gemm {

constexpr int64_t kBlockRows = 16;                          // rows of W a panel
constexpr int64_t kChunkK = 32;                             // k of one B tile
constexpr int64_t kChunkElements = kBlockRows * kChunkK;    // bfloat16 elements of one B tile

// What each result becomes: y[m, n] = Σ + bias[n] + residual[m, n] (those given), rounded once
// to bfloat16; y [M, N] contiguous, residual rows res_row apart.
struct Epilogue {
  const c10::BFloat16* bias;
  const c10::BFloat16* residual;
  int64_t res_row;
  c10::BFloat16* y;
};

// int8 or int4 W in gemv_quant.cpp's layouts (rows in blocks of 16, K in groups of 32).
struct QuantWeights {
  const uint8_t* codes;         // block b at codes + b · groups · (512 int8, 256 int4) bytes
  const c10::Half* scale_zero;  // int4: [blocks, groups, 2, 16]
  const float* scale;           // int8: [blocks · 16]
  int64_t groups;
  bool is_int4;
};

// Whether this build has the vectors' products (AVX-512 BF16).
bool vectors_available();

// y = x @ W^T (+ bias) (+ residual) for bfloat16 W [N, K] (contiguous, K a multiple of 32), its
// row blocks block_begin .. block_end, on AVX-512 BF16 vectors (gemm_vectors.cpp): each block
// packed into its panel once a call (16x16 transposes) and met by every row of x [M, K].
void gemm_bf16_vectors(const uint16_t* x, int64_t x_row, int64_t M, int64_t N, int64_t K,
                       const uint16_t* w, int64_t block_begin, int64_t block_end,
                       const Epilogue& epilogue);

// y = x @ dequant(W)^T (+ bias) (+ residual) for W's row blocks block_begin .. block_end on
// AVX-512 BF16 vectors (gemm_vectors.cpp), with x [M, groups · 32] bfloat16 (rows x_row apart)
// and y [M, N]: each block's panel is dequantised once and met by every row of x.
void gemm_quant_vectors(const uint16_t* x, int64_t x_row, int64_t M, int64_t N,
                        const QuantWeights& w, int64_t block_begin, int64_t block_end,
                        const Epilogue& epilogue);

// Whether this build has the AVX2 float32 product below (AVX2 without AVX-512 BF16).
bool float32_panels_available();

// The same product for bfloat16 y with x [M, groups · 32] in float32 (rows x_row apart) on AVX2
// FMAs (gemm_float32_panels.cpp): each block dequantised once into a float32 panel (its values
// rounded to bfloat16 first: the weights every path multiplies) and met by every row of x.
void gemm_quant_float32_panels(const float* x, int64_t x_row, int64_t M, int64_t N,
                               const QuantWeights& w, int64_t block_begin, int64_t block_end,
                               const Epilogue& epilogue);

// The same for bfloat16 W [N, K] (contiguous, K a multiple of 8), each block's panel its values
// widened: the product of the AVX2 gemv from kFloat32PanelMinRows rows (gemv.cpp).
void gemm_bf16_float32_panels(const float* x, int64_t x_row, int64_t M, int64_t N, int64_t K,
                              const uint16_t* w, int64_t block_begin, int64_t block_end,
                              const Epilogue& epilogue);

// The blocks of W from block_begin to block_end, each filled into a panel (fill(b, panel)) and
// handed with the next one to multiply(b, two_n, p0, p1, mc_begin, mc_end): blocks b and b + 1
// (when two_n) against the chunks of 16 rows of x from mc_begin to mc_end. Up to kMBlock chunks
// (128 rows), each pair of panels is filled and met by every row at once, in L1/L2. With more
// rows x itself no longer stays in L2 (2,048 rows of K = 576 are 2.4 MB) and would be read
// again for every pair, at the L3's speed (on the tiles twice oneDNN's time at 2,048 rows):
// then every panel is filled first, and x is taken kMBlock chunks at a time, each meeting every
// panel. panel_size: elements of one panel (bfloat16 bits, or float32 on AVX2).
template <typename Element = uint16_t, typename Fill, typename Multiply>
void over_panels(int64_t panel_size, int64_t m_chunks, int64_t block_begin, int64_t block_end,
                 Fill&& fill, Multiply&& multiply) {
  constexpr int64_t kMBlock = 8;
  const bool all_first = m_chunks > kMBlock;
  const int64_t num_panels = all_first ? block_end - block_begin : 2;
  std::vector<Element> storage(num_panels * panel_size + 64 / sizeof(Element));
  Element* panels = reinterpret_cast<Element*>(  // 64-byte aligned: a pair row a cache line
      (reinterpret_cast<uintptr_t>(storage.data()) + 63) & ~static_cast<uintptr_t>(63));
  if (!all_first) {
    for (int64_t b = block_begin; b < block_end; b += 2) {
      const bool two_n = b + 1 < block_end;
      fill(b, panels);
      if (two_n) fill(b + 1, panels + panel_size);
      multiply(b, two_n, panels, panels + panel_size, int64_t{0}, m_chunks);
    }
    return;
  }
  for (int64_t b = block_begin; b < block_end; ++b) fill(b, panels + (b - block_begin) * panel_size);
  for (int64_t mc = 0; mc < m_chunks; mc += kMBlock)
    for (int64_t b = block_begin; b < block_end; b += 2) {
      const Element* p0 = panels + (b - block_begin) * panel_size;
      multiply(b, b + 1 < block_end, p0, p0 + panel_size, mc, std::min(mc + kMBlock, m_chunks));
    }
}

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
namespace detail {

// The two panel rows of one 64-byte chunk of codes whose 64 values (lane n, byte j: row n, k
// 4t + j) are v[0..3] in float32 (v[r]: lanes 4r .. 4r + 3): bfloat16 element 4n + j of the
// chunk is then dword 2n (j = 0, 1) or 2n + 1 (j = 2, 3) of `lo` (rows 0 .. 7) and `hi`.
inline void store_pair_rows(const __m512 v[4], uint16_t* even_row, uint16_t* odd_row) {
  const __m512i lo = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(v[1], v[0]));
  const __m512i hi = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(v[3], v[2]));
  const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  _mm512_store_si512(even_row, _mm512_permutex2var_epi32(lo, even, hi));
  _mm512_store_si512(odd_row, _mm512_permutex2var_epi32(lo, odd, hi));
}

// A row's value (16 floats, one per row of the block) spread so that lane l of result r holds
// row 4r + l / 4: the layout of a chunk's bytes.
inline void spread_rows(__m512 per_row, __m512 out[4]) {
  for (int r = 0; r < 4; ++r) {
    const __m512i lane = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    out[r] = _mm512_permutexvar_ps(_mm512_add_epi32(lane, _mm512_set1_epi32(4 * r)), per_row);
  }
}

// The 64 bytes of a chunk as 4 × 16 float32 (v[r]: bytes 16r .. 16r + 15), signed or not.
template <bool kSigned>
inline void bytes_to_floats(__m512i bytes, __m512 v[4]) {
  const __m128i q[4] = {_mm512_extracti32x4_epi32(bytes, 0), _mm512_extracti32x4_epi32(bytes, 1),
                        _mm512_extracti32x4_epi32(bytes, 2), _mm512_extracti32x4_epi32(bytes, 3)};
  for (int r = 0; r < 4; ++r)
    v[r] = _mm512_cvtepi32_ps(kSigned ? _mm512_cvtepi8_epi32(q[r]) : _mm512_cvtepu8_epi32(q[r]));
}

}  // namespace detail

// Block b of W as its panel (64-byte aligned): int8 w = s·q.
inline void int8_panel(const QuantWeights& w, int64_t b, uint16_t* panel) {
  const auto* codes = w.codes + b * w.groups * 512;
  __m512 s[4];
  detail::spread_rows(_mm512_loadu_ps(w.scale + b * kBlockRows), s);
  for (int64_t t = 0; t < w.groups * 8; ++t) {  // chunks of 4 k
    __m512 v[4];
    detail::bytes_to_floats<true>(_mm512_loadu_si512(codes + t * 64), v);
    for (int r = 0; r < 4; ++r) v[r] = _mm512_mul_ps(v[r], s[r]);
    uint16_t* row = panel + (t / 8) * kChunkElements + (t % 8) * 2 * kChunkK;
    detail::store_pair_rows(v, row, row + kChunkK);
  }
}

// The same for int4 (group 32 = one tile): w = s·(q − 8), then + z, each rounded (no FMA, as
// quant_dequantize computes it).
__attribute__((optimize("fp-contract=off"))) inline void int4_panel(const QuantWeights& w,
                                                                    int64_t b, uint16_t* panel) {
  const auto* codes = w.codes + b * w.groups * 256;
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const __m512 eight = _mm512_set1_ps(8.0f);
  for (int64_t g = 0; g < w.groups; ++g) {
    const c10::Half* sz = w.scale_zero + (b * w.groups + g) * 32;
    __m512 s[4], z[4];
    detail::spread_rows(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sz))),
                        s);
    detail::spread_rows(
        _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sz + 16))), z);
    uint16_t* tile = panel + g * kChunkElements;
    for (int64_t t = 0; t < 4; ++t) {  // chunk t: k 8t .. 8t + 3 (low nibbles), 8t + 4 .. (high)
      const __m512i packed = _mm512_loadu_si512(codes + (g * 4 + t) * 64);
      const __m512i nibbles[2] = {_mm512_and_si512(packed, low4),
                                  _mm512_and_si512(_mm512_srli_epi16(packed, 4), low4)};
      for (int h = 0; h < 2; ++h) {
        __m512 v[4];
        detail::bytes_to_floats<false>(nibbles[h], v);
        for (int r = 0; r < 4; ++r)
          v[r] = _mm512_add_ps(_mm512_mul_ps(_mm512_sub_ps(v[r], eight), s[r]), z[r]);
        uint16_t* row = tile + (4 * t + 2 * h) * kChunkK;  // pairs of k (8t + 4h) / 2 ..
        detail::store_pair_rows(v, row, row + kChunkK);
      }
    }
  }
}

// Block b of quantised W as its panel.
inline void quant_panel(const QuantWeights& w, int64_t b, uint16_t* panel) {
  if (w.is_int4)
    int4_panel(w, b, panel);
  else
    int8_panel(w, b, panel);
}

// Row m of y for the 16 columns from n0 (those in `valid`): sums + bias + residual, rounded once.
inline void finish_row(const Epilogue& e, int64_t N, int64_t m, int64_t n0, __mmask16 valid,
                       __m512 sums) {
  if (e.bias) sums = _mm512_add_ps(sums, llmbench_simd::load16_masked(e.bias + n0, valid));
  if (e.residual)
    sums = _mm512_add_ps(sums, llmbench_simd::load16_masked(e.residual + m * e.res_row + n0, valid));
  llmbench_simd::store16_masked(e.y + m * N + n0, sums, valid);
}

// The columns of a block from n0 that are in y (N not a multiple of 16: its last block's rows
// past N are padding).
inline __mmask16 valid_columns(int64_t N, int64_t n0) {
  const int64_t cols = std::min<int64_t>(kBlockRows, N - n0);
  return static_cast<__mmask16>((1u << cols) - 1);
}

#endif

}  // namespace llmbench_gemm
