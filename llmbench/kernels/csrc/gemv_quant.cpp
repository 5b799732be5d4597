// Decode-shaped products with int8 or int4 weights on AVX-512 VNNI CPUs:
//     y[M, N] = x[M, K] @ dequant(W)[N, K]^T (+ bias[N]) (+ residual[M, N]),  y in x's dtype.
//
// x is quantised per call, per group of 32 along K, to int8 with a float32 scale (sx = max|x| /
// 127), as llama.cpp quantises activations for its Q4/Q8 dot products; W's codes then multiply
// x's with VPDPBUSD (64 byte products per instruction, summed in int32), and each group's sum
// is scaled in float32:
//     int4 (group 32, zero point): w = s·(q − 8) + z, q in 0..15
//         Σ_k w·x = Σ_g [ s_g·sx_g·Σ q·xq + (z_g − 8·s_g)·Σ_g x ]        (Σ_g x: float32 sums)
//     int8 (per output channel):   w = s·q, q in −127..127
//         Σ_k w·x = s·Σ_g sx_g·Σ q·xq
// VPDPBUSD multiplies unsigned by signed bytes: int4 codes are unsigned already; for int8 the
// signs move to the weights (|xq| · ±q, flipped where xq < 0).
//
// Layouts (`kernels.cpu_quant_gemv` builds them at load), rows in blocks of 4 so that one
// 64-byte load holds 16 codes of 4 rows and the x bytes they meet are one group's, repeated:
//     int4  codes [N/4, K/32, 4, 16] uint8: byte i of row r = q[r, 32g + i] | q[r, 32g + 16 + i] << 4
//           scale_zero [N/4, K/32, 2, 4] float16: the 4 rows' scales, then their zero points
//     int8  codes [N/4, K/32, 2, 4, 16] int8: half h of group g, row r: q[r, 32g + 16h + i]
//           scale [N] float32
// N is padded to a multiple of 4 and K to a multiple of 32 at load (zero rows, zero columns).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "simd.h"

#ifndef LLMBENCH_EXTENSION_NAMESPACE
#define LLMBENCH_EXTENSION_NAMESPACE llmbench_cpu_ext
#endif

namespace {

using llmbench_simd::dispatch_float;
using llmbench_simd::from_f;
using llmbench_simd::to_f;

constexpr int64_t kGroup = 32;     // x's quantisation group, and int4's weight group
constexpr int64_t kRowBlock = 4;   // rows of W per 64-byte load
constexpr int64_t kMaxRows = 4;    // rows of x per pass over a block of W

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
constexpr bool kHasVnni = true;

// One row of x quantised for the kernels: per group g, its scale sx[g], its float32 sum
// xsum[g], and for each half h the 16 int8 codes repeated 4 times (one copy per row of a
// block) as `rep[g][h]`: xq for int4, |xq| with the sign mask `neg[g][h]` for int8.
struct QuantizedRow {
  std::vector<float> sx, xsum;
  std::vector<int8_t> rep;      // [G, 2, 64]
  std::vector<uint64_t> neg;    // [G, 2]: bit j set where rep's byte j came from an xq < 0
};

template <typename T>
void quantize_row(const T* x, int64_t K, int64_t groups, bool is_abs, QuantizedRow& out) {
  out.sx.assign(groups, 0.0f);
  out.xsum.assign(groups, 0.0f);
  out.rep.assign(groups * 2 * 64, 0);
  out.neg.assign(groups * 2, 0);
  float xf[kGroup];
  for (int64_t g = 0; g < groups; ++g) {
    float amax = 0.0f, sum = 0.0f;
    for (int64_t i = 0; i < kGroup; ++i) {
      const int64_t k = g * kGroup + i;
      xf[i] = k < K ? to_f(x[k]) : 0.0f;
      amax = std::max(amax, std::fabs(xf[i]));
      sum += xf[i];
    }
    const float sx = amax / 127.0f;
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    out.sx[g] = sx;
    out.xsum[g] = sum;
    for (int64_t h = 0; h < 2; ++h) {
      int8_t q16[16];
      uint64_t neg = 0;
      for (int64_t i = 0; i < 16; ++i) {
        const int q = static_cast<int>(std::nearbyint(xf[16 * h + i] * inv));
        q16[i] = static_cast<int8_t>(is_abs ? std::abs(q) : q);
        if (q < 0)
          for (int64_t r = 0; r < kRowBlock; ++r) neg |= uint64_t(1) << (16 * r + i);
      }
      int8_t* dst = &out.rep[(g * 2 + h) * 64];
      for (int64_t r = 0; r < kRowBlock; ++r) std::memcpy(dst + 16 * r, q16, 16);
      out.neg[g * 2 + h] = neg;
    }
  }
}

// Lane sums → row sums: lanes 4r .. 4r+3 of v belong to row r of the block.
inline void sum_lanes_by_row(__m512 v, float rows[kRowBlock]) {
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, v);
  for (int64_t r = 0; r < kRowBlock; ++r)
    rows[r] = lanes[4 * r] + lanes[4 * r + 1] + lanes[4 * r + 2] + lanes[4 * r + 3];
}

// int4: partial sums of rows [4·block, 4·block + 4) for NM rows of x.
template <int NM>
void int4_block(const uint8_t* codes, const c10::Half* scale_zero, int64_t groups,
                const QuantizedRow* xs, float out[kMaxRows][kRowBlock]) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  // lane l of a product vector belongs to row l / 4: spread the 4 rows' scales that way
  const __m512i spread = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  __m512 acc[NM];
  __m128 offset_acc[NM];
  for (int m = 0; m < NM; ++m) {
    acc[m] = _mm512_setzero_ps();
    offset_acc[m] = _mm_setzero_ps();
  }
  for (int64_t g = 0; g < groups; ++g) {
    const __m512i packed = _mm512_loadu_si512(codes + g * 64);
    const __m512i lo = _mm512_and_si512(packed, low4);
    const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low4);
    const __m256 sz = _mm256_cvtph_ps(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(scale_zero + g * 8)));
    const __m128 s4 = _mm256_castps256_ps128(sz), z4 = _mm256_extractf128_ps(sz, 1);
    const __m512 s16 = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(s4));
    const __m128 c4 = _mm_fnmadd_ps(_mm_set1_ps(8.0f), s4, z4);  // z − 8·s per row
    for (int m = 0; m < NM; ++m) {
      const int8_t* rep = &xs[m].rep[g * 128];
      __m512i isum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(rep));
      isum = _mm512_dpbusd_epi32(isum, hi, _mm512_loadu_si512(rep + 64));
      const __m512 scale = _mm512_mul_ps(s16, _mm512_set1_ps(xs[m].sx[g]));
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, acc[m]);
      offset_acc[m] = _mm_fmadd_ps(c4, _mm_set1_ps(xs[m].xsum[g]), offset_acc[m]);
    }
  }
  for (int m = 0; m < NM; ++m) {
    sum_lanes_by_row(acc[m], out[m]);
    alignas(16) float offsets[4];
    _mm_store_ps(offsets, offset_acc[m]);
    for (int64_t r = 0; r < kRowBlock; ++r) out[m][r] += offsets[r];
  }
}

// int8: partial sums (before the per-row scale) of a block's 4 rows for NM rows of x.
template <int NM>
void int8_block(const int8_t* codes, int64_t groups, const QuantizedRow* xs,
                float out[kMaxRows][kRowBlock]) {
  const __m512i zero = _mm512_setzero_si512();
  __m512 acc[NM];
  for (int m = 0; m < NM; ++m) acc[m] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const __m512i w0 = _mm512_loadu_si512(codes + g * 128);
    const __m512i w1 = _mm512_loadu_si512(codes + g * 128 + 64);
    for (int m = 0; m < NM; ++m) {
      const int8_t* rep = &xs[m].rep[g * 128];
      const uint64_t* neg = &xs[m].neg[g * 2];
      const __m512i s0 = _mm512_mask_sub_epi8(w0, neg[0], zero, w0);  // ±q where xq < 0
      const __m512i s1 = _mm512_mask_sub_epi8(w1, neg[1], zero, w1);
      __m512i isum = _mm512_dpbusd_epi32(zero, _mm512_loadu_si512(rep), s0);
      isum = _mm512_dpbusd_epi32(isum, _mm512_loadu_si512(rep + 64), s1);
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(xs[m].sx[g]), acc[m]);
    }
  }
  for (int m = 0; m < NM; ++m) sum_lanes_by_row(acc[m], out[m]);
}
#else
constexpr bool kHasVnni = false;
#endif

struct QuantProblem {
  int64_t M, N, K, groups, num_blocks;
  const uint8_t* codes;
  const c10::Half* scale_zero;  // int4
  const float* scale;           // int8
  bool is_int4;
};

template <typename T>
at::Tensor run(const QuantProblem& p, const at::Tensor& x, const c10::optional<at::Tensor>& bias,
               const c10::optional<at::Tensor>& residual) {
  at::Tensor y = at::empty({p.M, p.N}, x.options());
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
  const T* xp = x.data_ptr<T>();
  std::vector<QuantizedRow> xs(p.M);
  for (int64_t m = 0; m < p.M; ++m)
    quantize_row(xp + m * x.stride(0), p.K, p.groups, !p.is_int4, xs[m]);
  const T* bp = bias ? bias->data_ptr<T>() : nullptr;
  const T* rp = residual ? residual->data_ptr<T>() : nullptr;
  const int64_t r_row = residual ? residual->stride(0) : 0;
  T* yp = y.data_ptr<T>();
  const int64_t block_bytes = p.groups * 64 * (p.is_int4 ? 1 : 2);
  // Each thread streams one contiguous run of row blocks, at least ~64 KiB of codes.
  const int64_t per_task = std::max<int64_t>(1, (64 * 1024) / block_bytes);
  at::parallel_for(0, p.num_blocks, per_task, [&](int64_t begin, int64_t end) {
    float part[kMaxRows][kRowBlock];
    for (int64_t b = begin; b < end; ++b) {
      for (int64_t m0 = 0; m0 < p.M; m0 += kMaxRows) {
        const int nm = static_cast<int>(std::min<int64_t>(kMaxRows, p.M - m0));
        const QuantizedRow* rows = xs.data() + m0;
        if (p.is_int4) {
          const uint8_t* c = p.codes + b * block_bytes;
          const c10::Half* sz = p.scale_zero + b * p.groups * 8;
          switch (nm) {
            case 1: int4_block<1>(c, sz, p.groups, rows, part); break;
            case 2: int4_block<2>(c, sz, p.groups, rows, part); break;
            case 3: int4_block<3>(c, sz, p.groups, rows, part); break;
            default: int4_block<4>(c, sz, p.groups, rows, part); break;
          }
        } else {
          const int8_t* c = reinterpret_cast<const int8_t*>(p.codes) + b * block_bytes;
          switch (nm) {
            case 1: int8_block<1>(c, p.groups, rows, part); break;
            case 2: int8_block<2>(c, p.groups, rows, part); break;
            case 3: int8_block<3>(c, p.groups, rows, part); break;
            default: int8_block<4>(c, p.groups, rows, part); break;
          }
        }
        for (int m = 0; m < nm; ++m) {
          for (int64_t r = 0; r < kRowBlock; ++r) {
            const int64_t n = b * kRowBlock + r;
            if (n >= p.N) continue;  // a padding row
            float v = p.is_int4 ? part[m][r] : part[m][r] * p.scale[n];
            if (bp) v += to_f(bp[n]);
            if (rp) v += to_f(rp[(m0 + m) * r_row + n]);
            yp[(m0 + m) * p.N + n] = from_f<T>(v);
          }
        }
      }
    }
  });
#endif
  return y;
}

at::Tensor quant_gemv(const at::Tensor& x, const at::Tensor& codes,
                      const c10::optional<at::Tensor>& scale_zero,
                      const c10::optional<at::Tensor>& scale, int64_t out_features,
                      const c10::optional<at::Tensor>& bias,
                      const c10::optional<at::Tensor>& residual) {
  TORCH_CHECK(kHasVnni, "quant_gemv: this build has no AVX-512 VNNI (see cpu_extension's isa)");
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, "quant_gemv: x must be [M, K], rows contiguous");
  TORCH_CHECK(codes.is_contiguous(), "quant_gemv: codes must be contiguous");
  const bool is_int4 = scale_zero.has_value();
  TORCH_CHECK(is_int4 != scale.has_value(), "quant_gemv: give scale_zero (int4) or scale (int8)");
  const int64_t num_blocks = codes.size(0), groups = codes.size(1);
  TORCH_CHECK(num_blocks * kRowBlock >= out_features && x.size(1) <= groups * kGroup,
              "quant_gemv: codes do not cover [out_features, K]");
  if (is_int4) {
    TORCH_CHECK(codes.scalar_type() == at::kByte && codes.dim() == 4 && codes.size(2) == 4 &&
                    codes.size(3) == 16,
                "quant_gemv: int4 codes must be uint8 [N/4, K/32, 4, 16]");
    TORCH_CHECK(scale_zero->scalar_type() == at::kHalf && scale_zero->is_contiguous() &&
                    scale_zero->numel() == num_blocks * groups * 8,
                "quant_gemv: scale_zero must be a contiguous float16 [N/4, K/32, 2, 4]");
  } else {
    TORCH_CHECK(codes.scalar_type() == at::kChar && codes.dim() == 5 && codes.size(2) == 2 &&
                    codes.size(3) == 4 && codes.size(4) == 16,
                "quant_gemv: int8 codes must be int8 [N/4, K/32, 2, 4, 16]");
    TORCH_CHECK(scale->scalar_type() == at::kFloat && scale->is_contiguous() &&
                    scale->numel() >= out_features,
                "quant_gemv: scale must be a contiguous float32 [N]");
  }
  if (bias)
    TORCH_CHECK(bias->scalar_type() == x.scalar_type() && bias->is_contiguous() &&
                    bias->numel() == out_features,
                "quant_gemv: bias must be a contiguous [N] in x's dtype");
  if (residual)
    TORCH_CHECK(residual->scalar_type() == x.scalar_type() && residual->dim() == 2 &&
                    residual->size(0) == x.size(0) && residual->size(1) == out_features &&
                    residual->stride(1) == 1,
                "quant_gemv: residual must be [M, N] in x's dtype, rows contiguous");
  QuantProblem p;
  p.M = x.size(0);
  p.N = out_features;
  p.K = x.size(1);
  p.groups = groups;
  p.num_blocks = num_blocks;
  p.codes = reinterpret_cast<const uint8_t*>(codes.data_ptr());
  p.scale_zero = is_int4 ? scale_zero->data_ptr<c10::Half>() : nullptr;
  p.scale = is_int4 ? nullptr : scale->data_ptr<float>();
  p.is_int4 = is_int4;
  at::Tensor y;
  dispatch_float(x.scalar_type(), "quant_gemv", [&](auto tag) {
    y = run<decltype(tag)>(p, x, bias, residual);
  });
  return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(LLMBENCH_EXTENSION_NAMESPACE, m) {
  m.def(
      "quant_gemv(Tensor x, Tensor codes, Tensor? scale_zero, Tensor? scale, int out_features, "
      "Tensor? bias, Tensor? residual) -> Tensor");
}

TORCH_LIBRARY_IMPL(LLMBENCH_EXTENSION_NAMESPACE, CPU, m) { m.impl("quant_gemv", &quant_gemv); }
