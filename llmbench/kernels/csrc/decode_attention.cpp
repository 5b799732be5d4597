// Paged decode attention: q [B, nh, d] (one query row per sequence and step, or a few rows of
// one sequence: speculative verification's k + 1) over key_cache, value_cache [S, nkv, d] (the
// halves of one [S, 2, nkv, d] pool: a slot's K and V of every head are 2·nkv·d contiguous
// elements), row b's position p in slot block_tables[b, p / block_size]·block_size +
// p % block_size, positions 0 .. context_lens[b] − 1. Every sum in float32, the output rounded
// once to q's dtype.
//
// Work items are (a run of rows, a partition of their positions). A run is consecutive rows
// with the same block table: one sequence's rows, which share every key and value they read
// (each row sees its own context_lens). An item walks its positions in chunks of kChunk, every
// KV head of a chunk before the next chunk, so that it reads the chunk's slots whole — a
// contiguous stream the hardware prefetcher follows — with an online softmax per (row, query
// head): running max m, running sum l, accumulator rescaled by e^(m_old − m_new) as the max
// grows. Partitions (split-K) give every thread work; they are merged by M = max m_p,
// out = Σ e^(m_p − M)·acc_p / Σ e^(m_p − M)·l_p.
//
// Products: a bfloat16 cache with head_dim a multiple of 32 scores keys with VDPBF16PS (32
// bfloat16 products an instruction, exact, summed in float32): q as it is, the scale applied
// to the sums; values are converted to float32 and weighed with float32 weights (FMA: as fast
// here, 101 against 108 us for 2,048 positions of SmolLM2's heads on one thread, as VDPBF16PS
// on weights rounded to bfloat16, and exact). Other caches convert key rows to float32 too.
// A run of several rows in bfloat16 (verification) goes to the AMX tiles where the CPU has them
// (decode_attention_tiles.cpp).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "decode_attention.h"
#include "gemv_amx.h"
#include "ops.h"
#include "simd.h"

#ifndef LLMBENCH_EXTENSION_NAMESPACE
#define LLMBENCH_EXTENSION_NAMESPACE llmbench_cpu_ext
#endif

namespace {

using llmbench_decode_attention::AttentionProblem;
using llmbench_decode_attention::kNegInf;
using llmbench_decode_attention::RowRun;
using llmbench_decode_attention::slots_of;
using llmbench_decode_attention::States;
using llmbench_simd::dispatch_float;
using llmbench_simd::from_f;
using llmbench_simd::to_f;

constexpr int64_t kChunk = 32;         // positions per step of the online softmax
// The keys and values of the chunk this many chunks ahead are prefetched while a chunk is
// weighed, a slot's rows at a time between its value rows: a burst of a whole chunk's
// prefetches before its use stalled the thread on the line-fill buffers (~45% of the bfloat16
// kernel's samples in `perf`), and the chunk arrived no sooner. In a SmolLM2 bfloat16 decode
// step (context ~600, `llmbench profile`'s op clock) attention went 46 → 38 µs a layer.
constexpr int64_t kAheadChunks = 2;
constexpr int64_t kMinPartition = 256;  // positions: below this a partition is not worth it
constexpr int64_t kMaxHeadDim = 256;
// A step whose attention is below this many (position, query row·head) pairs runs on the
// calling thread: a parallel region's start and join cost more than the work saves.
constexpr int64_t kMinParallelWork = 4096;

// Consecutive rows whose block tables are equal over the blocks the longer context uses.
std::vector<RowRun> row_runs(const AttentionProblem& a) {
  std::vector<RowRun> runs;
  for (int64_t b = 0; b < a.batch; ++b) {
    const int64_t len = a.context_lens[b];
    if (!runs.empty()) {
      RowRun& run = runs.back();
      const int64_t blocks = (std::max(run.len, len) + a.block_size - 1) / a.block_size;
      const int32_t* mine = a.block_tables + b * a.max_blocks;
      const int32_t* theirs = a.block_tables + run.first * a.max_blocks;
      if (std::memcmp(mine, theirs, blocks * sizeof(int32_t)) == 0) {
        ++run.count;
        run.len = std::max(run.len, len);
        continue;
      }
    }
    runs.push_back({b, 1, len});
  }
  return runs;
}

// The online softmax's step for one state over a chunk's scores s[0, n) (masked: −inf):
// s becomes the weights e^(s − m_new); returns the factor the accumulator is rescaled by.
inline float softmax_step(float* s, int64_t n, float& m, float& l) {
  float chunk_max = kNegInf;
  int64_t c = 0;
#if defined(LLMBENCH_AVX2)
  __m256 top = _mm256_set1_ps(kNegInf);
  for (; c + 8 <= n; c += 8) top = _mm256_max_ps(top, _mm256_loadu_ps(s + c));
  chunk_max = llmbench_simd::max8(top);
#endif
  for (; c < n; ++c) chunk_max = std::max(chunk_max, s[c]);
  if (chunk_max == kNegInf) {  // every key masked for this row: nothing changes
    std::fill(s, s + n, 0.0f);
    return 1.0f;
  }
  const float m_new = std::max(m, chunk_max);
  const float alpha = m == kNegInf ? 0.0f : std::exp(m - m_new);
  float total = 0.0f;
  c = 0;
#if defined(LLMBENCH_AVX2)
  const __m256 shift = _mm256_set1_ps(m_new), neg_inf = _mm256_set1_ps(kNegInf);
  __m256 sum = _mm256_setzero_ps();
  for (; c + 8 <= n; c += 8) {  // masked keys weigh exactly nothing
    const __m256 v = _mm256_loadu_ps(s + c);
    const __m256 seen = _mm256_cmp_ps(v, neg_inf, _CMP_NEQ_OQ);
    const __m256 e =
        _mm256_and_ps(seen, llmbench_simd::exp8_nonpositive(_mm256_sub_ps(v, shift)));
    _mm256_storeu_ps(s + c, e);
    sum = _mm256_add_ps(sum, e);
  }
  total = llmbench_simd::sum8(sum);
#endif
  for (; c < n; ++c) {  // masked keys weigh exactly nothing
    s[c] = s[c] == kNegInf ? 0.0f : std::exp(s[c] - m_new);
    total += s[c];
  }
  l = l * alpha + total;
  m = m_new;
  return alpha;
}

#if defined(__AVX512F__)
// The first n of 16 lanes (n ≤ 16).
inline __mmask16 first_lanes(int64_t n) { return static_cast<__mmask16>((1u << n) - 1); }

// softmax_step over a whole chunk s[0, kChunk) (kChunk a multiple of 16) with 16 lanes at a
// time; the keys from n on are masked (and come out as weight 0).
inline float softmax_step_16(float* s, int64_t n, float& m, float& l) {
  const __m512 neg_inf = _mm512_set1_ps(kNegInf);
  __m512 top = neg_inf;
  for (int64_t c = 0; c < kChunk; c += 16) {
    const __mmask16 valid = first_lanes(std::clamp<int64_t>(n - c, 0, 16));
    const __m512 v = _mm512_mask_mov_ps(neg_inf, valid, _mm512_loadu_ps(s + c));
    _mm512_storeu_ps(s + c, v);
    top = _mm512_max_ps(top, v);
  }
  const float chunk_max = _mm512_reduce_max_ps(top);
  if (chunk_max == kNegInf) {  // every key masked for this row: nothing changes
    std::fill(s, s + kChunk, 0.0f);
    return 1.0f;
  }
  const float m_new = std::max(m, chunk_max);
  const float alpha = m == kNegInf ? 0.0f : std::exp(m - m_new);
  const __m512 shift = _mm512_set1_ps(m_new);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t c = 0; c < kChunk; c += 16) {  // masked keys weigh exactly nothing
    const __m512 v = _mm512_loadu_ps(s + c);
    const __mmask16 seen = _mm512_cmp_ps_mask(v, neg_inf, _CMP_NEQ_OQ);
    const __m512 e =
        _mm512_maskz_mov_ps(seen, llmbench_simd::exp_nonpositive(_mm512_sub_ps(v, shift)));
    _mm512_storeu_ps(s + c, e);
    sum = _mm512_add_ps(sum, e);
  }
  l = l * alpha + _mm512_reduce_add_ps(sum);
  m = m_new;
  return alpha;
}
#endif

// Masks the keys of a chunk starting at position c0 that row (context `len`) may not see.
inline void mask_chunk(float* s, int64_t c0, int64_t n, int64_t len) {
  for (int64_t c = std::max<int64_t>(0, len - c0); c < n; ++c) s[c] = kNegInf;
}

#if defined(__AVX512F__) || defined(LLMBENCH_AVX2)
// Every cache line of [p, p + bytes), into L2 (kAheadChunks of K and V, ~49 KiB for SmolLM2,
// would crowd L1).
inline void prefetch_bytes(const void* p, int64_t bytes) {
  for (int64_t i = 0; i < bytes; i += 64)
    _mm_prefetch(static_cast<const char*>(p) + i, _MM_HINT_T1);
}
#endif

#if defined(__AVX512F__)
// acc[0, 16·NV) += Σ_c w[c] · V[slots[c]] over a chunk's n value rows (w[c] = 0: skipped).
template <int NV, typename T>
inline void weigh_state(const T* values, int64_t slot_stride, const int64_t* slots, int64_t n,
                        const float* w, float* acc) {
  __m512 sum[NV];
  for (int e = 0; e < NV; ++e) sum[e] = _mm512_loadu_ps(acc + 16 * e);
  for (int64_t c = 0; c < n; ++c) {
    if (w[c] == 0.0f) continue;
    const __m512 wc = _mm512_set1_ps(w[c]);
    const T* v = values + slots[c] * slot_stride;
    for (int e = 0; e < NV; ++e)
      sum[e] = _mm512_fmadd_ps(wc, llmbench_simd::load16(v + 16 * e), sum[e]);
  }
  for (int e = 0; e < NV; ++e) _mm512_storeu_ps(acc + 16 * e, sum[e]);
}
#endif

#if defined(LLMBENCH_AVX2)
// weigh_state's 8 lanes a vector: acc[0, 8·NV).
template <int NV, typename T>
inline void weigh_state_8(const T* values, int64_t slot_stride, const int64_t* slots, int64_t n,
                          const float* w, float* acc) {
  __m256 sum[NV];
  for (int e = 0; e < NV; ++e) sum[e] = _mm256_loadu_ps(acc + 8 * e);
  for (int64_t c = 0; c < n; ++c) {
    if (w[c] == 0.0f) continue;
    const __m256 wc = _mm256_set1_ps(w[c]);
    const T* v = values + slots[c] * slot_stride;
    for (int e = 0; e < NV; ++e)
      sum[e] = _mm256_fmadd_ps(wc, llmbench_simd::load8(v + 8 * e), sum[e]);
  }
  for (int e = 0; e < NV; ++e) _mm256_storeu_ps(acc + 8 * e, sum[e]);
}
#endif

// One item with float32 products: rows `run` over positions [p0, p1), every KV head.
// st: [count·nh] states, natural lane order.
template <typename T>
void attend_float(const AttentionProblem& a, const T* q, const T* kc, const T* vc,
                  const RowRun& run, int64_t p0, int64_t p1, States& st) {
  const int64_t g = a.num_heads / a.num_kv_heads, d = a.head_dim, rows = run.count;
  const int32_t* table = a.block_tables + run.first * a.max_blocks;
  int64_t slots[kChunk];
  std::vector<float> qf(rows * a.num_heads * d), scores(rows * g * kChunk), kf(kChunk * d);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t h = 0; h < a.num_heads; ++h)
      for (int64_t e = 0; e < d; ++e)
        qf[(i * a.num_heads + h) * d + e] =
            to_f(q[(run.first + i) * a.q_row + h * a.q_head + e]) * a.scale;
  for (int64_t c0 = p0; c0 < p1; c0 += kChunk) {
    const int64_t n = std::min(kChunk, p1 - c0);
    slots_of(table, a.block_size, c0, c0 + n, slots);
#if defined(LLMBENCH_AVX2)
    // the next chunk's key and value rows of each head, a slot a row as this chunk's keys are
    // converted: without, the conversion waited on them (45% of the kernel's samples in `perf`
    // at 32 streams x 512 positions, from L3 as much as from memory)
    int64_t next[kChunk];
    const int64_t n_next = std::max<int64_t>(0, std::min(kChunk, p1 - c0 - kChunk));
    slots_of(table, a.block_size, c0 + kChunk, c0 + kChunk + n_next, next);
#endif
    for (int64_t kv = 0; kv < a.num_kv_heads; ++kv) {
      for (int64_t c = 0; c < n; ++c) {
#if defined(LLMBENCH_AVX2)
        if (c < n_next) {
          prefetch_bytes(kc + next[c] * a.k_slot + kv * d, d * sizeof(T));
          prefetch_bytes(vc + next[c] * a.v_slot + kv * d, d * sizeof(T));
        }
#endif
        llmbench_simd::to_float_row(kc + slots[c] * a.k_slot + kv * d, kf.data() + c * d, d);
      }
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < g; ++j) {
          const int64_t state = i * a.num_heads + kv * g + j;
          float* s = scores.data() + (i * g + j) * kChunk;
          const float* qs = qf.data() + state * d;
#if defined(__AVX512F__)
          // 16 keys' products summed by one lane-sum tree (a reduction a key cost as much as
          // its products), the softmax step 16 lanes at a time (float32 attention at 17% of
          // its roof in a SmolLM2 decode step, its exponentials scalar)
          const bool by_16 = d % 16 == 0;
          if (by_16) {
            for (int64_t k0 = 0; k0 < n; k0 += 16) {
              __m512 dots[16];
              for (int64_t r = 0; r < 16; ++r) {
                const float* key = kf.data() + std::min(k0 + r, n - 1) * d;  // past n: unused
                __m512 acc = _mm512_setzero_ps();
                for (int64_t e = 0; e < d; e += 16)
                  acc = _mm512_fmadd_ps(_mm512_loadu_ps(qs + e), _mm512_loadu_ps(key + e), acc);
                dots[r] = acc;
              }
              _mm512_storeu_ps(s + k0, llmbench_simd::sum_lanes_16(dots));
            }
          } else
#elif defined(LLMBENCH_AVX2)
          // 8 keys' products summed by one tree of horizontal adds; the keys innermost, 8
          // independent sums (one key's sum at a time waited on each FMA: 19% of the samples)
          if (d % 8 == 0) {
            for (int64_t k0 = 0; k0 < n; k0 += 8) {
              const float* keys[8];
              for (int64_t r = 0; r < 8; ++r)
                keys[r] = kf.data() + std::min(k0 + r, n - 1) * d;  // past n: unused
              __m256 dots[8];
              for (int64_t r = 0; r < 8; ++r) dots[r] = _mm256_setzero_ps();
              for (int64_t e = 0; e < d; e += 8) {
                const __m256 qv = _mm256_loadu_ps(qs + e);
                for (int64_t r = 0; r < 8; ++r)
                  dots[r] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(keys[r] + e), dots[r]);
              }
              _mm256_storeu_ps(s + k0, llmbench_simd::sum_lanes_8(dots));
            }
          } else
#endif
            for (int64_t c = 0; c < n; ++c) s[c] = llmbench_simd::dot(qs, kf.data() + c * d, d);
          mask_chunk(s, c0, n, a.context_lens[run.first + i]);
#if defined(__AVX512F__)
          const float alpha = by_16 ? softmax_step_16(s, n, st.m[state], st.l[state])
                                    : softmax_step(s, n, st.m[state], st.l[state]);
#else
          const float alpha = softmax_step(s, n, st.m[state], st.l[state]);
#endif
          float* acc = st.acc.data() + state * d;
          for (int64_t e = 0; e < d; ++e) acc[e] *= alpha;
        }
#if defined(__AVX512F__)
      if (d == 32 || d == 64 || d == 128) {
        // a state at a time over the chunk's value rows (in L1 after the first), its
        // accumulator in registers: d / 16 of them
        const T* values = vc + kv * d;
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t j = 0; j < g; ++j) {
            float* acc = st.acc.data() + (i * a.num_heads + kv * g + j) * d;
            const float* w = scores.data() + (i * g + j) * kChunk;
            if (d == 32) weigh_state<2>(values, a.v_slot, slots, n, w, acc);
            else if (d == 64) weigh_state<4>(values, a.v_slot, slots, n, w, acc);
            else weigh_state<8>(values, a.v_slot, slots, n, w, acc);
          }
        continue;
      }
#elif defined(LLMBENCH_AVX2)
      if (d == 32 || d == 64) {  // as above, d / 8 accumulators (128: more than the 16 ymm)
        const T* values = vc + kv * d;
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t j = 0; j < g; ++j) {
            float* acc = st.acc.data() + (i * a.num_heads + kv * g + j) * d;
            const float* w = scores.data() + (i * g + j) * kChunk;
            if (d == 32) weigh_state_8<4>(values, a.v_slot, slots, n, w, acc);
            else weigh_state_8<8>(values, a.v_slot, slots, n, w, acc);
          }
        continue;
      }
#endif
      for (int64_t c = 0; c < n; ++c) {
        llmbench_simd::to_float_row(vc + slots[c] * a.v_slot + kv * d, kf.data(), d);
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t j = 0; j < g; ++j) {
            const int64_t state = i * a.num_heads + kv * g + j;
            const float w = scores[(i * g + j) * kChunk + c];
            if (w != 0.0f) llmbench_simd::axpy(st.acc.data() + state * d, w, kf.data(), d);
          }
      }
    }
  }
}

#if defined(__AVX512BF16__)
// States weighed together by one pass over a chunk's value rows: their accumulators fit the
// registers beside a row (4·2·NC + 2·NC of 32 zmm for head_dim 64; 2 for wider heads).
template <int NC>
constexpr int64_t kHeldStates = NC <= 2 ? 4 : 2;

template <typename T>
struct ValueRows {  // the value rows of one KV head at a chunk's slots
  const T* base;
  int64_t slot_stride;
  const int64_t* slots;
  int64_t n;
};

struct NextRows {  // the next chunk's K and V rows of the same head, to prefetch (n of them)
  const c10::BFloat16* k;
  const c10::BFloat16* v;
  int64_t k_slot, v_slot;
  const int64_t* slots;
  int64_t n;
};

// acc_t += Σ_c w_t[c] · V[c] for H states, each row converted once; prefetches a next row's
// K and V as it goes, so that the next chunk arrives while this one is weighed.
template <int NC, int H>
inline void weigh_values(const ValueRows<c10::BFloat16>& rows, const NextRows& ahead,
                         float* const* accs, const float* const* ws) {
  constexpr int64_t d = NC * 32;
  __m512 acc[H][2 * NC];  // compile-time trip counts throughout: kept in registers
  for (int t = 0; t < H; ++t)
    for (int e = 0; e < 2 * NC; ++e) acc[t][e] = _mm512_loadu_ps(accs[t] + 16 * e);
  for (int64_t c = 0; c < rows.n; ++c) {
    if (c < ahead.n) {
      prefetch_bytes(ahead.k + ahead.slots[c] * ahead.k_slot, d * 2);
      prefetch_bytes(ahead.v + ahead.slots[c] * ahead.v_slot, d * 2);
    }
    const c10::BFloat16* v = rows.base + rows.slots[c] * rows.slot_stride;
    __m512 row[2 * NC];
    for (int e = 0; e < 2 * NC; ++e) row[e] = llmbench_simd::load16(v + 16 * e);
    for (int t = 0; t < H; ++t) {
      const __m512 w = _mm512_set1_ps(ws[t][c]);
      for (int e = 0; e < 2 * NC; ++e) acc[t][e] = _mm512_fmadd_ps(w, row[e], acc[t][e]);
    }
  }
  for (int t = 0; t < H; ++t)
    for (int e = 0; e < 2 * NC; ++e) _mm512_storeu_ps(accs[t] + 16 * e, acc[t][e]);
}

// One item with q·k through VDPBF16PS, head_dim = NC·32.
template <int NC>
void attend_bf16(const AttentionProblem& a, const c10::BFloat16* q, const c10::BFloat16* kc,
                 const c10::BFloat16* vc, const RowRun& run, int64_t p0, int64_t p1,
                 States& st) {
  constexpr int64_t d = NC * 32;
  const int64_t g = a.num_heads / a.num_kv_heads, rows = run.count, states = rows * g;
  const int32_t* table = a.block_tables + run.first * a.max_blocks;
  const __m512 scale = _mm512_set1_ps(a.scale);
  int64_t slots[kChunk];
  constexpr int64_t kHeld = kHeldStates<NC>;
  std::vector<float> scores(states * kChunk, 0.0f);
  for (int64_t c0 = p0; c0 < p1; c0 += kChunk) {
    const int64_t n = std::min(kChunk, p1 - c0);
    slots_of(table, a.block_size, c0, c0 + n, slots);
    int64_t next[kChunk];
    const int64_t ahead0 = c0 + kAheadChunks * kChunk;
    const int64_t n_next = std::max<int64_t>(0, std::min(kChunk, p1 - ahead0));
    slots_of(table, a.block_size, ahead0, ahead0 + n_next, next);
    if (c0 == p0) {  // the item's first chunks, which nothing prefetched: all at once
      int64_t first[kChunk];
      for (int64_t f0 = p0; f0 < std::min(p1, ahead0); f0 += kChunk) {
        const int64_t nf = std::min(kChunk, p1 - f0);
        slots_of(table, a.block_size, f0, f0 + nf, first);
        for (int64_t c = 0; c < nf; ++c)
          prefetch_bytes(kc + first[c] * a.k_slot, 2 * a.num_kv_heads * d * 2);
      }
    }
    for (int64_t kv = 0; kv < a.num_kv_heads; ++kv) {
      // Scores: per state, 16 keys' products summed by one lane-sum tree.
      for (int64_t k0 = 0; k0 < n; k0 += 16) {
        const int64_t count = std::min<int64_t>(16, n - k0);
        const c10::BFloat16* keys[16];
        for (int64_t r = 0; r < 16; ++r)  // past the end: the first key again, unused
          keys[r] = kc + slots[k0 + (r < count ? r : 0)] * a.k_slot + kv * d;
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t j = 0; j < g; ++j) {
            const c10::BFloat16* qj = q + (run.first + i) * a.q_row + (kv * g + j) * a.q_head;
            __m512bh qv[NC];
            for (int c = 0; c < NC; ++c) qv[c] = (__m512bh)_mm512_loadu_si512(qj + 32 * c);
            __m512 dots[16];
            for (int64_t r = 0; r < 16; ++r) {
              __m512 acc = _mm512_setzero_ps();
              for (int c = 0; c < NC; ++c)
                acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512(keys[r] + 32 * c), qv[c]);
              dots[r] = acc;
            }
            _mm512_mask_storeu_ps(scores.data() + (i * g + j) * kChunk + k0, first_lanes(count),
                                  _mm512_mul_ps(llmbench_simd::sum_lanes_16(dots), scale));
          }
      }
      // Softmax step per state; the accumulators rescaled.
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < g; ++j) {
          const int64_t local = i * g + j, state = i * a.num_heads + kv * g + j;
          float* s = scores.data() + local * kChunk;
          mask_chunk(s, c0, n, a.context_lens[run.first + i]);
          const float alpha = softmax_step_16(s, n, st.m[state], st.l[state]);
          float* acc = st.acc.data() + state * d;
          const __m512 alpha_v = _mm512_set1_ps(alpha);
          for (int64_t e = 0; e < d; e += 16)
            _mm512_storeu_ps(acc + e, _mm512_mul_ps(_mm512_loadu_ps(acc + e), alpha_v));
        }
      // Values: each row converted to float32 once (a 16-bit shift), then weighed for up to
      // kHeld states at a time with float32 weights (FMA), their accumulators in registers.
      // The first group also prefetches this head's K and V of the next chunk, a slot a row.
      for (int64_t s0 = 0; s0 < states; s0 += kHeld) {
        const int64_t held = std::min<int64_t>(kHeld, states - s0);
        float* accs[kHeld];
        const float* ws[kHeld];
        for (int64_t t = 0; t < held; ++t) {
          const int64_t local = s0 + t, i = local / g, j = local % g;
          accs[t] = st.acc.data() + (i * a.num_heads + kv * g + j) * d;
          ws[t] = scores.data() + local * kChunk;
        }
        const ValueRows<c10::BFloat16> rows_v{vc + kv * d, a.v_slot, slots, n};
        const NextRows ahead{kc + kv * d, vc + kv * d, a.k_slot, a.v_slot, next,
                             s0 == 0 ? n_next : 0};
        switch (held) {
          case 1: weigh_values<NC, 1>(rows_v, ahead, accs, ws); break;
          case 2: weigh_values<NC, 2>(rows_v, ahead, accs, ws); break;
          case 3: weigh_values<NC, 3>(rows_v, ahead, accs, ws); break;
          default: weigh_values<NC, kHeld>(rows_v, ahead, accs, ws); break;
        }
      }
    }
  }
}
#endif

// One item, through whichever product path the cache and head_dim take (the tiles where
// tiles_take said so).
template <typename T>
void attend(const AttentionProblem& a, const T* q, const T* kc, const T* vc, const RowRun& run,
            int64_t p0, int64_t p1, bool on_tiles, States& st) {
  st.reset(run.count * a.num_heads, a.head_dim);
#if defined(__AVX512BF16__)
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    if (on_tiles) return llmbench_decode_attention::attend_on_tiles(a, q, kc, vc, run, p0, p1, st);
    switch (a.head_dim) {
      case 32: return attend_bf16<1>(a, q, kc, vc, run, p0, p1, st);
      case 64: return attend_bf16<2>(a, q, kc, vc, run, p0, p1, st);
      case 96: return attend_bf16<3>(a, q, kc, vc, run, p0, p1, st);
      case 128: return attend_bf16<4>(a, q, kc, vc, run, p0, p1, st);
      default: break;
    }
  }
#endif
  attend_float<T>(a, q, kc, vc, run, p0, p1, st);
}

template <typename T>
void decode_attention_impl(const AttentionProblem& a, const T* q, const T* kc, const T* vc,
                           T* out) {
  const int64_t nh = a.num_heads, d = a.head_dim;
  const std::vector<RowRun> runs = row_runs(a);
  int64_t work = 0, longest = 0;
  for (const RowRun& run : runs) {
    work += run.len * run.count * nh;
    longest = std::max(longest, run.len);
  }
  const int64_t threads = work < kMinParallelWork ? 1 : at::get_num_threads();
  const int64_t num_runs = static_cast<int64_t>(runs.size());
  // Enough partitions for every thread to have work, none shorter than kMinPartition.
  const int64_t wanted = (2 * threads + num_runs - 1) / num_runs;
  const int64_t parts = std::max<int64_t>(
      1, std::min(wanted, std::max<int64_t>(1, longest / kMinPartition)));
  const int64_t grain = threads == 1 ? num_runs * parts : 1;
  // Runs of several rows of one sequence go to the tiles where they take them.
  std::vector<char> on_tiles(num_runs, 0);
  bool any_on_tiles = false;
  for (int64_t r = 0; r < num_runs; ++r) {
    on_tiles[r] = llmbench_decode_attention::tiles_take(a, runs[r],
                                                        std::is_same_v<T, c10::BFloat16>);
    any_on_tiles = any_on_tiles || on_tiles[r];
  }
  // Partials per (row, query head, partition): m, l, acc [d].
  std::vector<float> m(a.batch * nh * parts, kNegInf), l(m.size(), 0.0f), acc(m.size() * d);
  at::parallel_for(0, num_runs * parts, grain, [&](int64_t begin, int64_t end) {
    if (any_on_tiles) llmbench_amx::configure_tiles();
    States st;
    for (int64_t item = begin; item < end; ++item) {
      const RowRun& run = runs[item / parts];
      const int64_t part = item % parts, size = (run.len + parts - 1) / parts;
      const int64_t p0 = part * size, p1 = std::min(run.len, p0 + size);
      if (p0 >= p1) continue;
      attend<T>(a, q, kc, vc, run, p0, p1, on_tiles[item / parts], st);
      for (int64_t state = 0; state < run.count * nh; ++state) {
        const int64_t at = (run.first * nh + state) * parts + part;
        m[at] = st.m[state];
        l[at] = st.l[state];
        std::memcpy(&acc[at * d], &st.acc[state * d], d * sizeof(float));
      }
    }
    if (any_on_tiles) llmbench_amx::release_tiles();
  });
  at::parallel_for(0, a.batch * nh, threads == 1 ? a.batch * nh : 16, [&](int64_t begin,
                                                                           int64_t end) {
    std::vector<float> o(d);
    for (int64_t bh = begin; bh < end; ++bh) {
      float big = kNegInf;
      for (int64_t p = 0; p < parts; ++p) big = std::max(big, m[bh * parts + p]);
      float total = 0.0f;
      std::fill(o.begin(), o.end(), 0.0f);
      for (int64_t p = 0; p < parts; ++p) {
        const int64_t at = bh * parts + p;
        if (m[at] == kNegInf) continue;  // a partition past this row's context
        const float w = std::exp(m[at] - big);
        total += w * l[at];
        for (int64_t i = 0; i < d; ++i) o[i] += w * acc[at * d + i];
      }
      T* ob = out + bh * d;
      for (int64_t i = 0; i < d; ++i) ob[i] = from_f<T>(o[i] / total);
    }
  });
}

}  // namespace

at::Tensor llmbench_ops::paged_decode_attention(
    const at::Tensor& q, const at::Tensor& key_cache, const at::Tensor& value_cache,
    const at::Tensor& block_tables, const at::Tensor& context_lens, int64_t block_size,
    double scale, int64_t max_context_len, at::Tensor out) {
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
  out = output("paged_decode_attention", out, {q.size(0), q.size(1), q.size(2)}, q);
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
  dispatch_float(q.scalar_type(), "paged_decode_attention", [&](auto tag) {
    using scalar_t = decltype(tag);
    decode_attention_impl<scalar_t>(a, q.data_ptr<scalar_t>(), key_cache.data_ptr<scalar_t>(),
                                    value_cache.data_ptr<scalar_t>(), out.data_ptr<scalar_t>());
  });
  return out;
}

namespace {

at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& key_cache,
                                  const at::Tensor& value_cache, const at::Tensor& block_tables,
                                  const at::Tensor& context_lens, int64_t block_size,
                                  double scale, int64_t max_context_len) {
  return llmbench_ops::paged_decode_attention(q, key_cache, value_cache, block_tables,
                                              context_lens, block_size, scale, max_context_len,
                                              at::Tensor());
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(LLMBENCH_EXTENSION_NAMESPACE, m) {
  m.def(
      "paged_decode_attention(Tensor q, Tensor key_cache, Tensor value_cache, "
      "Tensor block_tables, Tensor context_lens, int block_size, float scale, "
      "int max_context_len) -> Tensor");
}

TORCH_LIBRARY_IMPL(LLMBENCH_EXTENSION_NAMESPACE, CPU, m) {
  m.impl("paged_decode_attention", &paged_decode_attention);
}
