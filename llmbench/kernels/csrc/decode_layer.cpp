// One dense decoder layer of a decode step in one call: the same ops, in the same order, as the
// model's Python forward (so the same numbers, bit for bit), without the Python between them.
//
//   h = rms_norm(x) · qkv = h @ Wqkv^T (+ b) · RoPE on q, k · K/V written to their slots ·
//   paged decode attention · x += attn @ Wo^T · h = rms_norm(x) · gu = h @ Wgu^T ·
//   x += (silu(g) · u) @ Wdown^T
//
// For a step of one-token sequences whose layer runs the library's own matmul (`gemv`, up to
// its row limit) over a K/V cache in the model's dtype. A small model's decode step has ~15
// ops a layer at a few microseconds of Python and dispatch each: as much as its matmuls.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#ifndef LLMBENCH_EXTENSION_NAMESPACE
#define LLMBENCH_EXTENSION_NAMESPACE llmbench_cpu_ext
#endif
#define LLMBENCH_STR2(x) #x
#define LLMBENCH_STR(x) LLMBENCH_STR2(x)

namespace {

using OptTensor = c10::optional<at::Tensor>;

// This library's own ops, found once through the dispatcher.
c10::OperatorHandle op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(
      (std::string(LLMBENCH_STR(LLMBENCH_EXTENSION_NAMESPACE)) + "::" + name).c_str(), "");
}

at::Tensor gemv(const at::Tensor& x, const at::Tensor& w, const OptTensor& bias,
                const OptTensor& residual) {
  static auto f = op("gemv").typed<at::Tensor(const at::Tensor&, const at::Tensor&,
                                               const OptTensor&, const OptTensor&)>();
  return f.call(x, w, bias, residual);
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  static auto f = op("rms_norm").typed<at::Tensor(const at::Tensor&, const at::Tensor&, double)>();
  return f.call(x, w, eps);
}

void rope(at::Tensor x, const at::Tensor& positions, const at::Tensor& cos_sin, int64_t d) {
  static auto f = op("rope_").typed<void(at::Tensor, const at::Tensor&, const at::Tensor&,
                                         int64_t)>();
  f.call(x, positions, cos_sin, d);
}

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const at::Tensor& tables, const at::Tensor& lens, int64_t block_size,
                     double scale, int64_t max_len) {
  static auto f = op("paged_decode_attention")
                      .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                        const at::Tensor&, const at::Tensor&, int64_t, double,
                                        int64_t)>();
  return f.call(q, k, v, tables, lens, block_size, scale, max_len);
}

at::Tensor decode_layer(const at::Tensor& x, const at::Tensor& input_norm,
                        const at::Tensor& qkv_weight, const OptTensor& qkv_bias,
                        const at::Tensor& o_weight, const at::Tensor& post_norm,
                        const at::Tensor& gate_up_weight, const at::Tensor& down_weight,
                        double eps, const at::Tensor& positions, const at::Tensor& cos_sin,
                        at::Tensor kv, const at::Tensor& slot_mapping,
                        const at::Tensor& block_tables, const at::Tensor& context_lens,
                        int64_t block_size, double scale, int64_t max_context_len,
                        int64_t num_heads, int64_t num_kv_heads, int64_t head_dim) {
  const int64_t rows = x.size(0), q_size = num_heads * head_dim;
  const int64_t qk_size = q_size + num_kv_heads * head_dim;
  TORCH_CHECK(kv.dim() == 4 && kv.size(1) == 2 && kv.size(2) == num_kv_heads &&
                  kv.size(3) == head_dim && kv.scalar_type() == x.scalar_type(),
              "decode_layer: kv must be the layer's [S, 2, nkv, d] cache in x's dtype");
  at::Tensor h = rms_norm(x, input_norm, eps);
  at::Tensor qkv = gemv(h, qkv_weight, qkv_bias, c10::nullopt);  // [B, (nh + 2 nkv) d]
  rope(qkv.narrow(1, 0, qk_size), positions, cos_sin, head_dim);
  at::Tensor q = qkv.narrow(1, 0, q_size).view({rows, num_heads, head_dim});
  at::Tensor fresh = qkv.narrow(1, q_size, qkv.size(1) - q_size).view({rows, 2, num_kv_heads,
                                                                       head_dim});
  kv.index_copy_(0, slot_mapping, fresh);
  at::Tensor attn = attention(q, kv.select(1, 0), kv.select(1, 1), block_tables, context_lens,
                              block_size, scale, max_context_len);
  at::Tensor out = gemv(attn.view({rows, q_size}), o_weight, c10::nullopt, x);
  h = rms_norm(out, post_norm, eps);
  at::Tensor gate_up = gemv(h, gate_up_weight, c10::nullopt, c10::nullopt);  // [B, 2 I]
  const int64_t inter = gate_up.size(1) / 2;
  at::Tensor act = at::silu(gate_up.narrow(1, 0, inter)) * gate_up.narrow(1, inter, inter);
  return gemv(act, down_weight, c10::nullopt, out);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(LLMBENCH_EXTENSION_NAMESPACE, m) {
  m.def(
      "decode_layer(Tensor x, Tensor input_norm, Tensor qkv_weight, Tensor? qkv_bias, "
      "Tensor o_weight, Tensor post_norm, Tensor gate_up_weight, Tensor down_weight, "
      "float eps, Tensor positions, Tensor cos_sin, Tensor(a!) kv, Tensor slot_mapping, "
      "Tensor block_tables, Tensor context_lens, int block_size, float scale, "
      "int max_context_len, int num_heads, int num_kv_heads, int head_dim) -> Tensor");
}

TORCH_LIBRARY_IMPL(LLMBENCH_EXTENSION_NAMESPACE, CPU, m) { m.impl("decode_layer", &decode_layer); }
