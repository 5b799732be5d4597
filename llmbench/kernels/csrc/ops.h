// The library's decode ops as C++ functions, for the fused decode layer (decode_layer.cpp),
// which calls them without the dispatcher and gives each its output tensor: a decode step of a
// small model runs ~10 ops a layer, and each allocation of an output cost 2.5-4 µs there (the
// allocator's code and data run cold once a layer's weights have streamed through the caches;
// `llmbench profile`'s op clock, SmolLM2 bfloat16) — as much as the op's own work.
//
// Each takes the op's arguments (the op registered under the same name checks and calls it)
// and an output (`output`): undefined → allocated as the op does, else checked and written.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <c10/util/Optional.h>

#include <cstdint>

namespace llmbench_ops {

using OptTensor = c10::optional<at::Tensor>;

// An op's output of `sizes` in like's dtype: `out` where given (it must be exactly that, and
// contiguous), else a new tensor.
inline at::Tensor output(const char* op, const at::Tensor& out, at::IntArrayRef sizes,
                         const at::Tensor& like) {
  if (!out.defined()) return at::empty(sizes, like.options());
  TORCH_CHECK(out.sizes() == sizes && out.is_contiguous() &&
                  out.scalar_type() == like.scalar_type(),
              op, ": out must be a contiguous ", sizes, " tensor in ", like.scalar_type());
  return out;
}

// gemv.cpp: y = x @ W^T (+ bias) (+ residual) for a float W [N, K].
at::Tensor gemv(const at::Tensor& x, const at::Tensor& weight, const OptTensor& bias,
                const OptTensor& residual, at::Tensor y);

// gemv_quant.cpp: the same for int8 / int4 codes in quant_gemv's layouts.
at::Tensor quant_gemv(const at::Tensor& x, const at::Tensor& codes, const OptTensor& scale_zero,
                      const OptTensor& scale, int64_t out_features, const OptTensor& bias,
                      const OptTensor& residual, at::Tensor y);

// layer_ops.cpp.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, at::Tensor y);
void rope_(at::Tensor x, const at::Tensor& positions, const at::Tensor& cos_sin,
           int64_t head_dim);
at::Tensor silu_and_mul(const at::Tensor& gate_up, at::Tensor out);
void write_kv_(at::Tensor kv, const at::Tensor& fresh, const at::Tensor& slot_mapping);

// decode_attention.cpp: out [B, nh, d].
at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& key_cache,
                                  const at::Tensor& value_cache, const at::Tensor& block_tables,
                                  const at::Tensor& context_lens, int64_t block_size,
                                  double scale, int64_t max_context_len, at::Tensor out);

}  // namespace llmbench_ops
