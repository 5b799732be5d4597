// The per-layer ops of a CPU decode step besides the matmuls and the attention
// (decode_attention.cpp), one call each where torch runs several: RMSNorm, RoPE in place,
// SwiGLU's silu(gate) · up, and the fused layer's K/V write (a copy a row into its slot). float32, bfloat16 and float16 tensors; every sum in float32, outputs rounded once
// to the input's dtype (as torch's own ops round them).
//
// In a decode step of a small model each of these is a few microseconds of arithmetic; through
// torch each was several dispatched ops (measured here: RMSNorm 28 us a call), together as long
// as the layer's matmuls.
//
// Compiled into the same library as gemv.cpp (the ops register into its namespace).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "ops.h"
#include "simd.h"

#ifndef LLMBENCH_EXTENSION_NAMESPACE
#define LLMBENCH_EXTENSION_NAMESPACE llmbench_cpu_ext
#endif

namespace {

using llmbench_simd::dispatch_float;
using llmbench_simd::dot;
using llmbench_simd::from_f;
using llmbench_simd::to_f;
#if defined(__AVX512F__)
using llmbench_simd::exp_nonpositive;
using llmbench_simd::load16;
#endif

// ---------------------------------------------------------------------------------------------
// RMSNorm: y = x · rsqrt(mean(x²) + eps) · w in float32, rounded once to x's dtype.

template <typename T>
void rms_norm_rows(const T* x, int64_t x_row, const T* w, T* y, int64_t rows, int64_t h,
                   float eps) {
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> xf(h);
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * x_row;
      for (int64_t i = 0; i < h; ++i) xf[i] = to_f(xr[i]);
      const float inv = 1.0f / std::sqrt(dot(xf.data(), xr, h) / h + eps);
      T* yr = y + r * h;
      for (int64_t i = 0; i < h; ++i) yr[i] = from_f<T>(xf[i] * inv * to_f(w[i]));
    }
  });
}

}  // namespace

at::Tensor llmbench_ops::rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps,
                                  at::Tensor y) {
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, "rms_norm: x must be [T, h] with contiguous rows");
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(1) && weight.is_contiguous() &&
                  weight.scalar_type() == x.scalar_type(),
              "rms_norm: weight must be a contiguous [h] vector in x's dtype");
  y = output("rms_norm", y, {x.size(0), x.size(1)}, x);
  dispatch_float(x.scalar_type(), "rms_norm", [&](auto tag) {
    using scalar_t = decltype(tag);
    rms_norm_rows<scalar_t>(x.data_ptr<scalar_t>(), x.stride(0), weight.data_ptr<scalar_t>(),
                            y.data_ptr<scalar_t>(), x.size(0), x.size(1),
                            static_cast<float>(eps));
  });
  return y;
}

namespace {

// ---------------------------------------------------------------------------------------------
// RoPE in place on x [T, heads·d] whose columns hold interleaved pairs (x[2i], x[2i+1]):
// (a, b) → (a·c − b·s, a·s + b·c) with c, s = cos_sin[positions[t], i mod d/2], in float32,
// rounded once.

#if defined(__AVX512F__) && defined(__AVX512BW__)
// 16 pairs of a bfloat16 row (32 values from x, pairs j0 .. j0 + 15) rotated by their 16
// (cos, sin) pairs at cs: each product and sum rounded as the scalar loop rounds them, the
// results to bfloat16 to nearest even (as c10 rounds; RoPE's inputs are never NaN).
inline void rope16_bf16(c10::BFloat16* x, const float* cs) {
  const __m512i pairs = _mm512_loadu_si512(x);  // dword i: b (high half), a (low half)
  const __m512 a = _mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16));
  const __m512 b = _mm512_castsi512_ps(_mm512_and_si512(pairs, _mm512_set1_epi32(0xFFFF0000)));
  const __m512 cs0 = _mm512_loadu_ps(cs), cs1 = _mm512_loadu_ps(cs + 16);
  const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512 c = _mm512_permutex2var_ps(cs0, even, cs1);
  const __m512 s = _mm512_permutex2var_ps(cs0, _mm512_add_epi32(even, _mm512_set1_epi32(1)), cs1);
  const __m512 a2 = _mm512_sub_ps(_mm512_mul_ps(a, c), _mm512_mul_ps(b, s));
  const __m512 b2 = _mm512_add_ps(_mm512_mul_ps(a, s), _mm512_mul_ps(b, c));
  auto rounded = [](__m512 v) {  // the bfloat16 bits in the low half of each dword
    const __m512i bits = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    return _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))),
                             16);
  };
  _mm512_storeu_si512(x, _mm512_or_si512(rounded(a2), _mm512_slli_epi32(rounded(b2), 16)));
}
#endif

template <typename T>
void rope_rows(T* x, int64_t x_row, int64_t rows, int64_t width, const int64_t* positions,
               const float* cos_sin, int64_t half_dim) {
  at::parallel_for(0, rows, 8, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      T* xr = x + r * x_row;
      const float* cs = cos_sin + positions[r] * half_dim * 2;
      int64_t j = 0;
#if defined(__AVX512F__) && defined(__AVX512BW__)
      // 16 pairs at a time within a head (its d/2 pairs a multiple of 16): a prompt's RoPE
      // was 7% of a 2,048-token prefill one pair at a time.
      if constexpr (std::is_same_v<T, c10::BFloat16>)
        if (half_dim % 16 == 0)
          for (; j + 16 <= width / 2; j += 16) rope16_bf16(xr + 2 * j, cs + 2 * (j % half_dim));
#endif
      for (; j < width / 2; ++j) {
        const int64_t i = j % half_dim;
        const float a = to_f(xr[2 * j]), b = to_f(xr[2 * j + 1]);
        const float c = cs[2 * i], s = cs[2 * i + 1];
        xr[2 * j] = from_f<T>(a * c - b * s);
        xr[2 * j + 1] = from_f<T>(a * s + b * c);
      }
    }
  });
}

}  // namespace

void llmbench_ops::rope_(at::Tensor x, const at::Tensor& positions, const at::Tensor& cos_sin,
                         int64_t head_dim) {
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, "rope_: x must be [T, heads*d] with contiguous rows");
  TORCH_CHECK(head_dim > 0 && head_dim % 2 == 0 && x.size(1) % head_dim == 0,
              "rope_: x's width must be a multiple of an even head_dim");
  TORCH_CHECK(positions.dim() == 1 && positions.size(0) == x.size(0) &&
                  positions.scalar_type() == at::kLong && positions.is_contiguous(),
              "rope_: positions must be a contiguous int64 [T]");
  TORCH_CHECK(cos_sin.dim() == 3 && cos_sin.size(1) == head_dim / 2 && cos_sin.size(2) == 2 &&
                  cos_sin.scalar_type() == at::kFloat && cos_sin.is_contiguous(),
              "rope_: cos_sin must be a contiguous float32 [P, d/2, 2]");
  dispatch_float(x.scalar_type(), "rope_", [&](auto tag) {
    using scalar_t = decltype(tag);
    rope_rows<scalar_t>(x.data_ptr<scalar_t>(), x.stride(0), x.size(0), x.size(1),
                        positions.data_ptr<int64_t>(), cos_sin.data_ptr<float>(), head_dim / 2);
  });
}

namespace {

// ---------------------------------------------------------------------------------------------
// SwiGLU's activation: out[t, j] = silu(g) · u = g / (1 + e^−g) · u, g = gate_up[t, j],
// u = gate_up[t, I + j], in float32, rounded once (as the Triton kernel `silu_and_mul`); for
// 16-bit outputs e^x and the reciprocal are taken to ~1e-4 (below).

#if defined(__AVX512F__)
// g / (1 + e^−g) · u, e^−g taken as e^−|g| (never overflows): for g < 0, e^g / (1 + e^g).
// kCoarse (16-bit outputs): e^x to ~1e-4 and 1 / (1 + e) by rcp14 (2^-14), where the exact
// forms (float32 outputs) cost half again as much: the activation is computed, not memory,
// bound (2,048 × 1,536 outputs: as fast from L2 as from memory).
template <bool kCoarse>
inline __m512 silu_mul16(__m512 g, __m512 u) {
  const __m512 minus_abs = _mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(g));
  const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
  const __m512 e = kCoarse ? llmbench_simd::exp2_coarse(_mm512_mul_ps(minus_abs, log2e))
                           : exp_nonpositive(minus_abs);
  const __m512 one = _mm512_set1_ps(1.0f);
  const __mmask16 negative = _mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_LT_OQ);
  const __m512 numerator = _mm512_mask_blend_ps(negative, one, e);
  const __m512 denominator = _mm512_add_ps(one, e);
  const __m512 sigmoid = kCoarse ? _mm512_mul_ps(numerator, _mm512_rcp14_ps(denominator))
                                 : _mm512_div_ps(numerator, denominator);
  return _mm512_mul_ps(_mm512_mul_ps(g, sigmoid), u);
}
#elif defined(LLMBENCH_AVX2)
// The same, 8 lanes, exact forms (std::exp a lane took 8% of a 2,048-token prefill step on an
// AVX2-only AMD EPYC).
inline __m256 silu_mul8(__m256 g, __m256 u) {
  const __m256 minus_abs = _mm256_or_ps(g, _mm256_set1_ps(-0.0f));
  const __m256 e = llmbench_simd::exp8_nonpositive(minus_abs);
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 negative = _mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_LT_OQ);
  const __m256 numerator = _mm256_blendv_ps(one, e, negative);
  const __m256 sigmoid = _mm256_div_ps(numerator, _mm256_add_ps(one, e));
  return _mm256_mul_ps(_mm256_mul_ps(g, sigmoid), u);
}
#endif

template <typename T>
void silu_and_mul_rows(const T* gate_up, int64_t row_stride, T* out, int64_t rows,
                       int64_t inter) {
  at::parallel_for(0, rows, std::max<int64_t>(1, 32768 / std::max<int64_t>(1, inter)),
                   [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* g = gate_up + r * row_stride;
      const T* u = g + inter;
      T* o = out + r * inter;
      int64_t j = 0;
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
      for (; j + 16 <= inter; j += 16)
        llmbench_simd::store16_masked(
            o + j, silu_mul16<!std::is_same_v<T, float>>(load16(g + j), load16(u + j)), 0xFFFF);
#elif defined(LLMBENCH_AVX2)
      alignas(32) float lanes[8];
      for (; j + 8 <= inter; j += 8) {
        const __m256 gv = llmbench_simd::load8(g + j), uv = llmbench_simd::load8(u + j);
        _mm256_store_ps(lanes, silu_mul8(gv, uv));
        for (int64_t k = 0; k < 8; ++k) o[j + k] = from_f<T>(lanes[k]);  // rounded as torch does
      }
#endif
      for (; j < inter; ++j) {
        const float gv = to_f(g[j]);
        o[j] = from_f<T>(gv / (1.0f + std::exp(-gv)) * to_f(u[j]));
      }
    }
  });
}

}  // namespace

at::Tensor llmbench_ops::silu_and_mul(const at::Tensor& gate_up, at::Tensor out) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.stride(1) == 1 && gate_up.size(1) % 2 == 0,
              "silu_and_mul: gate_up must be [T, 2I] with contiguous rows");
  const int64_t inter = gate_up.size(1) / 2;
  out = output("silu_and_mul", out, {gate_up.size(0), inter}, gate_up);
  dispatch_float(gate_up.scalar_type(), "silu_and_mul", [&](auto tag) {
    using scalar_t = decltype(tag);
    silu_and_mul_rows<scalar_t>(gate_up.data_ptr<scalar_t>(), gate_up.stride(0),
                                out.data_ptr<scalar_t>(), gate_up.size(0), inter);
  });
  return out;
}

// ---------------------------------------------------------------------------------------------
// Each row's fresh K and V ([rows, 2·nkv·d] at a row stride) into its slot of the layer's
// cache [S, 2, nkv, d]: one copy a row (index_copy_ does the same through a TensorIterator).
void llmbench_ops::write_kv_(at::Tensor kv, const at::Tensor& fresh,
                             const at::Tensor& slot_mapping) {
  TORCH_CHECK(kv.dim() == 4 && kv.is_contiguous() && fresh.dim() == 2 && fresh.stride(1) == 1 &&
                  fresh.size(1) == kv.size(1) * kv.size(2) * kv.size(3) &&
                  fresh.scalar_type() == kv.scalar_type(),
              "write_kv_: kv must be a contiguous [S, 2, nkv, d] cache and fresh [B, 2·nkv·d] in "
              "its dtype, rows contiguous");
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && slot_mapping.is_contiguous() &&
                  slot_mapping.numel() == fresh.size(0),
              "write_kv_: slot_mapping must be a contiguous int64 [B]");
  const int64_t row_bytes = fresh.size(1) * fresh.element_size();
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  const char* src = static_cast<const char*>(fresh.data_ptr());
  char* dst = static_cast<char*>(kv.data_ptr());
  for (int64_t r = 0; r < fresh.size(0); ++r) {
    TORCH_CHECK(slots[r] >= 0 && slots[r] < kv.size(0), "write_kv_: slot ", slots[r],
                " is outside the cache's ", kv.size(0), " slots");
    std::memcpy(dst + slots[r] * row_bytes, src + r * fresh.stride(0) * fresh.element_size(),
                row_bytes);
  }
}

namespace {

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return llmbench_ops::rms_norm(x, weight, eps, at::Tensor());
}

at::Tensor silu_and_mul(const at::Tensor& gate_up) {
  return llmbench_ops::silu_and_mul(gate_up, at::Tensor());
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(LLMBENCH_EXTENSION_NAMESPACE, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("rope_(Tensor(a!) x, Tensor positions, Tensor cos_sin, int head_dim) -> ()");
  m.def("silu_and_mul(Tensor gate_up) -> Tensor");
  m.def("write_kv_(Tensor(a!) kv, Tensor fresh, Tensor slot_mapping) -> ()");
}

TORCH_LIBRARY_IMPL(LLMBENCH_EXTENSION_NAMESPACE, CPU, m) {
  m.impl("rms_norm", &rms_norm);
  m.impl("rope_", &llmbench_ops::rope_);
  m.impl("silu_and_mul", &silu_and_mul);
  m.impl("write_kv_", &llmbench_ops::write_kv_);
}
