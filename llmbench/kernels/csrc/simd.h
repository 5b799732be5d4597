// Element helpers shared by the CPU extension's sources: float32, bfloat16 and float16 read as
// float32 (one element, or 16 lanes of AVX-512), rounded back once, and a dispatch on dtype.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace llmbench_simd {

inline float to_f(float v) { return v; }
inline float to_f(c10::BFloat16 v) { return static_cast<float>(v); }
inline float to_f(c10::Half v) { return static_cast<float>(v); }
template <typename T>
inline T from_f(float v) { return static_cast<T>(v); }

#if defined(__AVX512F__)
// 16 consecutive elements as float32 lanes.
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const c10::BFloat16* p) {
  __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}
inline __m512 load16(const c10::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
#endif

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
