// Causal attention of a prompt's query rows (prefill) on Intel's AMX tiles, flash-style:
//
//     out[i, h] = Σ_j softmax_j(scale · q[i, h] · k[j, h / g]) · v[j, h / g],  j ≤ offset + i
//
// q [L, nh, d], k and v [C, nkv, d] (bfloat16, rows any stride), query i at position
// offset + i of the context (offset = C − L: 0 for a fresh prompt, the cached prefix's length
// for a later chunk), g = nh / nkv query heads sharing a KV head.
//
// Computed transposed, so that the softmax runs down columns, one vector per key, with no sum or
// max across a vector's lanes: a task is one query head × 16 query rows, and for every 32 keys
// it can see
//     S^T [32 keys][16 queries] = K · Q^T        (K straight from its rows as the A operand,
//                                                 Q^T packed once a task as the B operand)
//     p = 2^(S^T · scale · log2 e − m), m the running max of each query (a lane), masked
//                                                 causally
//     O^T [d][16 queries] += V^T · P^T            (V^T packed once a call as the A operand,
//                                                 P^T rounded to bfloat16 into the B operand's
//                                                 pair layout: keys 2p and 2p + 1 interleaved)
// O^T stays in tiles from one block of keys to the next (d ≤ 64: four tiles); only when a
// query's scores outgrow the max its exponents are taken against by more than kSlack are they
// stored, rescaled by 2^(m_old − m_new) and loaded back. At the end O^T / Σp is written out,
// rounded once. Tasks go to threads with the short and the long rows of
// the causal triangle interleaved, so that each thread gets as many products.
//
// A CPU (or OS) without the tiles: AVX-512 BF16 dot products (prefill_attention_vectors.cpp)
// for d 32, 64 or 128; other head sizes, or no AVX-512 BF16: torch's SDPA, called by this op.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "gemv_amx.h"
#include "prefill_attention.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#include <immintrin.h>

#include "simd.h"
#define LLMBENCH_HAS_AMX 1
#endif

#ifndef LLMBENCH_EXTENSION_NAMESPACE
#define LLMBENCH_EXTENSION_NAMESPACE llmbench_cpu_ext
#endif

namespace {

constexpr int64_t kQueries = 16;  // query rows a task: the tiles' columns
constexpr int64_t kKeys = 32;     // keys a step: two tiles of S^T, the k of one P^T tile
constexpr float kSlack = 12.0f;   // how far a score (base 2) may pass the max it is taken against

#ifdef LLMBENCH_HAS_AMX
// One KV head, packed for the tiles: keys [Cp][d] (rows of d, zeros past C) and values^T per
// 32 keys [Cp / 32][d][32] (zeros past C: each A tile 16 rows of 64 bytes, one after another;
// [d][Cp] put its rows 4 KiB apart, in one L1 set), Cp = C rounded up to 32.
struct KvHead {
  const uint16_t* keys;
  const uint16_t* values_t;
  int64_t C, Cp, d;
};

// Query head rows pos0 .. pos0 + rows − 1 (rows ≤ 16), q rows q_row apart, over `kv`; out rows
// out_row apart. The caller configured the tiles (every tile 16 rows of 64 bytes).
void attend_rows(const uint16_t* q, int64_t q_row, int64_t rows, int64_t pos0, const KvHead& kv,
                 float scale, uint16_t* out, int64_t out_row) {
  const int64_t d = kv.d;  // 32 or 64
  // Q^T as B tiles: per 32 of d, [16 pairs of d][16 queries] dwords (zeros past `rows`).
  alignas(64) uint32_t q_t[2 * 256];
  const uint16_t* q_rows[kQueries];
  for (int64_t r = 0; r < rows; ++r) q_rows[r] = q + r * q_row;
  llmbench_simd::pack_pair_rows(q_rows, rows, d, reinterpret_cast<uint16_t*>(q_t));
  // Two blocks of keys in flight: S^T and P^T double-buffered, so that the tiles' results are
  // read by the vectors (and the vectors' by the tiles) a step after they were written. Read
  // at once, each handoff stalled on the store (in `perf`, ~30% of the kernel's samples).
  alignas(64) float s_t[2][kKeys * kQueries];     // S^T of a block of keys
  alignas(64) uint32_t p_t[2][16 * kQueries];     // P^T as a B tile: 16 pairs of keys × 16 queries
  alignas(64) float o_t[64 * kQueries];           // O^T when it leaves the tiles
  const float neg_inf = -std::numeric_limits<float>::infinity();
  // Scores in base 2: s · scale · log2(e), so that p = 2^(s2 − m2) (simd.h's `exp2_coarse`,
  // to ~1e-4: p is rounded to bfloat16 anyway).
  __m512 row_max = _mm512_set1_ps(neg_inf), row_sum = _mm512_setzero_ps();
  const __m512 scale_v = _mm512_set1_ps(scale * 1.44269504088896341f);
  const __m512 slack = _mm512_set1_ps(kSlack);
  const int64_t o_tiles = d / 16;  // 2 or 4: tmm2 .. tmm5
  _tile_zero(2);
  _tile_zero(3);
  _tile_zero(4);
  _tile_zero(5);
  const int64_t visible = std::min(pos0 + rows, kv.C);  // keys the last row sees
  const int64_t blocks = (visible + kKeys - 1) / kKeys;
  // S^T = K · Q^T of block b into s_t[b % 2]: tmm0 keys 0 .. 15 of the block, tmm1 16 .. 31.
  auto scores = [&](int64_t b) {
    _tile_zero(0);
    _tile_zero(1);
    const uint16_t* k0 = kv.keys + b * kKeys * d;
    for (int64_t s = 0; s < d / 32; ++s) {
      _tile_loadd(7, q_t + s * 256, 64);
      _tile_loadd(6, k0 + s * 32, d * 2);
      _tile_dpbf16ps(0, 6, 7);
      _tile_loadd(6, k0 + 16 * d + s * 32, d * 2);
      _tile_dpbf16ps(1, 6, 7);
    }
    _tile_stored(0, s_t[b % 2], 64);
    _tile_stored(1, s_t[b % 2] + 16 * kQueries, 64);
  };
  // O^T += V^T · P^T of block b (P^T in p_t[b % 2]): tile i is d 16i .. 16i + 15.
  auto weigh = [&](int64_t b) {
    _tile_loadd(7, p_t[b % 2], 64);
    const uint16_t* vt = kv.values_t + b * kKeys * d;  // this block's [d][32]
    _tile_loadd(6, vt, 64);
    _tile_dpbf16ps(2, 6, 7);
    _tile_loadd(6, vt + 16 * kKeys, 64);
    _tile_dpbf16ps(3, 6, 7);
    if (o_tiles > 2) {
      _tile_loadd(6, vt + 32 * kKeys, 64);
      _tile_dpbf16ps(4, 6, 7);
      _tile_loadd(6, vt + 48 * kKeys, 64);
      _tile_dpbf16ps(5, 6, 7);
    }
  };
  if (blocks > 0) scores(0);
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t key0 = b * kKeys;
    if (b > 0) weigh(b - 1);
    if (b + 1 < blocks) scores(b + 1);
    const float* st = s_t[b % 2];
    // Key j is seen by the queries r with key0 + j <= pos0 + r (lanes from key0 + j − pos0);
    // below the diagonal, by all of them.
    __m512 block_max = _mm512_set1_ps(neg_inf);
    __mmask16 seen[kKeys];
    const bool whole = key0 + kKeys <= std::min(pos0 + 1, kv.C);
    for (int64_t j = 0; j < kKeys; ++j) {
      const int64_t first = key0 + j - pos0;  // the first query that sees key j
      seen[j] = whole                                ? 0xFFFF
                : key0 + j >= kv.C || first >= kQueries ? 0
                : first <= 0                         ? 0xFFFF
                                                     : static_cast<__mmask16>(0xFFFF << first);
      block_max = _mm512_mask_max_ps(block_max, seen[j], block_max, _mm512_load_ps(st + j * kQueries));
    }
    block_max = _mm512_mul_ps(block_max, scale_v);  // scale > 0: the max of the base-2 scores
    // The max the exponents are taken against moves only when a query's scores outgrow it by
    // more than kSlack (2^12 = 4,096: p and Σp stay far inside float32 and bfloat16's range):
    // O^T then leaves the tiles to be rescaled far less often than the max grows. O^T holds
    // blocks 0 .. b − 1 here.
    const __m512 new_max = _mm512_max_ps(row_max, block_max);
    if (key0 == 0) {
      row_max = new_max;  // O^T and Σp are still 0
    } else if (_mm512_cmp_ps_mask(block_max, _mm512_add_ps(row_max, slack), _CMP_GT_OQ)) {
      // rescale O^T and Σp by 2^(m_old − m_new)
      const __m512 alpha = llmbench_simd::exp2_coarse(_mm512_sub_ps(row_max, new_max));
      row_sum = _mm512_mul_ps(row_sum, alpha);
      _tile_stored(2, o_t, 64);
      _tile_stored(3, o_t + 16 * kQueries, 64);
      if (o_tiles > 2) {
        _tile_stored(4, o_t + 32 * kQueries, 64);
        _tile_stored(5, o_t + 48 * kQueries, 64);
      }
      for (int64_t i = 0; i < d; ++i)
        _mm512_store_ps(o_t + i * kQueries, _mm512_mul_ps(_mm512_load_ps(o_t + i * kQueries), alpha));
      _tile_loadd(2, o_t, 64);
      _tile_loadd(3, o_t + 16 * kQueries, 64);
      if (o_tiles > 2) {
        _tile_loadd(4, o_t + 32 * kQueries, 64);
        _tile_loadd(5, o_t + 48 * kQueries, 64);
      }
      row_max = new_max;
    }
    // p = 2^(s2 − m2) where seen, 0 elsewhere; keys 2p and 2p + 1 interleaved per query.
    __m512 block_sum = _mm512_setzero_ps();
    // The keys of block b + 2 and the values^T of block b + 1, both read by the tiles in the next
    // step, to L1 meanwhile (4 KiB each at d = 64): a tile load waits for its lines.
    const char* next_keys =
        reinterpret_cast<const char*>(kv.keys + std::min(b + 2, blocks - 1) * kKeys * d);
    const char* next_values =
        reinterpret_cast<const char*>(kv.values_t + std::min(b + 1, blocks - 1) * kKeys * d);
    const int64_t block_bytes = kKeys * d * 2;
    for (int64_t p = 0; p < kKeys / 2; ++p) {
      for (int64_t line = p * 64; line < block_bytes; line += kKeys / 2 * 64) {
        _mm_prefetch(next_keys + line, _MM_HINT_T0);
        _mm_prefetch(next_values + line, _MM_HINT_T0);
      }
      __m512 pair[2];
      for (int t = 0; t < 2; ++t) {
        const int64_t j = 2 * p + t;
        const __m512 e = llmbench_simd::exp2_coarse(
            _mm512_fmsub_ps(_mm512_load_ps(st + j * kQueries), scale_v, row_max));
        pair[t] = _mm512_maskz_mov_ps(seen[j], e);
        block_sum = _mm512_add_ps(block_sum, pair[t]);
      }
      const __m512i both = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(pair[1], pair[0]));
      // p_2p in lanes 0..15, p_2p+1 in 16..31 → interleaved: a pair a query
      _mm512_store_si512(p_t[b % 2] + p * kQueries, llmbench_simd::interleave_halves_epi16(both));
    }
    row_sum = _mm512_add_ps(row_sum, block_sum);
  }
  if (blocks > 0) weigh(blocks - 1);
  _tile_stored(2, o_t, 64);
  _tile_stored(3, o_t + 16 * kQueries, 64);
  if (o_tiles > 2) {
    _tile_stored(4, o_t + 32 * kQueries, 64);
    _tile_stored(5, o_t + 48 * kQueries, 64);
  }
  // O^T / Σp, per 16 of d: [16 of d][16 queries] transposed in registers into a row a query.
  const __m512 inv = _mm512_div_ps(_mm512_set1_ps(1.0f), row_sum);
  for (int64_t i0 = 0; i0 < d; i0 += 16) {
    __m512i block[16];
    for (int64_t i = 0; i < 16; ++i)
      block[i] =
          _mm512_castps_si512(_mm512_mul_ps(_mm512_load_ps(o_t + (i0 + i) * kQueries), inv));
    llmbench_simd::transpose_16x16(block);
    for (int64_t r = 0; r < rows; ++r)
      _mm256_storeu_si256(
          reinterpret_cast<__m256i*>(out + r * out_row + i0),
          reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_castsi512_ps(block[r]))));
  }
}

at::Tensor attend_on_tiles(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           double scale, int64_t offset) {
  const int64_t L = q.size(0), nh = q.size(1), d = q.size(2), C = k.size(0), nkv = k.size(1);
  const int64_t group = nh / nkv, Cp = (C + kKeys - 1) / kKeys * kKeys;
  std::vector<uint16_t> keys(nkv * Cp * d, 0), values_t(nkv * d * Cp, 0);
  const auto* kp = static_cast<const uint16_t*>(k.data_ptr());
  const auto* vp = static_cast<const uint16_t*>(v.data_ptr());
  at::parallel_for(0, nkv, 1, [&](int64_t begin, int64_t end) {
    for (int64_t h = begin; h < end; ++h) {
      uint16_t* kh = keys.data() + h * Cp * d;
      uint16_t* vh = values_t.data() + h * d * Cp;
      for (int64_t j = 0; j < C; ++j) {
        std::memcpy(kh + j * d, kp + j * k.stride(0) + h * k.stride(1), d * 2);
        const uint16_t* vj = vp + j * v.stride(0) + h * v.stride(1);
        for (int64_t i = 0; i < d; ++i) vh[((j / kKeys) * d + i) * kKeys + j % kKeys] = vj[i];
      }
    }
  });
  at::Tensor out = at::empty({L, nh, d}, q.options());
  const auto* qp = static_cast<const uint16_t*>(q.data_ptr());
  auto* op = static_cast<uint16_t*>(out.data_ptr());
  const int64_t blocks = (L + kQueries - 1) / kQueries;
  at::parallel_for(0, nh * blocks, 1, [&](int64_t begin, int64_t end) {
    llmbench_amx::configure_tiles();
    for (int64_t t = begin; t < end; ++t) {
      const int64_t head = t % nh, j = t / nh;
      const int64_t b = llmbench_prefill_attention::triangle_order(j, blocks);
      const int64_t first = b * kQueries, rows = std::min(kQueries, L - first);
      const int64_t h = head / group;
      const KvHead kv{keys.data() + h * Cp * d, values_t.data() + h * d * Cp, C, Cp, d};
      attend_rows(qp + first * q.stride(0) + head * q.stride(1), q.stride(0), rows,
                  offset + first, kv, static_cast<float>(scale), op + (first * nh + head) * d,
                  nh * d);
    }
    llmbench_amx::release_tiles();
  });
  return out;
}
#endif

// torch's SDPA on the same problem (4-D inputs: its flash kernel).
at::Tensor attend_with_torch(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             double scale, int64_t offset) {
  const int64_t L = q.size(0), C = k.size(0);
  c10::optional<at::Tensor> mask;
  if (offset > 0) {  // query i at position offset + i sees keys 0 ..= that position
    at::Tensor key_pos = at::arange(C, q.options().dtype(at::kLong));
    at::Tensor query_pos = at::arange(L, q.options().dtype(at::kLong)) + offset;
    mask = key_pos.unsqueeze(0) <= query_pos.unsqueeze(1);
  }
  at::Tensor o = at::scaled_dot_product_attention(
      q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0),
      v.transpose(0, 1).unsqueeze(0), mask, 0.0, offset == 0, scale, /*enable_gqa=*/true);
  return o.squeeze(0).transpose(0, 1).contiguous();
}

at::Tensor prefill_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             double scale, int64_t offset) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3,
              "prefill_attention: q must be [L, nh, d], k and v [C, nkv, d]");
  TORCH_CHECK(q.scalar_type() == at::kBFloat16 && k.scalar_type() == at::kBFloat16 &&
                  v.scalar_type() == at::kBFloat16,
              "prefill_attention: q, k and v must be bfloat16");
  TORCH_CHECK(q.stride(2) == 1 && k.stride(2) == 1 && v.stride(2) == 1,
              "prefill_attention: each head's d values must be contiguous");
  TORCH_CHECK(k.sizes() == v.sizes() && k.size(2) == q.size(2),
              "prefill_attention: k and v must be [C, nkv, d] with q's d");
  const int64_t L = q.size(0), nh = q.size(1), d = q.size(2), C = k.size(0), nkv = k.size(1);
  TORCH_CHECK(nkv > 0 && nh % nkv == 0, "prefill_attention: nh must be a multiple of nkv");
  TORCH_CHECK(L > 0 && offset == C - L, "prefill_attention: offset must be C − L >= 0, got ",
              offset, " for L ", L, ", C ", C);
  bool has_tiles = false;
#ifdef LLMBENCH_HAS_AMX
  has_tiles = llmbench_amx::available();
  if ((d == 32 || d == 64) && has_tiles) return attend_on_tiles(q, k, v, scale, offset);
#endif
#ifdef LLMBENCH_HAS_BF16_VECTORS
  // Where the tiles are, torch's SDPA multiplies on them too (MKL): faster than the vectors.
  if (!has_tiles && llmbench_prefill_attention::vectors_take(d))
    return llmbench_prefill_attention::attend_with_vectors(q, k, v, scale, offset);
#endif
  return attend_with_torch(q, k, v, scale, offset);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(LLMBENCH_EXTENSION_NAMESPACE, m) {
  m.def("prefill_attention(Tensor q, Tensor k, Tensor v, float scale, int offset) -> Tensor");
}

TORCH_LIBRARY_IMPL(LLMBENCH_EXTENSION_NAMESPACE, CPU, m) {
  m.impl("prefill_attention", &prefill_attention);
}
