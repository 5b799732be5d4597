// The library's decode ops as C++ functions, for the fused decode layer (decode_layer.cpp),
// which calls them without the dispatcher and gives each its output tensor: a decode step of a
// small model runs ~10 ops a layer, and each allocation of an output cost 2.5-4 µs there (the
// allocator's code and data run cold once a layer's weights have streamed through the caches;
// `llmbench profile`'s op clock, SmolLM2 bfloat16) — as much as the op's own work.
//
// Each takes the op's arguments (the op registered under the same name checks and calls it)
// and an output: undefined → allocated as the op does, else checked (`check_out`) and written.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <c10/util/Optional.h>

#include <cstdint>

namespace llmbench_ops {

using OptTensor = c10::optional<at::Tensor>;

// `out` (defined) must be a contiguous [rows, cols] tensor in like's dtype.
inline void check_out(const char* op, const at::Tensor& out, int64_t rows, int64_t cols,
                      const at::Tensor& like) {
  TORCH_CHECK(out.dim() == 2 && out.size(0) == rows && out.size(1) == cols &&
                  out.is_contiguous() && out.scalar_type() == like.scalar_type(),
              op, ": out must be a contiguous [", rows, ", ", cols, "] tensor in ",
              like.scalar_type());
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

// decode_attention.cpp: out [B, nh·d] (the [B, nh, d] result's rows).
at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& key_cache,
                                  const at::Tensor& value_cache, const at::Tensor& block_tables,
                                  const at::Tensor& context_lens, int64_t block_size,
                                  double scale, int64_t max_context_len, at::Tensor out);

}  // namespace llmbench_ops
