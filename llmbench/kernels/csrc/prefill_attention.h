// Causal prefill attention (prefill_attention.cpp's op) as its product paths see it: the AMX
// tiles there, and AVX-512 BF16 dot products for a CPU without tiles
// (prefill_attention_vectors.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#if defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define LLMBENCH_HAS_BF16_VECTORS 1
#endif

namespace llmbench_prefill_attention {

// The j-th of `blocks` blocks of query rows a head's tasks take: 0, n − 1, 1, n − 2, ..., so
// that the short and the long rows of the causal triangle alternate and any contiguous range
// of tasks (a thread's share) holds about as many products.
inline int64_t triangle_order(int64_t j, int64_t blocks) {
  return j % 2 == 0 ? j / 2 : blocks - 1 - j / 2;
}

#ifdef LLMBENCH_HAS_BF16_VECTORS
// The head sizes attend_with_vectors takes.
inline bool vectors_take(int64_t d) { return d == 32 || d == 64 || d == 128; }

// The op's problem (checked by the caller) with AVX-512 BF16 dot products.
at::Tensor attend_with_vectors(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               double scale, int64_t offset);
#endif

}  // namespace llmbench_prefill_attention
