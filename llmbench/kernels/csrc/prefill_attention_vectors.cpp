// Causal prefill attention (prefill_attention.cpp's op) with AVX-512 BF16 dot products
// (VDPBF16PS), for a CPU without AMX tiles, such as an AMD EPYC, where torch's SDPA multiplies
// bfloat16 through MKL without native bfloat16 products (115 GFLOP/s on that EPYC, 131 on the
// Intel Xeon with MKL held to AVX2). Flash-style: a task is one query head × R query rows, and
// for every block of 16 keys they can see
//
//     s[r] (16 keys, float32) = Σ_p q[r] pair p · K pair p      K packed per 16 keys as
//                                                              [d/2 pairs][16 keys][2]: one
//                                                              vector per pair, q's pair
//                                                              broadcast
//     p = 2^(s · scale · log2 e − m[r]), m the row's running max, masked causally
//     o[r] (d, float32) += Σ_m p pair m · V key pair m          V packed per 16 keys as
//                                                              [8 key pairs][d][2]
//
// p is rounded to bfloat16 before p·v (as on the tiles, and in torch's flash kernel) and Σp
// sums the rounded values; o / Σp is rounded once at the end. R = 8, 4, 2 rows for d = 32, 64,
// 128: o stays in 16 vector registers from one block of keys to the next. Two blocks a step
// share one test of the running max (a sum across lanes): 165 → 170-176 GFLOP/s.
#include "prefill_attention.h"

#ifdef LLMBENCH_HAS_BF16_VECTORS
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "simd.h"

namespace llmbench_prefill_attention {
namespace {

constexpr int64_t kKeys = 16;  // keys a block: one vector of scores
constexpr float kLog2e = 1.44269504088896341f;

// One KV head packed as above, Cp = C rounded up to 16 (zeros past C).
struct PackedHead {
  const uint32_t* keys;    // [Cp / 16][d / 2][16]
  const uint32_t* values;  // [Cp / 16][8][d]
};

inline __m512bh pair_bcast(uint32_t pair) { return (__m512bh)_mm512_set1_epi32(pair); }

// Query head rows at positions pos0 .. pos0 + rows − 1 (rows ≤ R), q rows q_row apart, out rows
// out_row apart.
template <int D, int R>
void attend_rows(const uint16_t* q, int64_t q_row, int64_t rows, int64_t pos0,
                 const PackedHead& kv, float scale, uint16_t* out, int64_t out_row) {
  constexpr int P = D / 2, V = D / 16;
  alignas(64) uint32_t qp[R][P];
  for (int r = 0; r < R; ++r) {
    if (r < rows)
      std::memcpy(qp[r], q + r * q_row, D * 2);
    else
      std::memset(qp[r], 0, D * 2);
  }
  __m512 o[R][V], sum[R];
  float m[R];
  for (int r = 0; r < R; ++r) {
    for (int v = 0; v < V; ++v) o[r][v] = _mm512_setzero_ps();
    sum[r] = _mm512_setzero_ps();
    m[r] = -std::numeric_limits<float>::infinity();
  }
  const float c = scale * kLog2e;
  const int64_t blocks = (pos0 + rows - 1) / kKeys + 1;  // up to the last row's position
  alignas(64) uint32_t pb[2][R][kKeys / 2];
  for (int64_t b = 0; b < blocks; b += 2) {
    const int halves = b + 1 < blocks ? 2 : 1;
    __m512 s[2][R];
    for (int h = 0; h < 2; ++h)
      for (int r = 0; r < R; ++r) s[h][r] = _mm512_setzero_ps();
    for (int h = 0; h < halves; ++h) {
      const uint32_t* kb = kv.keys + (b + h) * P * kKeys;
      for (int p = 0; p < P; ++p) {
        const __m512bh k = (__m512bh)_mm512_loadu_si512(kb + p * kKeys);
        for (int r = 0; r < R; ++r) s[h][r] = _mm512_dpbf16_ps(s[h][r], pair_bcast(qp[r][p]), k);
      }
    }
    for (int r = 0; r < R; ++r) {
      __m512 x[2];
      __mmask16 mask[2];
      for (int h = 0; h < 2; ++h) {
        const int64_t seen = h < halves ? pos0 + r - (b + h) * kKeys + 1 : 0;  // keys seen
        mask[h] = seen >= kKeys ? 0xFFFF : seen <= 0 ? 0 : (1u << seen) - 1;
        x[h] = _mm512_mask_mov_ps(_mm512_set1_ps(-std::numeric_limits<float>::infinity()),
                                  mask[h], _mm512_mul_ps(s[h][r], _mm512_set1_ps(c)));
      }
      const float top = _mm512_reduce_max_ps(_mm512_max_ps(x[0], x[1]));
      if (top > m[r]) {  // rescale what was summed against the old max
        const __m512 alpha = _mm512_set1_ps(std::exp2(m[r] - top));
        for (int v = 0; v < V; ++v) o[r][v] = _mm512_mul_ps(o[r][v], alpha);
        sum[r] = _mm512_mul_ps(sum[r], alpha);
        m[r] = top;
      }
      for (int h = 0; h < halves; ++h) {
        const __m512 e = _mm512_maskz_mov_ps(
            mask[h], llmbench_simd::exp2_coarse(_mm512_sub_ps(x[h], _mm512_set1_ps(m[r]))));
        const __m256i rounded = (__m256i)_mm512_cvtneps_pbh(e);
        sum[r] = _mm512_add_ps(sum[r], llmbench_simd::bf16_to_float(rounded));
        _mm256_store_si256(reinterpret_cast<__m256i*>(pb[h][r]), rounded);
      }
    }
    for (int h = 0; h < halves; ++h) {
      const uint32_t* vb = kv.values + (b + h) * (kKeys / 2) * D;
      for (int pair = 0; pair < kKeys / 2; ++pair) {
        for (int v = 0; v < V; ++v) {
          const __m512bh w = (__m512bh)_mm512_loadu_si512(vb + pair * D + v * 16);
          for (int r = 0; r < R; ++r)
            o[r][v] = _mm512_dpbf16_ps(o[r][v], pair_bcast(pb[h][r][pair]), w);
        }
      }
    }
  }
  for (int r = 0; r < rows; ++r) {
    const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sum[r]));
    for (int v = 0; v < V; ++v) {
      const __m256bh y = _mm512_cvtneps_pbh(_mm512_mul_ps(o[r][v], inv));
      std::memcpy(out + r * out_row + v * 16, &y, 32);
    }
  }
}

template <int D, int R>
void attend_all(const at::Tensor& q, const std::vector<uint32_t>& keys,
                const std::vector<uint32_t>& values, int64_t Cp, int64_t group, double scale,
                int64_t offset, at::Tensor& out) {
  const int64_t L = q.size(0), nh = q.size(1);
  const auto* qp = static_cast<const uint16_t*>(q.data_ptr());
  auto* op = static_cast<uint16_t*>(out.data_ptr());
  const int64_t blocks = (L + R - 1) / R;
  // Head-major, so that a thread's tasks share one KV head in cache; within a head in
  // `triangle_order`.
  at::parallel_for(0, nh * blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t head = t / blocks, j = t % blocks;
      const int64_t b = triangle_order(j, blocks);
      const int64_t first = b * R, rows = std::min<int64_t>(R, L - first);
      const int64_t h = head / group;
      const PackedHead kv{keys.data() + h * Cp * D / 2, values.data() + h * Cp * D / 2};
      attend_rows<D, R>(qp + first * q.stride(0) + head * q.stride(1), q.stride(0), rows,
                        offset + first, kv, static_cast<float>(scale),
                        op + (first * nh + head) * D, nh * D);
    }
  });
}

}  // namespace

at::Tensor attend_with_vectors(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               double scale, int64_t offset) {
  const int64_t L = q.size(0), nh = q.size(1), d = q.size(2), C = k.size(0), nkv = k.size(1);
  const int64_t Cp = (C + kKeys - 1) / kKeys * kKeys, P = d / 2;
  // Both layouts hold Cp · d / 2 pairs a head.
  std::vector<uint32_t> keys(nkv * Cp * P, 0), values(nkv * Cp * P, 0);
  const auto* kp = static_cast<const uint16_t*>(k.data_ptr());
  const auto* vp = static_cast<const uint16_t*>(v.data_ptr());
  at::parallel_for(0, nkv, 1, [&](int64_t begin, int64_t end) {
    for (int64_t h = begin; h < end; ++h) {
      uint32_t* kh = keys.data() + h * Cp * P;
      uint32_t* vh = values.data() + h * Cp * P;
      for (int64_t j = 0; j < C; ++j) {
        const int64_t block = j / kKeys, lane = j % kKeys;
        uint32_t row[64];  // d ≤ 128: 64 pairs
        std::memcpy(row, kp + j * k.stride(0) + h * k.stride(1), d * 2);
        for (int64_t p = 0; p < P; ++p) kh[(block * P + p) * kKeys + lane] = row[p];
        const uint16_t* vj = vp + j * v.stride(0) + h * v.stride(1);
        uint16_t* pairs = reinterpret_cast<uint16_t*>(vh + (block * (kKeys / 2) + lane / 2) * d);
        for (int64_t i = 0; i < d; ++i) pairs[2 * i + lane % 2] = vj[i];
      }
    }
  });
  at::Tensor out = at::empty({L, nh, d}, q.options());
  const int64_t group = nh / nkv;
  if (d == 32) attend_all<32, 8>(q, keys, values, Cp, group, scale, offset, out);
  if (d == 64) attend_all<64, 4>(q, keys, values, Cp, group, scale, offset, out);
  if (d == 128) attend_all<128, 2>(q, keys, values, Cp, group, scale, offset, out);
  return out;
}

}  // namespace llmbench_prefill_attention
#endif
