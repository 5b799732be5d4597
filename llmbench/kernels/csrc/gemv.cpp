// Decode-shaped matrix products on the CPU: y[M, N] = x[M, K] @ W[N, K]^T (+ bias[N])
// (+ residual[M, N]) for bfloat16, float16 or float32 weights, float32 accumulation, y in x's
// dtype (rounded once, after the adds).
//
// Built for small M (decode: 1-4 rows per call) where the product is bound by reading W once:
// each thread streams its own contiguous block of W's rows, R = 4 rows at a time (AVX2: one at
// a time up to K = 1024), and applies each loaded chunk of W to every row of x (x stays in L1).
// With M > 4 the rows of x are taken 4 at a time over the same rows of W, which are then still
// in L1: W is read from memory once whatever M is.
//
// One source, compiled for the best instruction set the building machine has (the Python side
// picks the flags from /proc/cpuinfo):
//   __AVX512BF16__       bf16: VDPBF16PS on 32 bf16 pairs per instruction (x is bf16 already);
//                         f16: 16 halves -> float32 (VCVTPH2PS), FMA
//   __AVX512F__          bf16 -> float32 by a 16-bit shift, f16 by VCVTPH2PS; 16-wide FMA
//   AVX2 + F16C + FMA    8-wide FMA; bf16 read 16 at a time, split into even and odd elements
//                         by a shift and a mask (x split alike once a call): gemv_rows
//   otherwise            scalar loops
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <cstdint>
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "gemm_panels.h"
#include "gemv_amx.h"
#include "ops.h"
#include "simd.h"

#ifndef LLMBENCH_EXTENSION_NAMESPACE
#define LLMBENCH_EXTENSION_NAMESPACE llmbench_cpu_ext
#endif

namespace {

#ifndef LLMBENCH_GEMV_ROWS
#define LLMBENCH_GEMV_ROWS 4
#endif
#ifndef LLMBENCH_GEMV_PREFETCH
#define LLMBENCH_GEMV_PREFETCH 1
#endif
constexpr int kRows = LLMBENCH_GEMV_ROWS;  // rows of W per inner step (R)
constexpr int kMaxM = 4;    // rows of x per inner step

#if defined(__AVX512BF16__)
constexpr const char* kIsa = "avx512bf16";
#elif defined(__AVX512F__)
constexpr const char* kIsa = "avx512";
#elif defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
constexpr const char* kIsa = "avx2";
#else
constexpr const char* kIsa = "scalar";
#endif

#if defined(__AVX512F__)
// acc[m][r] = the sum of a[m][r]'s lanes: one lane-sum tree for up to 16 vectors (31 shuffles
// and adds, where 16 separate reductions take ~128: at 4 rows of x as long as the products).
template <int NM, int NR>
inline void store_sums(const __m512 a[][NR], float acc[kMaxM][kRows]) {
  static_assert(NM * NR <= 16, "one tree sums at most 16 vectors");
  __m512 v[16];
  for (int i = 0; i < 16; ++i) v[i] = i < NM * NR ? a[i / NR][i % NR] : _mm512_setzero_ps();
  alignas(64) float sums[16];
  _mm512_store_ps(sums, llmbench_simd::sum_lanes_16(v));
  for (int m = 0; m < NM; ++m)
    for (int r = 0; r < NR; ++r) acc[m][r] = sums[m * NR + r];
}
#endif

// The element type of x, W, bias, residual and y (one for all).
enum Kind { kBF16, kF16, kF32 };

inline float to_float(const void* base, int64_t i, Kind kind) {
  if (kind == kF32) return static_cast<const float*>(base)[i];
  const uint16_t bits = static_cast<const uint16_t*>(base)[i];
  if (kind == kBF16) {
    uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  }
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}

inline void store(void* base, int64_t i, float v, Kind kind) {
  if (kind == kF32) static_cast<float*>(base)[i] = v;
  else static_cast<uint16_t*>(base)[i] = kind == kBF16 ? c10::BFloat16(v).x : c10::Half(v).x;
}

inline int64_t elem_bytes(Kind kind) { return kind == kF32 ? 4 : 2; }

// Sums acc[m][r] = x[m, :] . W[n0 + r, :] for NM rows of x and NR rows of W (of KIND).
// xf: x as float32 [M, K] (every path but VDPBF16PS reads x converted once).
template <int NM, int NR, Kind KIND>
void dot_rows_float(const float* xf, int64_t K, const void* wv_base, float acc[kMaxM][kRows]) {
  int64_t k = 0;
#if defined(__AVX512F__)
  const uint16_t* w = static_cast<const uint16_t*>(wv_base);
  const float* wf = static_cast<const float*>(wv_base);
  __m512 a[NM][NR];
  for (int m = 0; m < NM; ++m)
    for (int r = 0; r < NR; ++r) a[m][r] = _mm512_setzero_ps();
  for (; k + 16 <= K; k += 16) {
    __m512 wv[NR];
    for (int r = 0; r < NR; ++r) {
      if (KIND == kF32) {
        // the same offset in the next block of rows: 4 rows x K x 4 bytes ahead
        if (LLMBENCH_GEMV_PREFETCH)
          _mm_prefetch(reinterpret_cast<const char*>(wf + (r + NR) * K + k), _MM_HINT_T0);
        wv[r] = _mm512_loadu_ps(wf + r * K + k);
      } else {
        __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + r * K + k));
        wv[r] = KIND == kBF16 ? llmbench_simd::bf16_to_float(raw) : _mm512_cvtph_ps(raw);
      }
    }
    for (int m = 0; m < NM; ++m) {
      __m512 xv = _mm512_loadu_ps(xf + m * K + k);
      for (int r = 0; r < NR; ++r) a[m][r] = _mm512_fmadd_ps(wv[r], xv, a[m][r]);
    }
  }
  store_sums<NM, NR>(a, acc);
#else
  for (int m = 0; m < NM; ++m)
    for (int r = 0; r < NR; ++r) acc[m][r] = 0.0f;
#endif
  for (; k < K; ++k) {  // the tail (everything on the scalar path)
    for (int r = 0; r < NR; ++r) {
      float wk = to_float(wv_base, r * K + k, KIND);
      for (int m = 0; m < NM; ++m) acc[m][r] += wk * xf[m * K + k];
    }
  }
}

#if defined(__AVX512BF16__)
// The same sums for bfloat16 x and W with VDPBF16PS: 32 products per instruction, pairs summed
// in float32. The tail (K % 32) is a masked load: zeros add nothing.
template <int NM, int NR>
void dot_rows_bf16(const uint16_t* x, int64_t x_row, int64_t K, const uint16_t* w,
                   float acc[kMaxM][kRows]) {
  __m512 a[NM][NR];
  for (int m = 0; m < NM; ++m)
    for (int r = 0; r < NR; ++r) a[m][r] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 32) {
    const int64_t left = K - k;
    const __mmask32 mask = left >= 32 ? ~__mmask32(0) : ((__mmask32(1) << left) - 1);
    __m512bh wv[NR];
    for (int r = 0; r < NR; ++r) {
      // the same offset two blocks of rows on (8 rows x K x 2 bytes ahead), into L2: into L1
      // one block ahead (as float32 W is), the misses in flight were too few, and a SmolLM2
      // decode step's layers took 7.9-8.1 against 7.1-7.5 ms (float32: no difference)
      if (LLMBENCH_GEMV_PREFETCH)
        _mm_prefetch(reinterpret_cast<const char*>(w + (r + 2 * NR) * K + k), _MM_HINT_T1);
      wv[r] = (__m512bh)_mm512_maskz_loadu_epi16(mask, w + r * K + k);
    }
    for (int m = 0; m < NM; ++m) {
      __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(mask, x + m * x_row + k);
      for (int r = 0; r < NR; ++r) a[m][r] = _mm512_dpbf16_ps(a[m][r], xv, wv[r]);
    }
  }
  store_sums<NM, NR>(a, acc);
}
#endif

struct Problem {
  const void* x;       // [M, K], row stride x_row
  int64_t x_row;
  const float* xf;     // x as float32 [M, K] (nullptr on the VDPBF16PS path)
  const void* w;       // [N, K] contiguous
  const void* bias;      // [N] or nullptr
  const void* residual;  // [M, N], row stride res_row, or nullptr
  int64_t res_row;
  void* y;             // [M, N] contiguous
  int64_t M, N, K;
  Kind kind;
  bool use_dpbf16;
};

// y[m, n] = v (+ bias[n]) (+ residual[m, n]), rounded once to y's dtype.
inline void finish(const Problem& p, int64_t m, int64_t n, float v) {
  if (p.bias) v += to_float(p.bias, n, p.kind);
  if (p.residual) v += to_float(p.residual, m * p.res_row + n, p.kind);
  store(p.y, m * p.N + n, v, p.kind);
}

// Elements a step of the AVX2 row loops (gemv_rows): 32 bytes of bfloat16, 8 pairs.
constexpr int64_t kSplit = 16;

// x [M, K] as float32, converted once a call, not once per row of W. split_pairs (the AVX2 row
// loops' bfloat16 W): each 16 elements as their 8 even then their 8 odd, the tail past the last
// 16 as it is.
std::vector<float> x_as_float(const Problem& p, bool split_pairs) {
  const int64_t M = p.M, K = p.K, whole = split_pairs ? K / kSplit * kSplit : 0;
  std::vector<float> xf(M * K);
  for (int64_t m = 0; m < M; ++m) {
    float* row = xf.data() + m * K;
    for (int64_t k = 0; k < K; ++k) {
      const int64_t at =
          k < whole ? k / kSplit * kSplit + (k % 2) * (kSplit / 2) + (k % kSplit) / 2 : k;
      row[at] = to_float(p.x, m * p.x_row + k, p.kind);
    }
  }
  return xf;
}

template <int NM, int NR>
void block(const Problem& p, int64_t n0, int64_t m0) {
  float acc[kMaxM][kRows];
  const char* w = static_cast<const char*>(p.w) + n0 * p.K * elem_bytes(p.kind);
  const float* xf = p.xf ? p.xf + m0 * p.K : nullptr;
#if defined(__AVX512BF16__)
  if (p.use_dpbf16) {
    const uint16_t* x = static_cast<const uint16_t*>(p.x) + m0 * p.x_row;
    dot_rows_bf16<NM, NR>(x, p.x_row, p.K, reinterpret_cast<const uint16_t*>(w), acc);
  } else
#endif
  if (p.kind == kF32) {
    dot_rows_float<NM, NR, kF32>(xf, p.K, w, acc);
  } else if (p.kind == kBF16) {
    dot_rows_float<NM, NR, kBF16>(xf, p.K, w, acc);
  } else {
    dot_rows_float<NM, NR, kF16>(xf, p.K, w, acc);
  }
  for (int m = 0; m < NM; ++m)
    for (int r = 0; r < NR; ++r) finish(p, m0 + m, n0 + r, acc[m][r]);
}

template <int NR>
void rows_of_w(const Problem& p, int64_t n0) {
  for (int64_t m0 = 0; m0 < p.M; m0 += kMaxM) {
    switch (std::min<int64_t>(kMaxM, p.M - m0)) {
      case 1: block<1, NR>(p, n0, m0); break;
      case 2: block<2, NR>(p, n0, m0); break;
      case 3: block<3, NR>(p, n0, m0); break;
      default: block<4, NR>(p, n0, m0); break;
    }
  }
}

// The bfloat16 products of several rows on 16-row blocks of W (the tiles', the panels'): what
// each result becomes (bias, residual, one rounding into y), and how many pairs of blocks a
// task takes (at least ~64 KiB of W).
inline llmbench_gemm::Epilogue bf16_epilogue(const Problem& p) {
  return {static_cast<const c10::BFloat16*>(p.bias), static_cast<const c10::BFloat16*>(p.residual),
          p.res_row, static_cast<c10::BFloat16*>(p.y)};
}
inline int64_t pairs_per_task(int64_t K) {
  return std::max<int64_t>(1, (64 * 1024) / (32 * K * 2));
}

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
// From this many rows of x a bfloat16 product runs on the AMX tiles (gemv_amx.cpp): below, the
// VDPBF16PS loops above already stream W at the memory's speed; above, they are bound by their
// products (4 rows of x a pass) where one tile product does 16 × 16 × 32.
constexpr int64_t kAmxMinRows = 2;

// y = x @ W^T (+ bias) (+ residual) for bfloat16 on the tiles: x packed once, each thread's
// share of W's 16-row blocks (bias, residual and one rounding as each result tile is done);
// the rows past the last whole block through the loops above.
at::Tensor gemv_amx(const Problem& p, at::Tensor y) {
  const int64_t K = p.K, whole = p.N / 16 * 16;
  const std::vector<uint16_t> packed =
      llmbench_amx::pack_rows(static_cast<const uint16_t*>(p.x), p.x_row, p.M, K);
  const llmbench_gemm::Epilogue epilogue = bf16_epilogue(p);
  const int64_t pairs = (whole / 16 + 1) / 2;  // two 16-row blocks share each tile of x
  at::parallel_for(0, pairs, pairs_per_task(K), [&](int64_t begin, int64_t end) {
    llmbench_amx::gemm_bf16(packed.data(), static_cast<const uint16_t*>(p.w), p.M, p.N, K,
                            begin * 32, std::min(end * 32, whole), epilogue);
  });
  for (int64_t n = whole; n < p.N; ++n) rows_of_w<1>(p, n);
  return y;
}
#endif

#if defined(__AVX512BF16__)
// From this many rows of x a bfloat16 product without the tiles runs on gemm_vectors.cpp's
// panels: each block of 16 rows of W transposed once a call into VDPBF16PS's pair layout, one
// row of W a lane, so that a pass over 14 rows of x needs no lane sums. Below, the loops above
// (4 rows of x a pass, a tree of lane sums each) read W at the memory's speed anyway.
constexpr int64_t kPanelMinRows = 16;

// y = x @ W^T (+ bias) (+ residual) for bfloat16 on the panels, each thread's share of W's
// 16-row blocks two at a time.
at::Tensor gemv_panels(const Problem& p, at::Tensor y) {
  const llmbench_gemm::Epilogue epilogue = bf16_epilogue(p);
  const int64_t blocks = (p.N + 15) / 16, pairs = (blocks + 1) / 2;
  at::parallel_for(0, pairs, pairs_per_task(p.K), [&](int64_t begin, int64_t end) {
    llmbench_gemm::gemm_bf16_vectors(static_cast<const uint16_t*>(p.x), p.x_row, p.M, p.N, p.K,
                                     static_cast<const uint16_t*>(p.w), 2 * begin,
                                     std::min(2 * end, blocks), epilogue);
  });
  return y;
}
#endif

#if !defined(__AVX512BF16__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
// From this many rows of x a bfloat16 product without bfloat16 products (AVX2) runs on
// gemm_float32_panels.cpp's panels: each block of 16 rows of W widened and transposed once a
// call, met by 6 rows of x at a time on FMAs. SmolLM2's 120 matrices from memory (AMD EPYC,
// Zen 3), ms a pass, loops → panels: 8 rows 25 → 33, 16 rows 44 → 48, 32 rows 85 → 78, 64 rows
// 171 → 142 (warm, gate_up alone: 70 → 100 GFLOP/s at 64 rows).
constexpr int64_t kFloat32PanelMinRows = 16;
inline bool on_float32_panels(const Problem& p) {
  return p.kind == kBF16 && p.M >= kFloat32PanelMinRows && p.K % 8 == 0;
}

// y = x @ W^T (+ bias) (+ residual) for bfloat16 on float32 panels (x already float32: p.xf),
// each thread's share of W's 16-row blocks two at a time.
at::Tensor gemv_float32_panels(const Problem& p, at::Tensor y) {
  const llmbench_gemm::Epilogue epilogue = bf16_epilogue(p);
  const int64_t blocks = (p.N + 15) / 16, pairs = (blocks + 1) / 2;
  at::parallel_for(0, pairs, pairs_per_task(p.K), [&](int64_t begin, int64_t end) {
    llmbench_gemm::gemm_bf16_float32_panels(p.xf, p.K, p.M, p.N, p.K,
                                            static_cast<const uint16_t*>(p.w), 2 * begin,
                                            std::min(2 * end, blocks), epilogue);
  });
  return y;
}
#endif

#if defined(LLMBENCH_AVX2)
// Below the panels, an AVX2 build reads W one row at a time, each thread its contiguous share
// of rows: a single sequential stream the hardware prefetcher follows (a 16-bit row's next one
// prefetched too: dot_row), where 4 rows at a time (below) are 4 short streams that needed
// software prefetches. A bfloat16 row is read 16 elements a load and widened by a shift (the
// even elements) and a mask (the odd ones), so x comes split the same way: within each 16
// elements, its 8 even then its 8 odd (the tail past the last 16 as it is). A plain 2-thread
// read of 256 MB of bfloat16 rows of 576 (AMD EPYC, Zen 3): 4 rows, prefetched, widened by
// VPMOVZXWD 18-21 GB/s; one row, widened in place, 24-28. Longer rows than this go kRows at a
// time, prefetched: at K = 1536 one row at a time read 23.5 GB/s, 4 rows 26.7 (the same plain
// read, median of 21).
constexpr int64_t kOneRowMaxK = 1024;

// The 16 elements of W at w as two float32 vectors matching x_as_float's order.
template <Kind KIND>
inline void load16(const void* w, int64_t k, __m256& lo, __m256& hi) {
  if (KIND == kF32) {
    const float* f = static_cast<const float*>(w) + k;
    lo = _mm256_loadu_ps(f);
    hi = _mm256_loadu_ps(f + 8);
  } else if (KIND == kF16) {
    const __m128i* h = reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(w) + k);
    lo = _mm256_cvtph_ps(_mm_loadu_si128(h));
    hi = _mm256_cvtph_ps(_mm_loadu_si128(h + 1));
  } else {
    const __m256i raw =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(w) + k));
    lo = _mm256_castsi256_ps(_mm256_slli_epi32(raw, 16));
    hi = _mm256_castsi256_ps(_mm256_and_si256(raw, _mm256_set1_epi32(int(0xFFFF0000u))));
  }
}

// acc[m] = x[m, :] . W row for NM rows of x (xs: x_as_float's layout), 2·U sums a row of x
// (U = 2 for 1-2 rows: enough FMAs in flight when the row is in cache). A 16-bit row's next
// row is prefetched a step at a time, as far ahead as the row is long. AMD EPYC (Zen 3), 2
// threads, SmolLM2's bfloat16 matrices from memory, a pass over all of them against no
// prefetch (41 interleaved passes, medians, 3 sittings): 0.87-1.01 of the time at 1 row of x,
// 0.88-0.90 at 2, 0.94-0.97 at 4; 512 bytes ahead 0.96-1.01, 2 KiB 1.00, 4 KiB 1.07 (at 1
// row); float32 rows (2.3 KB) 1.02-1.05, so not them.
template <int NM, Kind KIND>
void dot_row(const float* xs, int64_t K, const void* w, float acc[kMaxM]) {
  constexpr int U = NM <= 2 ? 2 : 1;
  const char* next_row = static_cast<const char*>(w) + K * elem_bytes(KIND);
  __m256 a[NM][2 * U];
  for (int m = 0; m < NM; ++m)
    for (int i = 0; i < 2 * U; ++i) a[m][i] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + kSplit * U <= K; k += kSplit * U) {
    if (KIND != kF32) _mm_prefetch(next_row + k * elem_bytes(KIND), _MM_HINT_T0);
    for (int u = 0; u < U; ++u) {
      __m256 lo, hi;
      load16<KIND>(w, k + kSplit * u, lo, hi);
      for (int m = 0; m < NM; ++m) {
        const float* x = xs + m * K + k + kSplit * u;
        a[m][2 * u] = _mm256_fmadd_ps(lo, _mm256_loadu_ps(x), a[m][2 * u]);
        a[m][2 * u + 1] = _mm256_fmadd_ps(hi, _mm256_loadu_ps(x + 8), a[m][2 * u + 1]);
      }
    }
  }
  for (; k + kSplit <= K; k += kSplit) {  // U = 2 with one step of 16 left
    __m256 lo, hi;
    load16<KIND>(w, k, lo, hi);
    for (int m = 0; m < NM; ++m) {
      const float* x = xs + m * K + k;
      a[m][0] = _mm256_fmadd_ps(lo, _mm256_loadu_ps(x), a[m][0]);
      a[m][1] = _mm256_fmadd_ps(hi, _mm256_loadu_ps(x + 8), a[m][1]);
    }
  }
  for (int m = 0; m < NM; ++m) {
    __m256 sum = a[m][0];
    for (int i = 1; i < 2 * U; ++i) sum = _mm256_add_ps(sum, a[m][i]);
    acc[m] = llmbench_simd::sum8(sum);
  }
  for (; k < K; ++k) {  // the tail, x in its own order
    const float wk = to_float(w, k, KIND);
    for (int m = 0; m < NM; ++m) acc[m] += wk * xs[m * K + k];
  }
}

// acc[m][r] = x[m, :] . W[r, :] for NM rows of x and kRows rows of W at w (each step's loads
// of the next rows two blocks ahead prefetched into L2), one sum per pair (m, r).
template <int NM, Kind KIND>
void dot_rows4(const float* xs, int64_t K, const void* w, float acc[kMaxM][kRows]) {
  const int64_t row_bytes = K * elem_bytes(KIND);
  const char* base = static_cast<const char*>(w);
  __m256 a[NM][kRows];
  for (int m = 0; m < NM; ++m)
    for (int r = 0; r < kRows; ++r) a[m][r] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + kSplit <= K; k += kSplit) {
    for (int r = 0; r < kRows; ++r) {
      const char* row = base + r * row_bytes;
      if (LLMBENCH_GEMV_PREFETCH)
        _mm_prefetch(row + 2 * kRows * row_bytes + k * elem_bytes(KIND), _MM_HINT_T1);
      __m256 lo, hi;
      load16<KIND>(row, k, lo, hi);
      for (int m = 0; m < NM; ++m) {
        const float* x = xs + m * K + k;
        a[m][r] = _mm256_fmadd_ps(lo, _mm256_loadu_ps(x), a[m][r]);
        a[m][r] = _mm256_fmadd_ps(hi, _mm256_loadu_ps(x + 8), a[m][r]);
      }
    }
  }
  for (int m = 0; m < NM; ++m)
    for (int r = 0; r < kRows; ++r) acc[m][r] = llmbench_simd::sum8(a[m][r]);
  for (; k < K; ++k)  // the tail, x in its own order
    for (int r = 0; r < kRows; ++r) {
      const float wk = to_float(base + r * row_bytes, k, KIND);
      for (int m = 0; m < NM; ++m) acc[m][r] += wk * xs[m * K + k];
    }
}

// Rows [begin, end) of W, one at a time (ROWS = 1) or kRows at a time, each against every row
// of x, kMaxM rows of x at a time (W's rows are in L1 after the first).
template <int ROWS, Kind KIND>
void rows_of_w_split(const Problem& p, const float* xs, int64_t begin, int64_t end) {
  const int64_t row_bytes = p.K * elem_bytes(KIND);
  float acc[kMaxM][kRows];
  float one[kMaxM];
  int64_t n = begin;
  for (; n + ROWS <= end; n += ROWS) {
    const void* w = static_cast<const char*>(p.w) + n * row_bytes;
    for (int64_t m0 = 0; m0 < p.M; m0 += kMaxM) {
      const int64_t nm = std::min<int64_t>(kMaxM, p.M - m0);
      const float* x = xs + m0 * p.K;
      if constexpr (ROWS == 1) {
        if (nm == 1) dot_row<1, KIND>(x, p.K, w, one);
        else if (nm == 2) dot_row<2, KIND>(x, p.K, w, one);
        else if (nm == 3) dot_row<3, KIND>(x, p.K, w, one);
        else dot_row<4, KIND>(x, p.K, w, one);
        for (int64_t m = 0; m < nm; ++m) finish(p, m0 + m, n, one[m]);
      } else {
        if (nm == 1) dot_rows4<1, KIND>(x, p.K, w, acc);
        else if (nm == 2) dot_rows4<2, KIND>(x, p.K, w, acc);
        else if (nm == 3) dot_rows4<3, KIND>(x, p.K, w, acc);
        else dot_rows4<4, KIND>(x, p.K, w, acc);
        for (int64_t m = 0; m < nm; ++m)
          for (int r = 0; r < ROWS; ++r) finish(p, m0 + m, n + r, acc[m][r]);
      }
    }
  }
  if (n < end) rows_of_w_split<1, KIND>(p, xs, n, end);  // the last rows of a 4-row share
}

template <Kind KIND>
void share_of_rows(const Problem& p, const float* xs, int64_t begin, int64_t end) {
  if (p.K <= kOneRowMaxK) rows_of_w_split<1, KIND>(p, xs, begin, end);
  else rows_of_w_split<kRows, KIND>(p, xs, begin, end);
}

// y = x @ W^T (+ bias) (+ residual) below the panels; each thread streams one contiguous block
// of rows (at least ~64 KiB of W: a smaller matrix runs on the calling thread).
at::Tensor gemv_rows(const Problem& p, at::Tensor y) {
  const std::vector<float> xs = x_as_float(p, p.kind == kBF16);
  const int64_t per_task = std::max<int64_t>(1, (64 * 1024) / (p.K * elem_bytes(p.kind)));
  at::parallel_for(0, p.N, per_task, [&](int64_t begin, int64_t end) {
    if (p.kind == kBF16) share_of_rows<kBF16>(p, xs.data(), begin, end);
    else if (p.kind == kF16) share_of_rows<kF16>(p, xs.data(), begin, end);
    else share_of_rows<kF32>(p, xs.data(), begin, end);
  });
  return y;
}
#endif

std::string isa() { return kIsa; }

}  // namespace

at::Tensor llmbench_ops::gemv(const at::Tensor& x, const at::Tensor& weight,
                              const OptTensor& bias, const OptTensor& residual, at::Tensor y) {
  TORCH_CHECK(x.device().is_cpu() && weight.device().is_cpu(), "gemv: CPU tensors only");
  const at::ScalarType dtype = weight.scalar_type();
  TORCH_CHECK(dtype == at::kBFloat16 || dtype == at::kHalf || dtype == at::kFloat,
              "gemv: weight must be bfloat16, float16 or float32, got ", dtype);
  TORCH_CHECK(x.scalar_type() == dtype, "gemv: x dtype ", x.scalar_type(),
              " must match the weight's ", dtype);
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1),
              "gemv: want x [M, K] and weight [N, K]");
  TORCH_CHECK(weight.is_contiguous(), "gemv: weight must be contiguous [N, K]");
  TORCH_CHECK(x.stride(1) == 1, "gemv: x rows must be contiguous");
  const int64_t M = x.size(0), K = x.size(1), N = weight.size(0);
  const Kind kind = dtype == at::kFloat ? kF32 : dtype == at::kBFloat16 ? kBF16 : kF16;
  if (bias) {
    TORCH_CHECK(bias->scalar_type() == x.scalar_type() && bias->dim() == 1 &&
                    bias->size(0) == N && bias->is_contiguous(),
                "gemv: bias must be a contiguous [N] vector in x's dtype");
  }
  if (residual) {
    TORCH_CHECK(residual->scalar_type() == x.scalar_type() && residual->dim() == 2 &&
                    residual->size(0) == M && residual->size(1) == N && residual->stride(1) == 1,
                "gemv: residual must be [M, N] in x's dtype with contiguous rows");
  }
  y = output("gemv", y, {M, N}, x);
  if (M == 0 || N == 0) return y;

  Problem p;
  p.x = x.data_ptr();
  p.x_row = x.stride(0);
  p.w = weight.data_ptr();
  p.bias = bias ? bias->data_ptr() : nullptr;
  p.residual = residual ? residual->data_ptr() : nullptr;
  p.res_row = residual ? residual->stride(0) : 0;
  p.y = y.data_ptr();
  p.M = M;
  p.N = N;
  p.K = K;
  p.kind = kind;
#if defined(__AVX512BF16__)
  p.use_dpbf16 = kind == kBF16;
#else
  p.use_dpbf16 = false;
#endif
#if defined(LLMBENCH_AVX2)
  if (!on_float32_panels(p)) return gemv_rows(p, y);
#endif
  std::vector<float> xf;
  p.xf = nullptr;
  if (kind == kF32 && p.x_row == K) {  // already float32 [M, K]
    p.xf = static_cast<const float*>(p.x);
  } else if (!p.use_dpbf16) {
    xf = x_as_float(p, false);
    p.xf = xf.data();
  }
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
  if (kind == kBF16 && M >= kAmxMinRows && K % 32 == 0 && N >= 32 && llmbench_amx::available())
    return gemv_amx(p, y);
#endif
#if defined(__AVX512BF16__)
  if (kind == kBF16 && M >= kPanelMinRows && K % 32 == 0 && !llmbench_amx::available())
    return gemv_panels(p, y);
#endif
#if !defined(__AVX512BF16__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
  if (on_float32_panels(p)) return gemv_float32_panels(p, y);
#endif
  const int64_t num_groups = N / kRows;
  // Each thread streams one contiguous block of rows (at least ~64 KiB of W: a smaller matrix
  // runs on the calling thread). Measured here, handing out 64 KiB tasks dynamically instead
  // was as fast on a quiet machine and up to 3x slower in whole decode steps on a busy one.
  const int64_t per_task = std::max<int64_t>(1, (64 * 1024) / (kRows * K * elem_bytes(kind)));
  at::parallel_for(0, num_groups, per_task, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) rows_of_w<kRows>(p, g * kRows);
  });
  for (int64_t n = num_groups * kRows; n < N; ++n) rows_of_w<1>(p, n);
  return y;
}

namespace {

at::Tensor gemv(const at::Tensor& x, const at::Tensor& weight,
                const llmbench_ops::OptTensor& bias, const llmbench_ops::OptTensor& residual) {
  return llmbench_ops::gemv(x, weight, bias, residual, at::Tensor());
}

}  // namespace

TORCH_LIBRARY(LLMBENCH_EXTENSION_NAMESPACE, m) {
  m.def("gemv(Tensor x, Tensor weight, Tensor? bias, Tensor? residual) -> Tensor");
  m.def("isa() -> str", &isa);
}

TORCH_LIBRARY_IMPL(LLMBENCH_EXTENSION_NAMESPACE, CPU, m) { m.impl("gemv", &gemv); }
