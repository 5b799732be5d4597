// One dense decoder layer of a decode step in one call (decode_layer), or every layer of the
// model in one (decode_layers): the same ops, in the same order, as the model's Python forward
// (so the same numbers, bit for bit), without the Python between them.
//
//   h = rms_norm(x) · qkv = h @ Wqkv^T (+ b) · RoPE on q, k · K/V written to their slots ·
//   paged decode attention · x += attn @ Wo^T · h = rms_norm(x) · gu = h @ Wgu^T ·
//   x += silu_and_mul(gu) @ Wdown^T
//
// For a decode-shaped step (one query row at a time: decodes, and speculative verification's
// rows) over a K/V cache in the model's dtype, its matmuls as the engine's layers run them
// (`linear` below: the library's own up to their row limits, torch's matmul above). A small
// model's decode step has ~15 ops a layer at a few microseconds of Python and dispatch each:
// as much as its matmuls (with int4 weights, twice as much).
//
// The ops are this library's, called as C++ functions (ops.h), not through the dispatcher, each
// writing into a `Workspace` allocated once a call: through the dispatcher each allocated its
// output, 2.5-4 µs a time with the allocator's code and data cold (8 a layer). Each still makes
// the profiler event the dispatcher would (`ProfilerEvent`).
//
// Each matmul's weight is a list: [W] (float, [N, K]) or [codes, scales] in quant_gemv's
// layouts (int4: uint8 codes and float16 scale_zero; int8: int8 codes and float32 scale).
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>
#include <torch/library.h>

#include <chrono>
#include <string>
#include <vector>

#include "ops.h"

#ifndef LLMBENCH_EXTENSION_NAMESPACE
#define LLMBENCH_EXTENSION_NAMESPACE llmbench_cpu_ext
#endif
#define LLMBENCH_STR2(x) #x
#define LLMBENCH_STR(x) LLMBENCH_STR2(x)

namespace {

using llmbench_ops::OptTensor;

// A profiler event for an op called directly, as the dispatcher records one: the op's name in
// this library's namespace and its inputs (made only when the profiler asks for shapes).
// `llmbench profile` attributes a fused layer's time by these children (`profile.FUSED_LAYERS`);
// without a profiler, or under the op clock's DisableRecordFunctionGuard, it records nothing.
class ProfilerEvent {
 public:
  template <typename Inputs>
  ProfilerEvent(const char* name, Inputs inputs) : guard_(at::RecordScope::FUNCTION) {
    if (!guard_.isActive()) return;
    if (!guard_.needsInputs()) {
      guard_.before(name);
      return;
    }
    const std::vector<c10::IValue> values = inputs();
    guard_.before(name, c10::ArrayRef<const c10::IValue>(values.data(), values.size()));
  }

 private:
  at::RecordFunction guard_;
};

#define LLMBENCH_OP(name) LLMBENCH_STR(LLMBENCH_EXTENSION_NAMESPACE) "::" name

// This library's ops, found once through the dispatcher.
c10::OperatorHandle op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(
      (std::string(LLMBENCH_STR(LLMBENCH_EXTENSION_NAMESPACE)) + "::" + name).c_str(), "");
}

// The weight-only `quant_gemm` (rows above quant_gemv's), through the dispatcher: it allocates
// its own output, a cost shared by its many rows.
at::Tensor quant_gemm(const at::Tensor& x, const at::Tensor& codes, const OptTensor& scale_zero,
                      const OptTensor& scale, int64_t out_features, const OptTensor& bias,
                      const OptTensor& residual) {
  using Signature = at::Tensor(const at::Tensor&, const at::Tensor&, const OptTensor&,
                               const OptTensor&, int64_t, const OptTensor&, const OptTensor&);
  static auto gemm = op("quant_gemm").typed<Signature>();
  return gemm.call(x, codes, scale_zero, scale, out_features, bias, residual);
}

// x @ W^T (+ bias) (+ residual) → [M, out_features] for a weight list (above), as the engine's
// layers compute it outside this call: up to `fast_max_rows` rows through the library's
// `gemv` (float W) or `quant_gemv` (codes), into `y`; above, torch's matmul (oneDNN: on a CPU
// with AMX, its tiles), exactly as `engine.linear.Linear` calls it, or the library's
// weight-only `quant_gemm` on the codes, exactly as `quant.linear.VnniLinear` does, into a
// tensor of their own.
at::Tensor linear(const at::Tensor& x, at::TensorList w, int64_t out_features,
                  const OptTensor& bias, const OptTensor& residual, int64_t fast_max_rows,
                  const at::Tensor& y) {
  TORCH_CHECK(w.size() == 1 || w.size() == 2,
              "decode_layer: a weight is [W] or [codes, scales], got ", w.size(), " tensors");
  const bool is_fast = x.size(0) <= fast_max_rows;
  if (w.size() == 1) {
    if (is_fast) {
      ProfilerEvent event(LLMBENCH_OP("gemv"), [&] {
        return std::vector<c10::IValue>{x, w[0], bias, residual};
      });
      return llmbench_ops::gemv(x, w[0], bias, residual, y);
    }
    at::Tensor add;
    if (residual && bias) add = *residual + *bias;
    else if (residual) add = *residual;
    else if (bias) add = *bias;
    return add.defined() ? at::addmm(add, x, w[0].t()) : at::mm(x, w[0].t());
  }
  const bool is_int4 = w[0].scalar_type() == at::kByte;
  const OptTensor scale_zero = is_int4 ? OptTensor(w[1]) : c10::nullopt;
  const OptTensor scale = is_int4 ? c10::nullopt : OptTensor(w[1]);
  if (!is_fast) return quant_gemm(x, w[0], scale_zero, scale, out_features, bias, residual);
  ProfilerEvent event(LLMBENCH_OP("quant_gemv"), [&] {
    return std::vector<c10::IValue>{x, w[0], scale_zero, scale, out_features, bias, residual};
  });
  return llmbench_ops::quant_gemv(x, w[0], scale_zero, scale, out_features, bias, residual, y);
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps, const at::Tensor& y) {
  ProfilerEvent event(LLMBENCH_OP("rms_norm"), [&] {
    return std::vector<c10::IValue>{x, w, eps};
  });
  return llmbench_ops::rms_norm(x, w, eps, y);
}

void rope(const at::Tensor& x, const at::Tensor& positions, const at::Tensor& cos_sin,
          int64_t d) {
  ProfilerEvent event(LLMBENCH_OP("rope_"), [&] {
    return std::vector<c10::IValue>{x, positions, cos_sin, d};
  });
  llmbench_ops::rope_(x, positions, cos_sin, d);
}

at::Tensor silu_and_mul(const at::Tensor& gate_up, const at::Tensor& out) {
  ProfilerEvent event(LLMBENCH_OP("silu_and_mul"), [&] {
    return std::vector<c10::IValue>{gate_up};
  });
  return llmbench_ops::silu_and_mul(gate_up, out);
}

void write_kv(const at::Tensor& kv, const at::Tensor& fresh, const at::Tensor& slot_mapping) {
  ProfilerEvent event(LLMBENCH_OP("write_kv_"), [&] {
    return std::vector<c10::IValue>{kv, fresh, slot_mapping};
  });
  llmbench_ops::write_kv_(kv, fresh, slot_mapping);
}

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const at::Tensor& tables, const at::Tensor& lens, int64_t block_size,
                     double scale, int64_t max_len, const at::Tensor& out) {
  ProfilerEvent event(LLMBENCH_OP("paged_decode_attention"), [&] {
    return std::vector<c10::IValue>{q, k, v, tables, lens, block_size, scale, max_len};
  });
  return llmbench_ops::paged_decode_attention(q, k, v, tables, lens, block_size, scale, max_len,
                                              out);
}

// The outputs of a layer's ops, allocated once a call of decode_layer(s) and written by every
// layer: the norms' (h), qkv, attention's [B, nh, d], gate_up and act, and two residual
// streams, each layer's o_proj writing the one its input is not in and down_proj the other.
struct Workspace {
  at::Tensor h, qkv, attn, gate_up, act, streams[2];

  Workspace(const at::Tensor& x, int64_t qkv_size, int64_t num_heads, int64_t head_dim,
            int64_t inter) {
    at::DisableRecordFunctionGuard no_events;  // not an op of the layer's: no profile rows
    const int64_t rows = x.size(0), hidden = x.size(1);
    const at::TensorOptions options = x.options();
    h = at::empty({rows, hidden}, options);
    qkv = at::empty({rows, qkv_size}, options);
    attn = at::empty({rows, num_heads, head_dim}, options);
    gate_up = at::empty({rows, 2 * inter}, options);
    act = at::empty({rows, inter}, options);
    streams[0] = at::empty({rows, hidden}, options);
    streams[1] = at::empty({rows, hidden}, options);
  }

  // A residual stream that does not hold `x` (written while x is read).
  const at::Tensor& stream_apart_from(const at::Tensor& x) const {
    return x.is_same(streams[0]) ? streams[1] : streams[0];
  }
};

// A view of `base` `offset` elements into it, with these sizes and strides, as a TensorImpl
// made here: in a decode step ATen's view ops (narrow, select, view) took ~23 µs for a layer's
// five, though ~1 µs each in a loop: the matmul before them streamed its weights through the
// caches, and each call's first use in a layer fetched ATen's code and data from memory again
// (`llmbench profile`'s op clock, one view at a time). Only under inference mode (the engine's
// forward), for views that never leave the layer: qkv's and attention's output's (inference
// tensors: no autograd or version-counter bookkeeping to keep) and the cache's (made outside inference mode, but its
// views are only read: the layer writes the cache through `kv` itself); else ATen's.
at::Tensor view_of(const at::Tensor& base, int64_t offset, c10::IntArrayRef sizes,
                   c10::IntArrayRef strides) {
  if (!c10::InferenceMode::is_enabled()) {
    at::DisableRecordFunctionGuard no_events;  // `llmbench profile` would count its cost
    return base.as_strided(sizes, strides, base.storage_offset() + offset);
  }
  auto impl = c10::make_intrusive<c10::TensorImpl>(
      c10::TensorImpl::VIEW, c10::Storage(base.storage()), base.key_set(), base.dtype());
  impl->set_sizes_and_strides(sizes, strides, base.storage_offset() + offset);
  return at::Tensor(std::move(impl));
}

// One layer (decode_layer's body), its op times on its own clock where `op_ns` is given
// (`llmbench profile`, through `decode_layers`): each op's row gets the time since the op before
// it ended (its call, and the views made for it), so a layer's rows add up to the layer; with
// none, no clock is read. The rows, in the order the layer runs them (roofline/profile.py's
// FUSED_LAYER_OPS names them):
//   0 input rms_norm · 1 qkv_proj · 2 rope · 3 kv_write · 4 attention · 5 o_proj ·
//   6 post-attention rms_norm · 7 gate_up_proj · 8 silu_mul · 9 down_proj
constexpr int64_t kLayerOps = 10;

class OpClock {
 public:
  explicit OpClock(int64_t* ns) : ns_(ns) {
    if (ns_) last_ = std::chrono::steady_clock::now();
  }
  void lap(int64_t op) {
    if (!ns_) return;
    const auto now = std::chrono::steady_clock::now();
    ns_[op] += std::chrono::duration_cast<std::chrono::nanoseconds>(now - last_).count();
    last_ = now;
  }

 private:
  int64_t* ns_;
  std::chrono::steady_clock::time_point last_;
};

at::Tensor layer(const at::Tensor& x, const at::Tensor& input_norm,
                 at::TensorList qkv_weight, const OptTensor& qkv_bias,
                 at::TensorList o_weight, const at::Tensor& post_norm,
                 at::TensorList gate_up_weight, at::TensorList down_weight,
                 int64_t intermediate_size, double eps, const at::Tensor& positions,
                 const at::Tensor& cos_sin, at::Tensor kv, const at::Tensor& slot_mapping,
                 const at::Tensor& block_tables, const at::Tensor& context_lens,
                 int64_t block_size, double scale, int64_t max_context_len,
                 int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                 int64_t fast_max_rows, const Workspace& ws, int64_t* op_ns) {
  OpClock clock(op_ns);
  const int64_t rows = x.size(0), hidden = x.size(1), q_size = num_heads * head_dim;
  const int64_t qk_size = q_size + num_kv_heads * head_dim;
  const int64_t qkv_size = qk_size + num_kv_heads * head_dim;
  TORCH_CHECK(kv.dim() == 4 && kv.size(1) == 2 && kv.size(2) == num_kv_heads &&
                  kv.size(3) == head_dim && kv.scalar_type() == x.scalar_type() &&
                  kv.is_contiguous(),
              "decode_layer: kv must be the layer's contiguous [S, 2, nkv, d] cache in x's dtype");
  at::Tensor h = rms_norm(x, input_norm, eps, ws.h);
  clock.lap(0);
  const int64_t most = fast_max_rows;
  at::Tensor qkv = linear(h, qkv_weight, qkv_size, qkv_bias, c10::nullopt, most, ws.qkv);
  clock.lap(1);
  // Views of qkv ([B, qkv], rows contiguous) and of the cache ([S, 2, nkv, d]), made by
  // `view_of`, not ATen's view ops.
  TORCH_CHECK(qkv.stride(1) == 1, "decode_layer: the qkv matmul's rows must be contiguous");
  const int64_t row = qkv.stride(0), kv_row = 2 * num_kv_heads * head_dim;
  const at::Tensor qk = view_of(qkv, 0, {rows, qk_size}, {row, 1});
  const at::Tensor q = view_of(qkv, 0, {rows, num_heads, head_dim}, {row, head_dim, 1});
  const at::Tensor fresh_kv = view_of(qkv, q_size, {rows, qkv_size - q_size}, {row, 1});
  const int64_t slots = kv.size(0);
  const at::Tensor k_cache =
      view_of(kv, 0, {slots, num_kv_heads, head_dim}, {kv_row, head_dim, 1});
  const at::Tensor v_cache =
      view_of(kv, kv_row / 2, {slots, num_kv_heads, head_dim}, {kv_row, head_dim, 1});
  rope(qk, positions, cos_sin, head_dim);
  clock.lap(2);
  write_kv(kv, fresh_kv, slot_mapping);
  clock.lap(3);
  const at::Tensor heads = attention(q, k_cache, v_cache, block_tables, context_lens,
                                     block_size, scale, max_context_len, ws.attn);  // [B, nh, d]
  clock.lap(4);
  const at::Tensor attn = view_of(heads, 0, {rows, q_size}, {q_size, 1});
  at::Tensor out = linear(attn, o_weight, hidden, c10::nullopt, x, most, ws.stream_apart_from(x));
  clock.lap(5);
  h = rms_norm(out, post_norm, eps, ws.h);
  clock.lap(6);
  const int64_t inter = intermediate_size;
  const at::Tensor gate_up =
      linear(h, gate_up_weight, 2 * inter, c10::nullopt, c10::nullopt, most, ws.gate_up);
  clock.lap(7);
  const at::Tensor act = silu_and_mul(gate_up, ws.act);
  clock.lap(8);
  at::Tensor y = linear(act, down_weight, hidden, c10::nullopt, out, most,
                        ws.stream_apart_from(out));
  clock.lap(9);
  return y;
}

at::Tensor decode_layer(const at::Tensor& x, const at::Tensor& input_norm,
                        at::TensorList qkv_weight, const OptTensor& qkv_bias,
                        at::TensorList o_weight, const at::Tensor& post_norm,
                        at::TensorList gate_up_weight, at::TensorList down_weight,
                        int64_t intermediate_size, double eps, const at::Tensor& positions,
                        const at::Tensor& cos_sin, at::Tensor kv, const at::Tensor& slot_mapping,
                        const at::Tensor& block_tables, const at::Tensor& context_lens,
                        int64_t block_size, double scale, int64_t max_context_len,
                        int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                        int64_t fast_max_rows) {
  const Workspace ws(x, (num_heads + 2 * num_kv_heads) * head_dim, num_heads, head_dim,
                     intermediate_size);
  return layer(x, input_norm, qkv_weight, qkv_bias, o_weight, post_norm, gate_up_weight,
               down_weight, intermediate_size, eps, positions, cos_sin, kv, slot_mapping,
               block_tables, context_lens, block_size, scale, max_context_len, num_heads,
               num_kv_heads, head_dim, fast_max_rows, ws, nullptr);
}

// Every layer of a dense model in one call: `layer` for each in turn (a C++ call, not through
// the dispatcher: the profiler sees each layer's ops directly inside this op). Layer i's
// matmul weights are entries i·n .. i·n + n − 1 of each weight list (n = 1: [W]; 2: [codes,
// scales]), kv[i] its cache. One call a step from Python instead of one a layer: each call
// parses ~20 arguments, 10-20 µs, 30 times a step for SmolLM2.
//
// With `op_ns` (int64 [layers, kLayerOps], `llmbench profile`), each layer's op times are added
// into its row (OpClock) and the profiler records no event inside the call: an event costs
// ~7 µs, ~300 a step, as much as a fifth of a small model's step.
at::Tensor decode_layers(const at::Tensor& x, at::TensorList input_norms,
                         at::TensorList qkv_weights, const c10::List<OptTensor>& qkv_biases,
                         at::TensorList o_weights, at::TensorList post_norms,
                         at::TensorList gate_up_weights, at::TensorList down_weights,
                         int64_t intermediate_size, double eps, const at::Tensor& positions,
                         const at::Tensor& cos_sin, at::TensorList kv,
                         const at::Tensor& slot_mapping, const at::Tensor& block_tables,
                         const at::Tensor& context_lens, int64_t block_size, double scale,
                         int64_t max_context_len, int64_t num_heads, int64_t num_kv_heads,
                         int64_t head_dim, int64_t fast_max_rows, const OptTensor& op_ns) {
  const int64_t layers = static_cast<int64_t>(input_norms.size());
  const int64_t n = layers ? static_cast<int64_t>(qkv_weights.size()) / layers : 0;
  TORCH_CHECK(layers > 0 && (n == 1 || n == 2) && static_cast<int64_t>(post_norms.size()) == layers &&
                  static_cast<int64_t>(kv.size()) == layers &&
                  static_cast<int64_t>(qkv_biases.size()) == layers,
              "decode_layers: give one norm, bias and cache a layer and 1 or 2 weights a matmul");
  for (const at::TensorList w : {qkv_weights, o_weights, gate_up_weights, down_weights})
    TORCH_CHECK(static_cast<int64_t>(w.size()) == n * layers,
                "decode_layers: every weight list needs ", n * layers, " tensors, got ", w.size());
  int64_t* ns = nullptr;
  c10::optional<at::DisableRecordFunctionGuard> no_events;
  if (op_ns) {
    TORCH_CHECK(op_ns->scalar_type() == at::kLong && op_ns->is_contiguous() &&
                    op_ns->dim() == 2 && op_ns->size(0) == layers &&
                    op_ns->size(1) == kLayerOps,
                "decode_layers: op_ns must be a contiguous int64 [layers, ", kLayerOps, "]");
    ns = op_ns->data_ptr<int64_t>();
    no_events.emplace();
  }
  const Workspace ws(x, (num_heads + 2 * num_kv_heads) * head_dim, num_heads, head_dim,
                     intermediate_size);
  at::Tensor h = x;
  for (int64_t i = 0; i < layers; ++i)
    h = layer(h, input_norms[i], qkv_weights.slice(i * n, n), qkv_biases.get(i),
              o_weights.slice(i * n, n), post_norms[i], gate_up_weights.slice(i * n, n),
              down_weights.slice(i * n, n), intermediate_size, eps, positions, cos_sin, kv[i],
              slot_mapping, block_tables, context_lens, block_size, scale, max_context_len,
              num_heads, num_kv_heads, head_dim, fast_max_rows, ws,
              ns ? ns + i * kLayerOps : nullptr);
  return h;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(LLMBENCH_EXTENSION_NAMESPACE, m) {
  m.def(
      "decode_layer(Tensor x, Tensor input_norm, Tensor[] qkv_weight, Tensor? qkv_bias, "
      "Tensor[] o_weight, Tensor post_norm, Tensor[] gate_up_weight, Tensor[] down_weight, "
      "int intermediate_size, float eps, Tensor positions, Tensor cos_sin, Tensor(a!) kv, "
      "Tensor slot_mapping, "
      "Tensor block_tables, Tensor context_lens, int block_size, float scale, "
      "int max_context_len, int num_heads, int num_kv_heads, int head_dim, int fast_max_rows) "
      "-> Tensor");
  m.def(
      "decode_layers(Tensor x, Tensor[] input_norms, Tensor[] qkv_weights, Tensor?[] qkv_biases, "
      "Tensor[] o_weights, Tensor[] post_norms, Tensor[] gate_up_weights, "
      "Tensor[] down_weights, int intermediate_size, float eps, Tensor positions, "
      "Tensor cos_sin, Tensor(a!)[] kv, Tensor slot_mapping, Tensor block_tables, "
      "Tensor context_lens, int block_size, float scale, int max_context_len, int num_heads, "
      "int num_kv_heads, int head_dim, int fast_max_rows, Tensor(b!)? op_ns=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(LLMBENCH_EXTENSION_NAMESPACE, CPU, m) {
  m.impl("decode_layer", &decode_layer);
  m.impl("decode_layers", &decode_layers);
}
