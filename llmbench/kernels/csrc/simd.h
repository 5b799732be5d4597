// Element helpers shared by the CPU extension's sources: float32, bfloat16 and float16 read as
// float32 (one element, 16 lanes of AVX-512, or 8 of AVX2), rounded back once; e^x, dot
// products and axpy over rows; and a dispatch on dtype.
#pragma once

#include <cmath>
#include <cstdint>

#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

// AVX2 with F16C and FMA but not AVX-512 (an AMD EPYC of the Zen 3 kind): the helpers below take
// 8 lanes at a time where an AVX-512 build takes 16. Scalar loops there ran decode attention at
// 1.6 GB/s (7.4 ms a SmolLM2 step at 512 positions).
#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#define LLMBENCH_AVX2 1
#endif

namespace llmbench_simd {

// e^f = Σ f^i / i! to degree 7, highest first (Horner), for |f| <= ln 2 / 2: the e^x helpers'.
constexpr int kExpTaylorTerms = 8;
constexpr float kExpTaylor[kExpTaylorTerms] = {1.0f / 5040, 1.0f / 720, 1.0f / 120, 1.0f / 24,
                                               1.0f / 6,    0.5f,        1.0f,        1.0f};

inline float to_f(float v) { return v; }
inline float to_f(c10::BFloat16 v) { return static_cast<float>(v); }
inline float to_f(c10::Half v) { return static_cast<float>(v); }
template <typename T>
inline T from_f(float v) { return static_cast<T>(v); }

#if defined(__AVX512F__)
// 16 bfloat16 bit patterns as float32 lanes (exact: the bits shifted into the high half).
inline __m512 bf16_to_float(__m256i raw) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

// 16 consecutive elements as float32 lanes.
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const c10::BFloat16* p) {
  return bf16_to_float(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline __m512 load16(const c10::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
#endif

#if defined(LLMBENCH_AVX2)
// 8 consecutive elements as float32 lanes (bfloat16: the bits shifted into the high half).
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const c10::BFloat16* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}
inline __m256 load8(const c10::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Σ of the 8 lanes.
inline float sum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Σ lanes of each of v[0..7], as the 8 lanes of one vector (lane i: v[i]'s sum).
inline __m256 sum_lanes_8(const __m256 v[8]) {
  const __m256 h0 = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
  const __m256 h1 = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
  // h0's low half: v[0..3]'s sums over lanes 0-3, its high half over lanes 4-7 (h1: v[4..7])
  return _mm256_add_ps(_mm256_permute2f128_ps(h0, h1, 0x20), _mm256_permute2f128_ps(h0, h1, 0x31));
}

// max of the 8 lanes.
inline float max8(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// e^x for x <= 0 as exp_nonpositive below, 8 lanes; 2^n built in the exponent bits, so x is
// held at -87 (n >= -126, a normal float): e^-87 = 1.6e-38 where the exact value is smaller,
// nothing beside a softmax's largest term (1).
inline __m256 exp8_nonpositive(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 t = _mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f));
  const __m256 n = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_mul_ps(_mm256_sub_ps(t, n), _mm256_set1_ps(0.693147180559945309f));
  __m256 p = _mm256_set1_ps(kExpTaylor[0]);
  for (int i = 1; i < kExpTaylorTerms; ++i)
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kExpTaylor[i]));
  const __m256i two_n = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(two_n));
}
#endif

#if defined(__AVX512F__)
// Σ lanes of each of v[0..15], as the 16 lanes of one vector (lane i: v[i]'s sum). A tree of
// 128-bit and 32-bit shuffles, 3 ops a vector where one reduction alone costs about 8.
inline __m512 sum_lanes_16(const __m512 v[16]) {
  __m512 r[8], u[4], w[2];
  for (int k = 0; k < 8; ++k) {  // r[k]: quarters (v[2k] 0+2, 1+3, v[2k+1] 0+2, 1+3)
    const __m512 lo = _mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512 hi = _mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2));
    r[k] = _mm512_add_ps(lo, hi);
  }
  for (int k = 0; k < 4; ++k) {  // u[k]: quarter i holds 4 partial sums of v[4k + i]
    const __m512 lo = _mm512_shuffle_f32x4(r[2 * k], r[2 * k + 1], _MM_SHUFFLE(2, 0, 2, 0));
    const __m512 hi = _mm512_shuffle_f32x4(r[2 * k], r[2 * k + 1], _MM_SHUFFLE(3, 1, 3, 1));
    u[k] = _mm512_add_ps(lo, hi);
  }
  for (int k = 0; k < 2; ++k) {  // w[k]: quarter i: 2 partials of v[8k + i], 2 of v[8k + 4 + i]
    const __m512 lo = _mm512_shuffle_ps(u[2 * k], u[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512 hi = _mm512_shuffle_ps(u[2 * k], u[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2));
    w[k] = _mm512_add_ps(lo, hi);
  }
  const __m512 lo = _mm512_shuffle_ps(w[0], w[1], _MM_SHUFFLE(2, 0, 2, 0));
  const __m512 hi = _mm512_shuffle_ps(w[0], w[1], _MM_SHUFFLE(3, 1, 3, 1));
  // lane 4i + j now holds the sum of v[4j + i]: transpose the 4 x 4 lane order back
  const __m512i order = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
  return _mm512_permutexvar_ps(order, _mm512_add_ps(lo, hi));
}
#endif

#if defined(__AVX512F__)
// 16 × 16 dwords transposed in registers: r[i] row i in, r[c] column c out (64 shuffles).
inline void transpose_16x16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {  // t[i], t[i+1]: rows i, i+1 interleaved by dwords
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  // u[4G + m], 128-bit lane k: column 4k + m of rows 4G .. 4G + 3
  __m512i u[16];
  for (int G = 0; G < 4; ++G) {
    const __m512i* s = t + 4 * G;
    u[4 * G + 0] = _mm512_unpacklo_epi64(s[0], s[2]);
    u[4 * G + 1] = _mm512_unpackhi_epi64(s[0], s[2]);
    u[4 * G + 2] = _mm512_unpacklo_epi64(s[1], s[3]);
    u[4 * G + 3] = _mm512_unpackhi_epi64(s[1], s[3]);
  }
  // column 4k + m: lane k of u[m], u[4 + m], u[8 + m], u[12 + m]
  for (int m = 0; m < 4; ++m) {
    const __m512i a = _mm512_shuffle_i32x4(u[m], u[4 + m], _MM_SHUFFLE(2, 0, 2, 0));
    const __m512i b = _mm512_shuffle_i32x4(u[m], u[4 + m], _MM_SHUFFLE(3, 1, 3, 1));
    const __m512i c = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], _MM_SHUFFLE(2, 0, 2, 0));
    const __m512i e = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], _MM_SHUFFLE(3, 1, 3, 1));
    r[0 + m] = _mm512_shuffle_i32x4(a, c, _MM_SHUFFLE(2, 0, 2, 0));
    r[4 + m] = _mm512_shuffle_i32x4(b, e, _MM_SHUFFLE(2, 0, 2, 0));
    r[8 + m] = _mm512_shuffle_i32x4(a, c, _MM_SHUFFLE(3, 1, 3, 1));
    r[12 + m] = _mm512_shuffle_i32x4(b, e, _MM_SHUFFLE(3, 1, 3, 1));
  }
}
#endif

#if defined(__AVX512F__)
// Up to 16 rows of K 16-bit values (rows[i] for i < count, zeros for the others; K a multiple
// of 32) as TDPBF16PS's B operand: per 32 of K, a tile of 16 rows of 64 bytes whose row p holds
// pair p of every input row ([16 pairs][16 rows] dwords), out + 512·(k / 32). 16x16 transposes
// in registers: element by element this cost a quarter of a 32-stream down_proj.
inline void pack_pair_rows(const uint16_t* const* rows, int64_t count, int64_t K, uint16_t* out) {
  for (int64_t c = 0; c < K / 32; ++c) {
    __m512i r[16];
    for (int64_t i = 0; i < 16; ++i)
      r[i] = i < count ? _mm512_loadu_si512(rows[i] + 32 * c) : _mm512_setzero_si512();
    transpose_16x16(r);  // r[p]: pair p of every row
    for (int64_t p = 0; p < 16; ++p) _mm512_storeu_si512(out + 512 * c + 32 * p, r[p]);
  }
}
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
// 16-bit lanes 0..15 and 16..31 of v (two cvtne2ps halves) interleaved: lane 2i ← v[i],
// 2i + 1 ← v[16 + i], so dword i is the pair (v[i], v[16 + i]), the tiles' pair layout.
inline __m512i interleave_halves_epi16(__m512i v) {
  const __m512i order = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9,
                                         24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1,
                                         16, 0);
  return _mm512_permutexvar_epi16(order, v);
}

// The first lanes of `valid` of 16 consecutive elements as float32 (the others 0), and the
// store back, rounded as torch rounds one element (c10's conversions: to nearest, ties to
// even; a bfloat16 NaN is 0x7FC0), so a vector path and a scalar one give the same bits.
inline __m512 load16_masked(const float* p, __mmask16 valid) {
  return _mm512_maskz_loadu_ps(valid, p);
}
inline __m512 load16_masked(const c10::BFloat16* p, __mmask16 valid) {
  return bf16_to_float(_mm256_maskz_loadu_epi16(valid, p));
}
inline __m512 load16_masked(const c10::Half* p, __mmask16 valid) {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(valid, p));
}
inline void store16_masked(float* p, __m512 v, __mmask16 valid) {
  _mm512_mask_storeu_ps(p, valid, v);
}
inline void store16_masked(c10::BFloat16* p, __m512 v, __mmask16 valid) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i rounded = _mm512_srli_epi32(
      _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
  rounded = _mm512_mask_mov_epi32(rounded, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q),
                                  _mm512_set1_epi32(0x7FC0));
  _mm256_mask_storeu_epi16(p, valid, _mm512_cvtepi32_epi16(rounded));
}
inline void store16_masked(c10::Half* p, __m512 v, __mmask16 valid) {
  _mm256_mask_storeu_epi16(p, valid, _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}
#endif

#if defined(__AVX512F__)
// e^x for x <= 0 (softmax after subtracting the max): 2^(x·log2 e) = 2^n · 2^f, n an integer,
// |f| <= 1/2, 2^f by its Taylor series to degree 7 (relative error < 2e-8 there).
inline __m512 exp_nonpositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));  // below: e^x rounds to 0 anyway
  const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_mul_ps(_mm512_sub_ps(t, n), _mm512_set1_ps(0.693147180559945309f));
  __m512 p = _mm512_set1_ps(kExpTaylor[0]);
  for (int i = 1; i < kExpTaylorTerms; ++i)
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExpTaylor[i]));
  return _mm512_scalef_ps(p, n);
}
#endif

#if defined(__AVX512F__)
// 2^x to ~1e-4 relative, for values rounded to 16 bits afterwards (bfloat16's unit 2^-8,
// float16's 2^-11): 2^f on |f| <= 1/2 by a degree-3 polynomial fitted for relative error
// (< 7.5e-5), 7 instructions a vector where exp_nonpositive costs 13. x >= -150 (below, and
// -inf: 0); scalef takes the rest of the range.
inline __m512 exp2_coarse(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-150.0f));
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(x, n);
  __m512 p = _mm512_set1_ps(0.055171650f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.24261114f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.69326097f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.99992806f));
  return _mm512_scalef_ps(p, n);
}
#endif

// Σ a[i]·b[i] over n elements, a float32 (already converted), b in its own dtype.
template <typename T>
inline float dot(const float* a, const T* b, int64_t n) {
  int64_t i = 0;
  float s = 0.0f;
#if defined(__AVX512F__)
  __m512 acc = _mm512_setzero_ps();
  for (; i + 16 <= n; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), load16(b + i), acc);
  s = _mm512_reduce_add_ps(acc);
#elif defined(LLMBENCH_AVX2)
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load8(b + i), acc);
  s = sum8(acc);
#endif
  for (; i < n; ++i) s += a[i] * to_f(b[i]);
  return s;
}

// acc[i] += p · b[i] over n elements.
template <typename T>
inline void axpy(float* acc, float p, const T* b, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  const __m512 pv = _mm512_set1_ps(p);
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(acc + i, _mm512_fmadd_ps(pv, load16(b + i), _mm512_loadu_ps(acc + i)));
#elif defined(LLMBENCH_AVX2)
  const __m256 pv = _mm256_set1_ps(p);
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(pv, load8(b + i), _mm256_loadu_ps(acc + i)));
#endif
  for (; i < n; ++i) acc[i] += p * to_f(b[i]);
}

// dst[i] = src[i] as float32 over n elements.
template <typename T>
inline void to_float_row(const T* src, float* dst, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, load16(src + i));
#elif defined(LLMBENCH_AVX2)
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load8(src + i));
#endif
  for (; i < n; ++i) dst[i] = to_f(src[i]);
}

// p[i] = e^(s[i] − m) in place over n elements; returns Σ p[i].
inline float exp_shifted_sum(float* s, float m, int64_t n) {
  int64_t i = 0;
  float total = 0.0f;
#if defined(__AVX512F__)
  const __m512 mv = _mm512_set1_ps(m);
  __m512 sum = _mm512_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(s + i), mv));
    _mm512_storeu_ps(s + i, e);
    sum = _mm512_add_ps(sum, e);
  }
  total = _mm512_reduce_add_ps(sum);
#endif
  for (; i < n; ++i) {
    s[i] = std::exp(s[i] - m);
    total += s[i];
  }
  return total;
}

// Calls f(T{}) with T the C++ type of a float32, bfloat16 or float16 tensor.
template <typename F>
void dispatch_float(at::ScalarType dtype, const char* op, F&& f) {
  switch (dtype) {
    case at::kFloat: f(float{}); break;
    case at::kBFloat16: f(c10::BFloat16{}); break;
    case at::kHalf: f(c10::Half{}); break;
    default: TORCH_CHECK(false, op, ": float32, bfloat16 or float16 tensors only, got ", dtype);
  }
}

}  // namespace llmbench_simd
