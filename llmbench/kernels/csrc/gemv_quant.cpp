// Decode-shaped products with int8 or int4 weights on AVX-512 VNNI or AVX2 CPUs:
//     y[M, N] = x[M, K] @ dequant(W)[N, K]^T (+ bias[N]) (+ residual[M, N]),  y in x's dtype.
//
// x is quantised per call, per group of 32 along K, to int8 with a float32 scale (sx = max|x| /
// 127), as llama.cpp quantises activations for its Q4/Q8 dot products. W's codes then multiply
// x's with VPDPBUSD, which sums 4 byte products into each of 16 int32 lanes: the weights are
// laid out so that lane i is row i of a block of 16 rows and its 4 bytes are 4 consecutive k,
// and x's 4 codes at those k are broadcast to every lane. A lane accumulates its own row: no
// horizontal sums, and each 64-byte load of W is one instruction's worth. Each group's int32
// sums are scaled in float32:
//     int4 (group 32, zero point): w = s·(q − 8) + z, q in 0..15 (an unsigned operand as is)
//         Σ_k w·x = Σ_g [ s_g·sx_g·Σ q·xq + (z_g − 8·s_g)·Σ_g x ]        (Σ_g x: float32 sums)
//     int8 (per output channel):   w = s·q, q in −127..127, read as u = q + 128 (q XOR 0x80)
//         Σ_k w·x = s·Σ_g sx_g·(Σ u·xq − 128·Σ_g xq)                      (Σ_g xq: int32, exact)
//
// AVX2 (no VPDPBUSD: an AMD EPYC of the Zen 3 kind) reads the same layout as two halves of 8
// rows. VPMADDUBSW sums 2 byte products (its first operand unsigned) into 16-bit lanes, and
// VPMADDWD pairs those into 32-bit ones. int4's codes are its unsigned operand as they are (a
// pair at most 2·15·127, so a group's 8 such sums add up in 16 bits); int8 multiplies |q| by x's
// codes given q's sign (VPSIGNB, as llama.cpp's AVX2 dot products do; 2·127·127 < 2^15), so no
// offset term. Both ISAs add the same int32 sums and scale them in the same order: the same y.
//
// Layouts (`kernels.cpu_quant_gemv` builds them at load), rows in blocks of 16:
//     int4  codes [N/16, K/8, 16, 4] uint8: chunk t, lane i, byte j =
//                 q[16b + i, 8t + j] | q[16b + i, 8t + 4 + j] << 4
//           scale_zero [N/16, K/32, 2, 16] float16: the 16 rows' scales, then their zero points
//     int8  codes [N/16, K/4, 16, 4] int8: chunk t, lane i, byte j = q[16b + i, 4t + j]
//           scale [N_padded] float32
// N is padded to a multiple of 16 and K to a multiple of 32 at load (zero rows, zero columns).
//
// Why this layout (measured on a 2-core Intel Xeon, AMX/VNNI, one thread, weights on huge
// pages): the earlier one (blocks of 4 rows, 16 lanes = 4 rows × 4 partial sums) spent as long
// on each block's horizontal sums as on its K = 576 products and streamed 12-15 GB/s where
// bfloat16 streams 16-17.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/add.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gemv_amx.h"
#include "ops.h"
#include "simd.h"

#ifndef LLMBENCH_EXTENSION_NAMESPACE
#define LLMBENCH_EXTENSION_NAMESPACE llmbench_cpu_ext
#endif

namespace {

using llmbench_simd::dispatch_float;
using llmbench_simd::from_f;
using llmbench_simd::to_f;

constexpr int64_t kGroup = 32;     // x's quantisation group, and int4's weight group
constexpr int64_t kRowBlock = 16;  // rows of W per block: one per 32-bit lane
constexpr int64_t kMaxRows = 4;    // rows of x per pass over a block of W (still in L1 after)
// How far ahead of its loads a thread prefetches W's codes (and int4's scales): the hardware
// prefetcher alone left the kernels short of bfloat16's gemv, which prefetches. Measured on the
// 2-core Intel Xeon, builds alternated in one sitting (`benchmarks/quant_kernels.py`, the
// model's 120 matrices at 1 row, ms a pass): int4 4.6 → 3.4, int8 7.0 → 6.0; at 4 rows int4
// 7.0 → 5.5, int8 9.6 → 7.3. 1 KiB and 4 KiB ahead were within the noise of 2 KiB.
constexpr int64_t kPrefetchBytes = 2048;

// The block kernels' sums: row m of x, lane i (row 16b + i of W), before the per-row int8 scale.
using BlockSums = float[kMaxRows][kRowBlock];

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define LLMBENCH_QUANT_VNNI 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define LLMBENCH_QUANT_AVX2 1
#endif

#if defined(LLMBENCH_QUANT_VNNI) || defined(LLMBENCH_QUANT_AVX2)
constexpr bool kHasKernel = true;

// One row of x quantised for the kernels: per group g its scale sx[g], its float32 sum
// xsum[g] (int4's zero-point term) and its codes' int32 sum qsum[g] (int8's offset term on
// VNNI); codes[k], int8, K padded with zeros to whole groups.
struct QuantizedRow {
  std::vector<float> sx, xsum;
  std::vector<int32_t> qsum;
  std::vector<int8_t> codes;
};

template <typename T>
void quantize_row(const T* x, int64_t K, int64_t groups, QuantizedRow& out) {
  out.sx.assign(groups, 0.0f);
  out.xsum.assign(groups, 0.0f);
  out.qsum.assign(groups, 0);
  out.codes.assign(groups * kGroup, 0);
  float xf[kGroup];
  for (int64_t g = 0; g < groups; ++g) {
    float amax = 0.0f, sum = 0.0f;
    for (int64_t i = 0; i < kGroup; ++i) {
      const int64_t k = g * kGroup + i;
      xf[i] = k < K ? to_f(x[k]) : 0.0f;
      amax = std::max(amax, std::fabs(xf[i]));
      sum += xf[i];
    }
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    out.sx[g] = amax / 127.0f;
    out.xsum[g] = sum;
    int32_t qsum = 0;
    for (int64_t i = 0; i < kGroup; ++i) {
      const int q = static_cast<int>(std::nearbyint(xf[i] * inv));  // half to even
      out.codes[g * kGroup + i] = static_cast<int8_t>(q);
      qsum += q;
    }
    out.qsum[g] = qsum;
  }
}

// x's 4 codes at k .. k + 3 as one 32-bit value (for a broadcast to every lane).
inline int32_t four_codes(const int8_t* codes) {
  int32_t four;
  std::memcpy(&four, codes, 4);
  return four;
}
#else
constexpr bool kHasKernel = false;
#endif

#if defined(LLMBENCH_QUANT_VNNI)
// int4: sums[m], the scaled products plus the zero-point terms of the 16 rows of one block, for
// NM rows of x.
template <int NM>
void int4_block(const uint8_t* codes, const c10::Half* scale_zero, int64_t groups,
                const QuantizedRow* xs, BlockSums& sums) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  __m512 acc[NM], off[NM];
  for (int m = 0; m < NM; ++m) acc[m] = off[m] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const __m512 s = _mm512_cvtph_ps(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(scale_zero + g * 32)));
    const __m512 z = _mm512_cvtph_ps(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(scale_zero + g * 32 + 16)));
    const __m512 c = _mm512_fnmadd_ps(_mm512_set1_ps(8.0f), s, z);  // z − 8·s per row
    __m512i isum[NM];
    for (int m = 0; m < NM; ++m) isum[m] = _mm512_setzero_si512();
    _mm_prefetch(reinterpret_cast<const char*>(scale_zero + g * 32) + kPrefetchBytes / 4,
                 _MM_HINT_T0);
    for (int64_t t = 0; t < kGroup / 8; ++t) {
      _mm_prefetch(reinterpret_cast<const char*>(codes + (g * 4 + t) * 64) + kPrefetchBytes,
                   _MM_HINT_T0);
      const __m512i packed = _mm512_loadu_si512(codes + (g * 4 + t) * 64);
      const __m512i lo = _mm512_and_si512(packed, low4);
      const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low4);
      for (int m = 0; m < NM; ++m) {
        const int8_t* xq = xs[m].codes.data() + g * kGroup + 8 * t;
        isum[m] = _mm512_dpbusd_epi32(isum[m], lo, _mm512_set1_epi32(four_codes(xq)));
        isum[m] = _mm512_dpbusd_epi32(isum[m], hi, _mm512_set1_epi32(four_codes(xq + 4)));
      }
    }
    for (int m = 0; m < NM; ++m) {
      const __m512 scale = _mm512_mul_ps(s, _mm512_set1_ps(xs[m].sx[g]));
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[m]), scale, acc[m]);
      off[m] = _mm512_fmadd_ps(c, _mm512_set1_ps(xs[m].xsum[g]), off[m]);
    }
  }
  for (int m = 0; m < NM; ++m) _mm512_storeu_ps(sums[m], _mm512_add_ps(acc[m], off[m]));
}

// int8: sums[m], the 16 rows' sums before their per-row scale, for NM rows of x.
template <int NM>
void int8_block(const int8_t* codes, int64_t groups, const QuantizedRow* xs, BlockSums& sums) {
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));  // q → q + 128, unsigned
  __m512 acc[NM];
  for (int m = 0; m < NM; ++m) acc[m] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m512i isum[NM];
    for (int m = 0; m < NM; ++m) isum[m] = _mm512_set1_epi32(-128 * xs[m].qsum[g]);
    for (int64_t t = 0; t < kGroup / 4; ++t) {
      _mm_prefetch(reinterpret_cast<const char*>(codes + (g * 8 + t) * 64) + kPrefetchBytes,
                   _MM_HINT_T0);
      const __m512i u = _mm512_xor_si512(_mm512_loadu_si512(codes + (g * 8 + t) * 64), flip);
      for (int m = 0; m < NM; ++m) {
        const int8_t* xq = xs[m].codes.data() + g * kGroup + 4 * t;
        isum[m] = _mm512_dpbusd_epi32(isum[m], u, _mm512_set1_epi32(four_codes(xq)));
      }
    }
    for (int m = 0; m < NM; ++m)
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[m]), _mm512_set1_ps(xs[m].sx[g]), acc[m]);
  }
  for (int m = 0; m < NM; ++m) _mm512_storeu_ps(sums[m], acc[m]);
}
#elif defined(LLMBENCH_QUANT_AVX2)
// The AVX2 twins of the two kernels above: each 64-byte chunk of W as two halves of 8 rows
// (h = 0, 1), both in one pass over the block so that its lines are read from memory once.
// At 3 and 4 rows of x the accumulators outnumber the 16 registers; the compiler keeps the
// rest in L1 (batched decode: compute, not memory, sets its pace).
template <int NM>
void int4_block(const uint8_t* codes, const c10::Half* scale_zero, int64_t groups,
                const QuantizedRow* xs, BlockSums& sums) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[NM][2], off[NM][2];
  for (int m = 0; m < NM; ++m)
    for (int h = 0; h < 2; ++h) acc[m][h] = off[m][h] = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m256i psum[NM][2];  // 16-bit sums of the group's products, 8 pairs a lane
    for (int m = 0; m < NM; ++m) psum[m][0] = psum[m][1] = _mm256_setzero_si256();
    _mm_prefetch(reinterpret_cast<const char*>(scale_zero + g * 32) + kPrefetchBytes / 4,
                 _MM_HINT_T0);
    for (int64_t t = 0; t < kGroup / 8; ++t) {
      const uint8_t* chunk = codes + (g * 4 + t) * 64;
      _mm_prefetch(reinterpret_cast<const char*>(chunk) + kPrefetchBytes, _MM_HINT_T0);
      for (int h = 0; h < 2; ++h) {
        const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk + 32 * h));
        const __m256i lo = _mm256_and_si256(packed, low4);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low4);
        for (int m = 0; m < NM; ++m) {
          const int8_t* xq = xs[m].codes.data() + g * kGroup + 8 * t;
          const __m256i lo_x = _mm256_maddubs_epi16(lo, _mm256_set1_epi32(four_codes(xq)));
          const __m256i hi_x = _mm256_maddubs_epi16(hi, _mm256_set1_epi32(four_codes(xq + 4)));
          psum[m][h] = _mm256_add_epi16(psum[m][h], _mm256_add_epi16(lo_x, hi_x));
        }
      }
    }
    for (int h = 0; h < 2; ++h) {
      const auto* sz = reinterpret_cast<const __m128i*>(scale_zero + g * 32 + 8 * h);
      const __m256 s = _mm256_cvtph_ps(_mm_loadu_si128(sz));
      const __m256 z = _mm256_cvtph_ps(_mm_loadu_si128(sz + 2));  // the zero points, 16 on
      const __m256 c = _mm256_fnmadd_ps(_mm256_set1_ps(8.0f), s, z);  // z − 8·s per row
      for (int m = 0; m < NM; ++m) {
        const __m256i isum = _mm256_madd_epi16(psum[m][h], ones);
        const __m256 scale = _mm256_mul_ps(s, _mm256_set1_ps(xs[m].sx[g]));
        acc[m][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), scale, acc[m][h]);
        off[m][h] = _mm256_fmadd_ps(c, _mm256_set1_ps(xs[m].xsum[g]), off[m][h]);
      }
    }
  }
  for (int m = 0; m < NM; ++m)
    for (int h = 0; h < 2; ++h)
      _mm256_storeu_ps(sums[m] + 8 * h, _mm256_add_ps(acc[m][h], off[m][h]));
}

template <int NM>
void int8_block(const int8_t* codes, int64_t groups, const QuantizedRow* xs, BlockSums& sums) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[NM][2];
  for (int m = 0; m < NM; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m256i isum[NM][2];
    for (int m = 0; m < NM; ++m) isum[m][0] = isum[m][1] = _mm256_setzero_si256();
    for (int64_t t = 0; t < kGroup / 4; ++t) {
      const int8_t* chunk = codes + (g * 8 + t) * 64;
      _mm_prefetch(reinterpret_cast<const char*>(chunk) + kPrefetchBytes, _MM_HINT_T0);
      for (int h = 0; h < 2; ++h) {
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk + 32 * h));
        const __m256i q_abs = _mm256_sign_epi8(q, q);
        for (int m = 0; m < NM; ++m) {
          const int8_t* xq = xs[m].codes.data() + g * kGroup + 4 * t;
          const __m256i x_signed = _mm256_sign_epi8(_mm256_set1_epi32(four_codes(xq)), q);
          const __m256i pairs = _mm256_maddubs_epi16(q_abs, x_signed);
          isum[m][h] = _mm256_add_epi32(isum[m][h], _mm256_madd_epi16(pairs, ones));
        }
      }
    }
    for (int m = 0; m < NM; ++m)
      for (int h = 0; h < 2; ++h)
        acc[m][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[m][h]), _mm256_set1_ps(xs[m].sx[g]),
                                    acc[m][h]);
  }
  for (int m = 0; m < NM; ++m)
    for (int h = 0; h < 2; ++h) _mm256_storeu_ps(sums[m] + 8 * h, acc[m][h]);
}
#endif

struct QuantProblem {
  int64_t M, N, K, groups, num_blocks;
  const uint8_t* codes;
  const c10::Half* scale_zero;  // int4
  const float* scale;           // int8
  bool is_int4;
};

// Rows m0 .. m0 + nm of y at columns n0 .. n0 + rows: sums · the int8 scale + bias (+ residual),
// rounded once. The product and the bias are one fused multiply-add in either form, so the two
// give the same bits.
template <typename T>
void write_rows(const QuantProblem& p, const BlockSums& sums, int64_t m0, int nm, int64_t n0,
                const T* bias, const T* residual, int64_t r_row, T* y) {
  const int64_t rows = std::min<int64_t>(kRowBlock, p.N - n0);  // the rest is padding
#if defined(LLMBENCH_QUANT_VNNI)
  const __mmask16 valid = static_cast<__mmask16>((1u << rows) - 1);
  const __m512 w_scale =
      p.is_int4 ? _mm512_set1_ps(1.0f) : _mm512_maskz_loadu_ps(valid, p.scale + n0);
  const __m512 b_add = bias ? llmbench_simd::load16_masked(bias + n0, valid) : _mm512_setzero_ps();
  for (int m = 0; m < nm; ++m) {
    __m512 v = _mm512_fmadd_ps(_mm512_loadu_ps(sums[m]), w_scale, b_add);
    if (residual)
      v = _mm512_add_ps(v, llmbench_simd::load16_masked(residual + (m0 + m) * r_row + n0, valid));
    llmbench_simd::store16_masked(y + (m0 + m) * p.N + n0, v, valid);
  }
#else
  for (int m = 0; m < nm; ++m) {
    for (int64_t i = 0; i < rows; ++i) {
      const float w_scale = p.is_int4 ? 1.0f : p.scale[n0 + i];
      float v = std::fma(sums[m][i], w_scale, bias ? to_f(bias[n0 + i]) : 0.0f);
      if (residual) v += to_f(residual[(m0 + m) * r_row + n0 + i]);
      y[(m0 + m) * p.N + n0 + i] = from_f<T>(v);
    }
  }
#endif
}

template <typename T>
void run(const QuantProblem& p, const at::Tensor& x, const c10::optional<at::Tensor>& bias,
         const c10::optional<at::Tensor>& residual, at::Tensor& y) {
#if defined(LLMBENCH_QUANT_VNNI) || defined(LLMBENCH_QUANT_AVX2)
  const T* xp = x.data_ptr<T>();
  std::vector<QuantizedRow> xs(p.M);
  for (int64_t m = 0; m < p.M; ++m) quantize_row(xp + m * x.stride(0), p.K, p.groups, xs[m]);
  const T* bp = bias ? bias->data_ptr<T>() : nullptr;
  const T* rp = residual ? residual->data_ptr<T>() : nullptr;
  const int64_t r_row = residual ? residual->stride(0) : 0;
  T* yp = y.data_ptr<T>();
  const int64_t block_bytes = p.groups * (p.is_int4 ? 256 : 512);
  // Each thread streams one contiguous run of row blocks, at least ~64 KiB of codes.
  const int64_t per_task = std::max<int64_t>(1, (64 * 1024) / block_bytes);
  at::parallel_for(0, p.num_blocks, per_task, [&](int64_t begin, int64_t end) {
    BlockSums sums;
    for (int64_t b = begin; b < end; ++b) {
      for (int64_t m0 = 0; m0 < p.M; m0 += kMaxRows) {
        const int nm = static_cast<int>(std::min<int64_t>(kMaxRows, p.M - m0));
        const QuantizedRow* xr = xs.data() + m0;
        if (p.is_int4) {
          const uint8_t* c = p.codes + b * block_bytes;
          const c10::Half* sz = p.scale_zero + b * p.groups * 32;
          switch (nm) {
            case 1: int4_block<1>(c, sz, p.groups, xr, sums); break;
            case 2: int4_block<2>(c, sz, p.groups, xr, sums); break;
            case 3: int4_block<3>(c, sz, p.groups, xr, sums); break;
            default: int4_block<4>(c, sz, p.groups, xr, sums); break;
          }
        } else {
          const int8_t* c = reinterpret_cast<const int8_t*>(p.codes) + b * block_bytes;
          switch (nm) {
            case 1: int8_block<1>(c, p.groups, xr, sums); break;
            case 2: int8_block<2>(c, p.groups, xr, sums); break;
            case 3: int8_block<3>(c, p.groups, xr, sums); break;
            default: int8_block<4>(c, p.groups, xr, sums); break;
          }
        }
        write_rows(p, sums, m0, nm, b * kRowBlock, bp, rp, r_row, yp);
      }
    }
  });
#endif
}

// The problem of y = x @ dequant(W)^T (+ bias) (+ residual), its arguments checked (`op` names
// the op in the messages).
QuantProblem checked_problem(const char* op, const at::Tensor& x, const at::Tensor& codes,
                             const c10::optional<at::Tensor>& scale_zero,
                             const c10::optional<at::Tensor>& scale, int64_t out_features,
                             const c10::optional<at::Tensor>& bias,
                             const c10::optional<at::Tensor>& residual) {
  TORCH_CHECK(kHasKernel, op,
              ": this build has neither AVX-512 VNNI nor AVX2 (see cpu_extension's isa)");
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, op, ": x must be [M, K], rows contiguous");
  TORCH_CHECK(codes.is_contiguous(), op, ": codes must be contiguous");
  const bool is_int4 = scale_zero.has_value();
  TORCH_CHECK(is_int4 != scale.has_value(), op, ": give scale_zero (int4) or scale (int8)");
  TORCH_CHECK(codes.dim() == 4 && codes.size(2) == kRowBlock && codes.size(3) == 4, op,
              ": codes must be [N/16, K/8 (int4) or K/4 (int8), 16, 4]");
  const int64_t num_blocks = codes.size(0);
  const int64_t groups = codes.size(1) / (is_int4 ? kGroup / 8 : kGroup / 4);
  TORCH_CHECK(codes.size(1) == groups * (is_int4 ? kGroup / 8 : kGroup / 4), op,
              ": codes must cover whole groups of 32 along K");
  TORCH_CHECK(num_blocks * kRowBlock >= out_features && x.size(1) <= groups * kGroup, op,
              ": codes do not cover [out_features, K]");
  if (is_int4) {
    TORCH_CHECK(codes.scalar_type() == at::kByte, op, ": int4 codes must be uint8");
    TORCH_CHECK(scale_zero->scalar_type() == at::kHalf && scale_zero->is_contiguous() &&
                    scale_zero->numel() == num_blocks * groups * 32,
                op, ": scale_zero must be a contiguous float16 [N/16, K/32, 2, 16]");
  } else {
    TORCH_CHECK(codes.scalar_type() == at::kChar, op, ": int8 codes must be int8");
    TORCH_CHECK(scale->scalar_type() == at::kFloat && scale->is_contiguous() &&
                    scale->numel() >= num_blocks * kRowBlock,
                op, ": scale must be a contiguous float32 [N padded to 16]");
  }
  if (bias)
    TORCH_CHECK(bias->scalar_type() == x.scalar_type() && bias->is_contiguous() &&
                    bias->numel() == out_features,
                op, ": bias must be a contiguous [N] in x's dtype");
  if (residual)
    TORCH_CHECK(residual->scalar_type() == x.scalar_type() && residual->dim() == 2 &&
                    residual->size(0) == x.size(0) && residual->size(1) == out_features &&
                    residual->stride(1) == 1,
                op, ": residual must be [M, N] in x's dtype, rows contiguous");
  QuantProblem p;
  p.M = x.size(0);
  p.N = out_features;
  p.K = x.size(1);
  p.groups = groups;
  p.num_blocks = (out_features + kRowBlock - 1) / kRowBlock;
  p.codes = reinterpret_cast<const uint8_t*>(codes.data_ptr());
  p.scale_zero = is_int4 ? scale_zero->data_ptr<c10::Half>() : nullptr;
  p.scale = is_int4 ? nullptr : scale->data_ptr<float>();
  p.is_int4 = is_int4;
  return p;
}

}  // namespace

at::Tensor llmbench_ops::quant_gemv(const at::Tensor& x, const at::Tensor& codes,
                                    const OptTensor& scale_zero, const OptTensor& scale,
                                    int64_t out_features, const OptTensor& bias,
                                    const OptTensor& residual, at::Tensor y) {
  const QuantProblem p =
      checked_problem("quant_gemv", x, codes, scale_zero, scale, out_features, bias, residual);
  y = output("quant_gemv", y, {p.M, p.N}, x);
  dispatch_float(x.scalar_type(), "quant_gemv", [&](auto tag) {
    run<decltype(tag)>(p, x, bias, residual, y);
  });
  return y;
}

namespace {

at::Tensor quant_gemv(const at::Tensor& x, const at::Tensor& codes,
                      const c10::optional<at::Tensor>& scale_zero,
                      const c10::optional<at::Tensor>& scale, int64_t out_features,
                      const c10::optional<at::Tensor>& bias,
                      const c10::optional<at::Tensor>& residual) {
  return llmbench_ops::quant_gemv(x, codes, scale_zero, scale, out_features, bias, residual,
                                  at::Tensor());
}

// ---------------------------------------------------------------------------------------------
// The layouts back to W [N, K] in `dtype`, for products of many rows (prefill), which then run
// as one dense matmul (oneDNN: on a CPU with AMX, its tiles): int4 w = s·(q − 8) + z, int8
// w = s·q, each in float32 (a multiply, then an add: as `dequantize_int4_blocks` rounds) and
// rounded once. Every row block of 16 is one task; element by element (a row's 32 codes of a
// group sit 4 bytes a chunk, chunks 64 bytes apart). Only float32 and float16 x take this path
// (bfloat16 x meets W on panels, below), and `cpu_quant_gemv.dequantize`.

#if defined(LLMBENCH_QUANT_VNNI) || defined(LLMBENCH_QUANT_AVX2)
template <typename T>
__attribute__((optimize("fp-contract=off")))  // s·(q − 8), then + z: two roundings, no FMA
void dequantize_blocks(const QuantProblem& p, T* w) {
  at::parallel_for(0, p.num_blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t rows = std::min<int64_t>(kRowBlock, p.N - b * kRowBlock);
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t n = b * kRowBlock + i;
        for (int64_t g = 0; g < p.groups; ++g) {
          const int64_t k0 = g * kGroup, count = std::min<int64_t>(kGroup, p.K - k0);
          T* out = w + n * p.K + k0;
          if (p.is_int4) {
            // k = 8t + 4·nibble + j: chunk t's lane i, byte j, low nibble first
            const uint8_t* c = p.codes + (b * p.groups + g) * 256 + i * 4;
            const c10::Half* sz = p.scale_zero + (b * p.groups + g) * 32;
            const float s = static_cast<float>(sz[i]), z = static_cast<float>(sz[16 + i]);
            for (int64_t k = 0; k < count; ++k) {
              const int q = (c[(k / 8) * 64 + k % 4] >> (k % 8 / 4 * 4)) & 0x0F;
              out[k] = from_f<T>((static_cast<float>(q) - 8.0f) * s + z);
            }
          } else {
            // k = 4t + j: chunk t's lane i, byte j
            const auto* c =
                reinterpret_cast<const int8_t*>(p.codes) + (b * p.groups + g) * 512 + i * 4;
            const float s = p.scale[n];
            for (int64_t k = 0; k < count; ++k)
              out[k] = from_f<T>(static_cast<float>(c[(k / 4) * 64 + k % 4]) * s);
          }
        }
      }
    }
  });
}
#endif

// W [N, K] of problem p in `options`' dtype (dequantize_blocks, every block a task).
at::Tensor dequantized(const QuantProblem& p, const at::TensorOptions& options) {
  at::Tensor w = at::empty({p.N, p.K}, options);
#if defined(LLMBENCH_QUANT_VNNI) || defined(LLMBENCH_QUANT_AVX2)
  dispatch_float(w.scalar_type(), "quant_dequantize", [&](auto tag) {
    using scalar_t = decltype(tag);
    dequantize_blocks<scalar_t>(p, w.data_ptr<scalar_t>());
  });
#endif
  return w;
}

at::Tensor quant_dequantize(const at::Tensor& codes, const c10::optional<at::Tensor>& scale_zero,
                            const c10::optional<at::Tensor>& scale, int64_t out_features,
                            int64_t in_features, at::ScalarType dtype) {
  TORCH_CHECK(kHasKernel, "quant_dequantize: this build has neither AVX-512 VNNI nor AVX2");
  TORCH_CHECK(codes.is_contiguous() && codes.dim() == 4 && codes.size(2) == kRowBlock &&
                  codes.size(3) == 4,
              "quant_dequantize: codes must be contiguous [N/16, K/8 or K/4, 16, 4]");
  const bool is_int4 = scale_zero.has_value();
  TORCH_CHECK(is_int4 != scale.has_value(), "quant_dequantize: give scale_zero or scale");
  TORCH_CHECK(codes.scalar_type() == (is_int4 ? at::kByte : at::kChar),
              "quant_dequantize: int4 codes are uint8, int8 codes int8");
  QuantProblem p;
  p.M = 0;
  p.N = out_features;
  p.K = in_features;
  p.groups = codes.size(1) / (is_int4 ? kGroup / 8 : kGroup / 4);
  p.num_blocks = (out_features + kRowBlock - 1) / kRowBlock;
  TORCH_CHECK(p.num_blocks <= codes.size(0) && in_features <= p.groups * kGroup,
              "quant_dequantize: codes do not cover [out_features, in_features]");
  p.codes = reinterpret_cast<const uint8_t*>(codes.data_ptr());
  p.scale_zero = is_int4 ? scale_zero->data_ptr<c10::Half>() : nullptr;
  p.scale = is_int4 ? nullptr : scale->data_ptr<float>();
  p.is_int4 = is_int4;
  return dequantized(p, codes.options().dtype(dtype));
}

// ---------------------------------------------------------------------------------------------
// Products of many rows (prefill), weight-only: x keeps its precision (nothing quantised per
// call). bfloat16 x: each block of W dequantised in cache into gemm_panels.h's panel once a
// call and met by every row of x, on the AMX tiles where the OS lets this process use them
// (gemv_amx.cpp), else on AVX-512 BF16 vectors (gemm_vectors.cpp), else (AVX2) in float32
// panels on FMAs (gemm_float32_panels.cpp). Otherwise (float32 or float16 x) W is dequantised
// whole to x's dtype (dequantize_blocks) and multiplied by at::addmm (oneDNN).

// Which product meets bfloat16 x with the panels of W.
enum class Panels { kTiles, kBf16Vectors, kFloat32 };

at::Tensor quant_gemm_panels(const QuantProblem& p, const at::Tensor& x, Panels panels,
                             const c10::optional<at::Tensor>& bias,
                             const c10::optional<at::Tensor>& residual) {
  // x [M, K] padded with zeros to the codes' groups of 32 along K, and (for the tiles, which
  // load 16 rows at a time) to whole chunks of 16 rows; in float32 for the float32 panels.
  const bool on_tiles = panels == Panels::kTiles;
  const at::ScalarType x_dtype = panels == Panels::kFloat32 ? at::kFloat : x.scalar_type();
  const int64_t K = p.groups * kGroup, rows = on_tiles ? (p.M + 15) / 16 * 16 : p.M;
  at::Tensor xp = x.to(x_dtype);
  if (K != p.K || rows != p.M) {
    xp = at::zeros({rows, K}, x.options().dtype(x_dtype));
    xp.narrow(0, 0, p.M).narrow(1, 0, p.K).copy_(x);
  }
  at::Tensor y = at::empty({p.M, p.N}, x.options());
  const llmbench_gemm::QuantWeights w{p.codes, p.scale_zero, p.scale, p.groups, p.is_int4};
  const llmbench_gemm::Epilogue epilogue{
      bias ? bias->data_ptr<c10::BFloat16>() : nullptr,
      residual ? residual->data_ptr<c10::BFloat16>() : nullptr,
      residual ? residual->stride(0) : 0, y.data_ptr<c10::BFloat16>()};
  const int64_t pairs = (p.num_blocks + 1) / 2;  // two blocks of W meet each row of x at once
  at::parallel_for(0, pairs, 1, [&](int64_t begin, int64_t end) {
    const int64_t b_begin = 2 * begin, b_end = std::min(2 * end, p.num_blocks);
    const int64_t x_row = xp.stride(0);
    const auto* xd = static_cast<const uint16_t*>(xp.data_ptr());
    switch (panels) {
      case Panels::kTiles:
        llmbench_amx::gemm_quant_bf16(xd, x_row, p.M, p.N, w, b_begin, b_end, epilogue);
        break;
      case Panels::kBf16Vectors:
        llmbench_gemm::gemm_quant_vectors(xd, x_row, p.M, p.N, w, b_begin, b_end, epilogue);
        break;
      case Panels::kFloat32:
        llmbench_gemm::gemm_quant_float32_panels(xp.data_ptr<float>(), x_row, p.M, p.N, w,
                                                 b_begin, b_end, epilogue);
        break;
    }
  });
  return y;
}

at::Tensor quant_gemm(const at::Tensor& x, const at::Tensor& codes,
                      const c10::optional<at::Tensor>& scale_zero,
                      const c10::optional<at::Tensor>& scale, int64_t out_features,
                      const c10::optional<at::Tensor>& bias,
                      const c10::optional<at::Tensor>& residual) {
  const QuantProblem p =
      checked_problem("quant_gemm", x, codes, scale_zero, scale, out_features, bias, residual);
  if (x.scalar_type() == at::kBFloat16) {
    if (llmbench_amx::available()) return quant_gemm_panels(p, x, Panels::kTiles, bias, residual);
    if (llmbench_gemm::vectors_available())
      return quant_gemm_panels(p, x, Panels::kBf16Vectors, bias, residual);
    if (llmbench_gemm::float32_panels_available())
      return quant_gemm_panels(p, x, Panels::kFloat32, bias, residual);
  }
  const at::Tensor w_t = dequantized(p, x.options()).t();
  if (!bias && !residual) return at::mm(x, w_t);
  // The bias or the residual added to the float32 sums inside the matmul and rounded once, as
  // `engine.linear.Linear` does (mm, then two add_, rounded a 16-bit y three times); with
  // both, their sum is rounded first.
  const at::Tensor add = !residual ? *bias : bias ? at::add(*residual, *bias) : *residual;
  return at::addmm(add, x, w_t);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(LLMBENCH_EXTENSION_NAMESPACE, m) {
  m.def(
      "quant_gemv(Tensor x, Tensor codes, Tensor? scale_zero, Tensor? scale, int out_features, "
      "Tensor? bias, Tensor? residual) -> Tensor");
  m.def(
      "quant_gemm(Tensor x, Tensor codes, Tensor? scale_zero, Tensor? scale, int out_features, "
      "Tensor? bias, Tensor? residual) -> Tensor");
  m.def(
      "quant_dequantize(Tensor codes, Tensor? scale_zero, Tensor? scale, int out_features, "
      "int in_features, ScalarType dtype) -> Tensor");
}

TORCH_LIBRARY_IMPL(LLMBENCH_EXTENSION_NAMESPACE, CPU, m) {
  m.impl("quant_gemv", &quant_gemv);
  m.impl("quant_gemm", &quant_gemm);
  m.impl("quant_dequantize", &quant_dequantize);
}
