// The per-layer ops of a CPU decode step besides the matmuls, one call each where torch runs
// several: RMSNorm, RoPE in place, and paged decode attention over block tables (GQA,
// split-K). float32, bfloat16 and float16 tensors; every sum in float32, outputs rounded once
// to the input's dtype (as torch's own ops round them).
//
// In a decode step of a small model each of these is a few microseconds of arithmetic; through
// torch each was 6-12 dispatched ops (measured here: RMSNorm 28 us a call, attention 65 us a
// layer at 256 tokens of context), as long as the layer's matmuls.
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

#include "simd.h"

#ifndef LLMBENCH_EXTENSION_NAMESPACE
#define LLMBENCH_EXTENSION_NAMESPACE llmbench_cpu_ext
#endif

namespace {

using llmbench_simd::dispatch_float;
using llmbench_simd::from_f;
using llmbench_simd::to_f;
#if defined(__AVX512F__)
using llmbench_simd::load16;
#endif

#if defined(__AVX512F__)
// e^x for x <= 0 (softmax after subtracting the max): 2^(x·log2 e) = 2^n · 2^f, n an integer,
// |f| <= 1/2, 2^f by its Taylor series to degree 7 (relative error < 2e-8 there).
inline __m512 exp_nonpositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));  // below: e^x rounds to 0 anyway
  const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_mul_ps(_mm512_sub_ps(t, n), _mm512_set1_ps(0.693147180559945309f));
  __m512 p = _mm512_set1_ps(1.0f / 5040);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 720));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
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
#endif
  for (; i < n; ++i) acc[i] += p * to_f(b[i]);
}

// dst[i] = src[i] as float32 over n elements.
template <typename T>
inline void to_float_row(const T* src, float* dst, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, load16(src + i));
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

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, "rms_norm: x must be [T, h] with contiguous rows");
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(1) && weight.is_contiguous() &&
                  weight.scalar_type() == x.scalar_type(),
              "rms_norm: weight must be a contiguous [h] vector in x's dtype");
  at::Tensor y = at::empty({x.size(0), x.size(1)}, x.options());
  dispatch_float(x.scalar_type(), "rms_norm", [&](auto tag) {
    using scalar_t = decltype(tag);
    rms_norm_rows<scalar_t>(x.data_ptr<scalar_t>(), x.stride(0), weight.data_ptr<scalar_t>(),
                            y.data_ptr<scalar_t>(), x.size(0), x.size(1),
                            static_cast<float>(eps));
  });
  return y;
}

// ---------------------------------------------------------------------------------------------
// RoPE in place on x [T, heads·d] whose columns hold interleaved pairs (x[2i], x[2i+1]):
// (a, b) → (a·c − b·s, a·s + b·c) with c, s = cos_sin[positions[t], i mod d/2], in float32,
// rounded once.

template <typename T>
void rope_rows(T* x, int64_t x_row, int64_t rows, int64_t width, const int64_t* positions,
               const float* cos_sin, int64_t half_dim) {
  at::parallel_for(0, rows, 8, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      T* xr = x + r * x_row;
      const float* cs = cos_sin + positions[r] * half_dim * 2;
      for (int64_t j = 0; j < width / 2; ++j) {
        const int64_t i = j % half_dim;
        const float a = to_f(xr[2 * j]), b = to_f(xr[2 * j + 1]);
        const float c = cs[2 * i], s = cs[2 * i + 1];
        xr[2 * j] = from_f<T>(a * c - b * s);
        xr[2 * j + 1] = from_f<T>(a * s + b * c);
      }
    }
  });
}

void rope_(at::Tensor x, const at::Tensor& positions, const at::Tensor& cos_sin,
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

// ---------------------------------------------------------------------------------------------
// Paged decode attention: q [B, nh, d] (one new token per sequence) over key_cache,
// value_cache [S, nkv, d] (slot stride free: the halves of one [S, 2, nkv, d] pool), sequence
// b's position p in slot block_tables[b, p / block_size]·block_size + p % block_size, positions
// 0 .. context_lens[b] − 1.
//
// Work items are (sequence, KV head, partition of the context): each scores its g = nh / nkv
// query heads against its keys (one read of each key for all g), then accumulates e^(s − m)·v.
// Partitions (split-K) give both threads work when there are fewer sequences·heads than
// threads; they are merged by M = max m_p, out = Σ e^(m_p − M)·acc_p / Σ e^(m_p − M)·l_p.

constexpr int64_t kMinPartition = 128;  // positions: below this a partition is not worth it

struct AttentionProblem {
  int64_t batch, num_heads, num_kv_heads, head_dim, block_size, max_blocks;
  int64_t q_row, q_head, k_slot, v_slot;  // strides in elements
  const int32_t* block_tables;
  const int32_t* context_lens;
  float scale;
};

// Calls fn(p, slot) for positions p0 .. p1 − 1 of a sequence, block by block (one table
// lookup per block, no division per position).
template <typename F>
inline void for_each_slot(const int32_t* table, int64_t block_size, int64_t p0, int64_t p1,
                          F&& fn) {
  for (int64_t p = p0; p < p1;) {
    const int64_t block = p / block_size;
    const int64_t base = static_cast<int64_t>(table[block]) * block_size - block * block_size;
    const int64_t end = std::min(p1, (block + 1) * block_size);
    for (; p < end; ++p) fn(p, base + p);
  }
}

constexpr int64_t kMaxHeadDim = 256;

// The slots of positions p0 .. p1 − 1 of a sequence, in order.
inline void slots_of(const int32_t* table, int64_t block_size, int64_t p0, int64_t p1,
                     int64_t* slots) {
  for_each_slot(table, block_size, p0, p1, [&](int64_t p, int64_t slot) { slots[p - p0] = slot; });
}

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

// Scores of g query heads (qf: [g, d], scaled) against the keys of `slots` [n], for a head_dim
// of NC·16: 16 keys at a time, converted once for all heads, each head's 16 dot products
// summed by one lane-sum tree. scores: [g, n].
template <int NC, typename T>
void score_keys_fast(const T* kc, int64_t k_slot, int64_t head_offset, const int64_t* slots,
                     int64_t n, int64_t g, const float* qf, float* scores) {
  constexpr int64_t d = NC * 16;
  alignas(64) float keys[16][d];
  alignas(64) float sums[16];
  for (int64_t p0 = 0; p0 < n; p0 += 16) {
    const int64_t count = std::min<int64_t>(16, n - p0);
    for (int64_t r = 0; r < count; ++r) {
      const T* k = kc + slots[p0 + r] * k_slot + head_offset;
      for (int c = 0; c < NC; ++c) _mm512_store_ps(&keys[r][16 * c], load16(k + 16 * c));
    }
    for (int64_t j = 0; j < g; ++j) {
      __m512 qv[NC];
      for (int c = 0; c < NC; ++c) qv[c] = _mm512_loadu_ps(qf + j * d + 16 * c);
      __m512 dots[16];
      for (int64_t r = 0; r < 16; ++r) {
        __m512 a = _mm512_setzero_ps();
        if (r < count)
          for (int c = 0; c < NC; ++c)
            a = _mm512_fmadd_ps(qv[c], _mm512_load_ps(&keys[r][16 * c]), a);
        dots[r] = a;
      }
      _mm512_store_ps(sums, sum_lanes_16(dots));
      std::memcpy(scores + j * n + p0, sums, count * sizeof(float));
    }
  }
}

// acc_out[j] = Σ_p weights[j, p] · v[slots[p]] for g heads, head_dim NC·16: the accumulators of
// 4 heads held in registers, each value row converted once for them.
template <int NC, typename T>
void accumulate_values_fast(const T* vc, int64_t v_slot, int64_t head_offset,
                            const int64_t* slots, int64_t n, int64_t g, const float* weights,
                            float* acc_out) {
  constexpr int64_t d = NC * 16;
  for (int64_t j0 = 0; j0 < g; j0 += 4) {
    const int64_t heads = std::min<int64_t>(4, g - j0);
    __m512 acc[4][NC];
    for (int64_t jj = 0; jj < 4; ++jj)
      for (int c = 0; c < NC; ++c) acc[jj][c] = _mm512_setzero_ps();
    for (int64_t p = 0; p < n; ++p) {
      const T* v = vc + slots[p] * v_slot + head_offset;
      __m512 vv[NC];
      for (int c = 0; c < NC; ++c) vv[c] = load16(v + 16 * c);
      for (int64_t jj = 0; jj < heads; ++jj) {
        const __m512 w = _mm512_set1_ps(weights[(j0 + jj) * n + p]);
        for (int c = 0; c < NC; ++c) acc[jj][c] = _mm512_fmadd_ps(w, vv[c], acc[jj][c]);
      }
    }
    for (int64_t jj = 0; jj < heads; ++jj)
      for (int c = 0; c < NC; ++c) _mm512_storeu_ps(acc_out + (j0 + jj) * d + 16 * c, acc[jj][c]);
  }
}

// Calls f(std::integral_constant<int, NC>) for a head_dim of NC·16 (16 .. 128); false if the
// head_dim is another (the generic loops then).
template <typename F>
bool with_head_chunks(int64_t d, F&& f) {
  switch (d) {
    case 16: f(std::integral_constant<int, 1>{}); return true;
    case 32: f(std::integral_constant<int, 2>{}); return true;
    case 48: f(std::integral_constant<int, 3>{}); return true;
    case 64: f(std::integral_constant<int, 4>{}); return true;
    case 80: f(std::integral_constant<int, 5>{}); return true;
    case 96: f(std::integral_constant<int, 6>{}); return true;
    case 112: f(std::integral_constant<int, 7>{}); return true;
    case 128: f(std::integral_constant<int, 8>{}); return true;
    default: return false;
  }
}
#endif

// One work item: partial (m, l, acc) for its g query heads over positions [p0, p1): scores,
// softmax numerators, then the weighted sum of values. Each key and value row is read and
// converted to float32 once for all g heads.
template <typename T>
void attend_partition(const AttentionProblem& a, const T* q, const T* kc, const T* vc, int64_t b,
                      int64_t kv_head, int64_t p0, int64_t p1, float* m_out, float* l_out,
                      float* acc_out) {
  const int64_t g = a.num_heads / a.num_kv_heads, d = a.head_dim, n = p1 - p0;
  std::vector<float> qf(g * d), scores(g * n);
  std::vector<int64_t> slots(n);
  for (int64_t j = 0; j < g; ++j) {
    const T* qj = q + b * a.q_row + (kv_head * g + j) * a.q_head;
    for (int64_t i = 0; i < d; ++i) qf[j * d + i] = to_f(qj[i]) * a.scale;
  }
  slots_of(a.block_tables + b * a.max_blocks, a.block_size, p0, p1, slots.data());
  const int64_t offset = kv_head * d;
  bool is_fast = false;
#if defined(__AVX512F__)
  is_fast = with_head_chunks(d, [&](auto nc) {
    score_keys_fast<decltype(nc)::value, T>(kc, a.k_slot, offset, slots.data(), n, g, qf.data(),
                                            scores.data());
  });
#endif
  float row[kMaxHeadDim];  // one key or value row in float32 (the generic loops)
  if (!is_fast) {
    for (int64_t p = 0; p < n; ++p) {
      to_float_row(kc + slots[p] * a.k_slot + offset, row, d);
      for (int64_t j = 0; j < g; ++j) scores[j * n + p] = dot(qf.data() + j * d, row, d);
    }
  }
  for (int64_t j = 0; j < g; ++j) {
    float* s = scores.data() + j * n;
    const float m = *std::max_element(s, s + n);
    m_out[j] = m;
    l_out[j] = exp_shifted_sum(s, m, n);
  }
#if defined(__AVX512F__)
  if (is_fast) {
    with_head_chunks(d, [&](auto nc) {
      accumulate_values_fast<decltype(nc)::value, T>(vc, a.v_slot, offset, slots.data(), n, g,
                                                     scores.data(), acc_out);
    });
    return;
  }
#endif
  std::fill(acc_out, acc_out + g * d, 0.0f);
  for (int64_t p = 0; p < n; ++p) {
    to_float_row(vc + slots[p] * a.v_slot + offset, row, d);
    for (int64_t j = 0; j < g; ++j) axpy(acc_out + j * d, scores[j * n + p], row, d);
  }
}

template <typename T>
void decode_attention_impl(const AttentionProblem& a, const T* q, const T* kc, const T* vc,
                           T* out, int64_t num_partitions) {
  const int64_t g = a.num_heads / a.num_kv_heads, d = a.head_dim;
  const int64_t items = a.batch * a.num_kv_heads * num_partitions;
  // Partials per (sequence, query head, partition).
  std::vector<float> m(a.batch * a.num_heads * num_partitions);
  std::vector<float> l(m.size());
  std::vector<float> acc(m.size() * d);
  std::vector<char> used(a.batch * a.num_kv_heads * num_partitions, 0);
  at::parallel_for(0, items, 1, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t part = item % num_partitions, bh = item / num_partitions;
      const int64_t b = bh / a.num_kv_heads, kv_head = bh % a.num_kv_heads;
      const int64_t len = a.context_lens[b];
      const int64_t size = (len + num_partitions - 1) / num_partitions;
      const int64_t p0 = part * size, p1 = std::min(len, p0 + size);
      if (p0 >= p1) continue;
      used[item] = 1;
      const int64_t first = (b * a.num_heads + kv_head * g) * num_partitions + part;
      // the g heads' partials sit num_partitions apart: attend into a local block, then scatter
      std::vector<float> mj(g), lj(g), accj(g * d);
      attend_partition<T>(a, q, kc, vc, b, kv_head, p0, p1, mj.data(), lj.data(), accj.data());
      for (int64_t j = 0; j < g; ++j) {
        const int64_t at = first + j * num_partitions;
        m[at] = mj[j];
        l[at] = lj[j];
        std::memcpy(&acc[at * d], &accj[j * d], d * sizeof(float));
      }
    }
  });
  at::parallel_for(0, a.batch * a.num_heads, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> o(d);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / a.num_heads, kv_head = (bh % a.num_heads) / g;
      const int64_t item0 = (b * a.num_kv_heads + kv_head) * num_partitions;
      float big = -std::numeric_limits<float>::infinity();
      for (int64_t p = 0; p < num_partitions; ++p)
        if (used[item0 + p]) big = std::max(big, m[bh * num_partitions + p]);
      float total = 0.0f;
      std::fill(o.begin(), o.end(), 0.0f);
      for (int64_t p = 0; p < num_partitions; ++p) {
        if (!used[item0 + p]) continue;
        const int64_t at = bh * num_partitions + p;
        const float w = std::exp(m[at] - big);
        total += w * l[at];
        for (int64_t i = 0; i < d; ++i) o[i] += w * acc[at * d + i];
      }
      T* ob = out + bh * d;
      for (int64_t i = 0; i < d; ++i) ob[i] = from_f<T>(o[i] / total);
    }
  });
}

at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& key_cache,
                                  const at::Tensor& value_cache, const at::Tensor& block_tables,
                                  const at::Tensor& context_lens, int64_t block_size,
                                  double scale, int64_t max_context_len) {
  TORCH_CHECK(q.dim() == 3 && q.stride(2) == 1, "paged_decode_attention: q must be [B, nh, d]");
  TORCH_CHECK(key_cache.dim() == 3 && value_cache.dim() == 3 &&
                  key_cache.sizes() == value_cache.sizes() && key_cache.size(2) == q.size(2) &&
                  key_cache.stride(2) == 1 && key_cache.stride(1) == q.size(2) &&
                  value_cache.stride(2) == 1 && value_cache.stride(1) == q.size(2),
              "paged_decode_attention: caches must be [S, nkv, d] with [nkv, d] contiguous");
  TORCH_CHECK(key_cache.scalar_type() == q.scalar_type() &&
                  value_cache.scalar_type() == q.scalar_type(),
              "paged_decode_attention: caches must be in q's dtype");
  TORCH_CHECK(q.size(1) % key_cache.size(1) == 0, "paged_decode_attention: nkv must divide nh");
  TORCH_CHECK(q.size(2) <= kMaxHeadDim, "paged_decode_attention: head_dim above ", kMaxHeadDim);
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.size(0) == q.size(0) &&
                  block_tables.scalar_type() == at::kInt && block_tables.is_contiguous(),
              "paged_decode_attention: block_tables must be a contiguous int32 [B, max_blocks]");
  TORCH_CHECK(context_lens.dim() == 1 && context_lens.size(0) == q.size(0) &&
                  context_lens.scalar_type() == at::kInt && context_lens.is_contiguous(),
              "paged_decode_attention: context_lens must be a contiguous int32 [B]");
  TORCH_CHECK(block_size > 0 && max_context_len > 0, "paged_decode_attention: sizes must be > 0");
  at::Tensor out = at::empty({q.size(0), q.size(1), q.size(2)}, q.options());
  if (q.size(0) == 0) return out;
  AttentionProblem a;
  a.batch = q.size(0);
  a.num_heads = q.size(1);
  a.num_kv_heads = key_cache.size(1);
  a.head_dim = q.size(2);
  a.block_size = block_size;
  a.max_blocks = block_tables.size(1);
  a.q_row = q.stride(0);
  a.q_head = q.stride(1);
  a.k_slot = key_cache.stride(0);
  a.v_slot = value_cache.stride(0);
  a.block_tables = block_tables.data_ptr<int32_t>();
  a.context_lens = context_lens.data_ptr<int32_t>();
  a.scale = static_cast<float>(scale);
  for (int64_t b = 0; b < a.batch; ++b)
    TORCH_CHECK(a.context_lens[b] >= 1 && a.context_lens[b] <= a.max_blocks * block_size,
                "paged_decode_attention: context_lens[", b, "] = ", a.context_lens[b],
                " is outside 1..max_blocks*block_size");
  // Enough partitions for every thread to have work, none shorter than kMinPartition.
  const int64_t threads = at::get_num_threads();
  const int64_t items = a.batch * a.num_kv_heads;
  const int64_t wanted = (2 * threads + items - 1) / items;
  const int64_t most = std::max<int64_t>(1, max_context_len / kMinPartition);
  const int64_t num_partitions = std::max<int64_t>(1, std::min(wanted, most));
  dispatch_float(q.scalar_type(), "paged_decode_attention", [&](auto tag) {
    using scalar_t = decltype(tag);
    decode_attention_impl<scalar_t>(a, q.data_ptr<scalar_t>(), key_cache.data_ptr<scalar_t>(),
                                    value_cache.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(),
                                    num_partitions);
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(LLMBENCH_EXTENSION_NAMESPACE, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("rope_(Tensor(a!) x, Tensor positions, Tensor cos_sin, int head_dim) -> ()");
  m.def(
      "paged_decode_attention(Tensor q, Tensor key_cache, Tensor value_cache, "
      "Tensor block_tables, Tensor context_lens, int block_size, float scale, "
      "int max_context_len) -> Tensor");
}

TORCH_LIBRARY_IMPL(LLMBENCH_EXTENSION_NAMESPACE, CPU, m) {
  m.impl("rms_norm", &rms_norm);
  m.impl("rope_", &rope_);
  m.impl("paged_decode_attention", &paged_decode_attention);
}
