// bfloat16 products on Intel's AMX tiles (TDPBF16PS: C[16][16] += A[16][32 k] · B[32 k][16],
// float32 sums), two kinds:
//
// gemm_bf16, bfloat16 W, a few rows of x (2 .. 64: verification rows, small batches): the
// weights as they are: out = x @ W^T computed as its transpose, W @ x^T, so that W is the A
// operand, loaded 16 rows × 32 k at a time straight from its [N, K] rows (no repacking per
// call, as oneDNN's matmul does: it streamed SmolLM2's weights at ~10 GB/s at 20 rows), and x^T
// is the B operand, repacked once a call into TDPBF16PS's pair layout:
//     B[p][2m + t] = x[m][k0 + 2p + t]     (16 pairs of k × 16 rows of x)
//     C[n][m] += Σ_k W[n][k0 + k] · x[m][k0 + k]   (float32)
// Two 16-row blocks of W at a time, each A tile used for two chunks of 16 rows of x: W is read
// from memory once for up to 32 rows, twice for 64.
//
// gemm_quant_bf16, int8 or int4 W, any number of rows of x (prefill): x is the A operand,
// straight from its rows, and W the B operand, dequantised one block of 16 rows at a time into
// gemm_panels.h's panel, which every row of x then meets (the per-call dequantise + oneDNN it
// replaces wrote a bfloat16 copy of every matrix for every prefill chunk).
//
// The tiles need the OS's permission (arch_prctl ARCH_REQ_XCOMP_PERM, once a process) and a
// tile configuration on every thread that uses them, loaded at the start of its share and
// released at the end.
#include "gemv_amx.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "simd.h"
#endif

namespace llmbench_amx {

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
namespace {

constexpr long kArchReqXcompPerm = 0x1023;  // arch_prctl: ask for an XSTATE feature
constexpr long kXfeatureXtiledata = 18;     // the tiles' data
constexpr int64_t kTileRows = 16;
constexpr int64_t kTileK = 32;  // bfloat16 elements of k in a tile row (64 bytes)
constexpr int64_t kTileElements = kTileRows * kTileK;  // bfloat16 elements of one tile

struct alignas(64) TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Every tile 16 rows of 64 bytes. tmm0 .. tmm3: C of two blocks of W × two chunks of 16 rows of
// x (float32); tmm4, tmm5: the blocks' A (16 n × 32 k); tmm6, tmm7: the chunks' B (16 pairs of
// k × 16 rows of x, zeros past the last row). One configuration for any number of rows.
TileConfig make_full_tiles() {
  TileConfig c;
  for (int t = 0; t < 8; ++t) {
    c.rows[t] = kTileRows;
    c.colsb[t] = 64;
  }
  return c;
}

// Loads that configuration on the calling thread. It lives in static memory: gcc does not see
// LDTILECFG read its operand, and dropped the stores to a local copy about to go out of scope
// (a function that only loaded it configured no tile: TILEZERO then raised SIGILL).
void configure_full_tiles() {
  static const TileConfig config = make_full_tiles();
  _tile_loadconfig(&config);
}

// The 2 × 2 result tiles of a step, tmm0 .. tmm3 (rows n0 and n0 + 16 of W × chunks mc and
// mc + 1 of x; tmm1 and tmm3 only when two_n, tmm2 and tmm3 only when two_m), each stored to
// `tile` and handed to finish(n, chunk).
template <typename Finish>
void finish_tiles(float* tile, int64_t n0, int64_t mc, bool two_n, bool two_m, Finish&& finish) {
  _tile_stored(0, tile, 64);
  finish(n0, mc);
  if (two_n) {
    _tile_stored(1, tile, 64);
    finish(n0 + kTileRows, mc);
  }
  if (two_m) {
    _tile_stored(2, tile, 64);
    finish(n0, mc + 1);
    if (two_n) {
      _tile_stored(3, tile, 64);
      finish(n0 + kTileRows, mc + 1);
    }
  }
}

}  // namespace

bool available() {
  static const bool ok = syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  return ok;
}

void configure_tiles() { configure_full_tiles(); }

void release_tiles() { _tile_release(); }

std::vector<uint16_t> pack_rows(const uint16_t* x, int64_t x_row, int64_t M, int64_t K) {
  const int64_t chunks = K / kTileK, m_chunks = (M + kTileRows - 1) / kTileRows;
  std::vector<uint16_t> out(m_chunks * chunks * kTileElements);
  for (int64_t mc = 0; mc < m_chunks; ++mc) {
    const int64_t rows = std::min(kTileRows, M - mc * kTileRows);
    const uint16_t* row[kTileRows];
    for (int64_t i = 0; i < rows; ++i) row[i] = x + (mc * kTileRows + i) * x_row;
    llmbench_simd::pack_pair_rows(row, rows, K, out.data() + mc * chunks * kTileElements);
  }
  return out;
}

void gemm_bf16(const uint16_t* packed, const uint16_t* w, int64_t M, int64_t N, int64_t K,
               int64_t n_begin, int64_t n_end, const Epilogue& e) {
  const int64_t chunks = K / kTileK, m_chunks = (M + kTileRows - 1) / kTileRows;
  const int64_t b_tile = kTileRows * kTileRows * 2;  // uint16 elements of one B tile
  configure_full_tiles();
  alignas(64) float tile[kTileRows * kTileRows];
  const __m512i column = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6,
                                                             5, 4, 3, 2, 1, 0),
                                            _mm512_set1_epi32(kTileRows));
  // A C tile [16 n][16 m] (in `tile`) → y rows m0 .. of columns n0 .. n0 + 15: each row of y
  // is a column of the tile, gathered, then bias, residual and one rounding.
  auto finish = [&](int64_t n0, int64_t mc) {
    const __m512 bias = e.bias ? llmbench_simd::load16(e.bias + n0) : _mm512_setzero_ps();
    for (int64_t i = 0; i < kTileRows && mc * kTileRows + i < M; ++i) {
      const int64_t m = mc * kTileRows + i;
      __m512 v = _mm512_add_ps(_mm512_i32gather_ps(column, tile + i, 4), bias);
      if (e.residual) v = _mm512_add_ps(v, llmbench_simd::load16(e.residual + m * e.res_row + n0));
      llmbench_simd::store16_masked(e.y + m * N + n0, v, 0xFFFF);
    }
  };
  for (int64_t n0 = n_begin; n0 < n_end; n0 += 2 * kTileRows) {
    const bool two_n = n0 + kTileRows < n_end;
    const uint16_t* w0 = w + n0 * K;
    const uint16_t* w1 = w0 + kTileRows * K;
    // Above 16 rows of x (two tiles of x a tile of W), the next step's rows of W are
    // prefetched a chunk of k at a time as this step loads its own: 32 rows through
    // [3072, 576] 189 → 164-168 µs; at 5 rows the hardware's prefetch alone was as fast.
    const uint16_t* next =
        m_chunks > 1 && n0 + 2 * kTileRows < n_end ? w + (n0 + 2 * kTileRows) * K : nullptr;
    const int64_t next_rows = std::min<int64_t>(2 * kTileRows, n_end - n0 - 2 * kTileRows);
    for (int64_t mc = 0; mc < m_chunks; mc += 2) {
      const bool two_m = mc + 1 < m_chunks;
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t c = 0; c < chunks; ++c) {
        if (mc == 0 && next != nullptr)
          for (int64_t r = 0; r < next_rows; ++r)
            _mm_prefetch(reinterpret_cast<const char*>(next + r * K + c * kTileK), _MM_HINT_T1);
        _tile_loadd(4, w0 + c * kTileK, 2 * K);
        _tile_loadd(6, packed + (mc * chunks + c) * b_tile, 64);
        _tile_dpbf16ps(0, 4, 6);
        if (two_n) {
          _tile_loadd(5, w1 + c * kTileK, 2 * K);
          _tile_dpbf16ps(1, 5, 6);
        }
        if (two_m) {
          _tile_loadd(7, packed + ((mc + 1) * chunks + c) * b_tile, 64);
          _tile_dpbf16ps(2, 4, 7);
          if (two_n) _tile_dpbf16ps(3, 5, 7);
        }
      }
      finish_tiles(tile, n0, mc, two_n, two_m, finish);
    }
  }
  _tile_release();
}

void gemm_quant_bf16(const uint16_t* x, int64_t x_row, int64_t M, int64_t N,
                     const QuantWeights& w, int64_t block_begin, int64_t block_end,
                     const Epilogue& e) {
  const int64_t chunks = w.groups, m_chunks = (M + kTileRows - 1) / kTileRows;
  configure_full_tiles();
  alignas(64) float tile[kTileRows * kTileRows];
  // A C tile [16 m][16 n] → rows m of y, columns n0 .. (those < N).
  auto finish = [&](int64_t n0, int64_t mc) {
    const __mmask16 valid = llmbench_gemm::valid_columns(N, n0);
    for (int64_t i = 0; i < kTileRows && mc * kTileRows + i < M; ++i)
      llmbench_gemm::finish_row(e, N, mc * kTileRows + i, n0, valid,
                                _mm512_load_ps(tile + i * kTileRows));
  };
  auto fill = [&](int64_t b, uint16_t* panel) { llmbench_gemm::quant_panel(w, b, panel); };
  // Blocks b (and b + 1 when two_n), panels p0 and p1, against chunks mc_begin .. mc_end of x.
  auto multiply = [&](int64_t b, bool two_n, const uint16_t* p0, const uint16_t* p1,
                      int64_t mc_begin, int64_t mc_end) {
    const int64_t n0 = b * kTileRows;
    for (int64_t mc = mc_begin; mc < mc_end; mc += 2) {
      const bool two_m = mc + 1 < mc_end;
      const uint16_t* x0 = x + mc * kTileRows * x_row;
      const uint16_t* x1 = x0 + kTileRows * x_row;
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t c = 0; c < chunks; ++c) {  // tmm4, 5: x's A; tmm6, 7: the panels' B
        _tile_loadd(4, x0 + c * kTileK, 2 * x_row);
        _tile_loadd(6, p0 + c * kTileElements, 64);
        _tile_dpbf16ps(0, 4, 6);
        if (two_n) {
          _tile_loadd(7, p1 + c * kTileElements, 64);
          _tile_dpbf16ps(1, 4, 7);
        }
        if (two_m) {
          _tile_loadd(5, x1 + c * kTileK, 2 * x_row);
          _tile_dpbf16ps(2, 5, 6);
          if (two_n) _tile_dpbf16ps(3, 5, 7);
        }
      }
      finish_tiles(tile, n0, mc, two_n, two_m, finish);
    }
  };
  llmbench_gemm::over_panels(chunks * kTileElements, m_chunks, block_begin, block_end, fill,
                             multiply);
  _tile_release();
}
#else
bool available() { return false; }

void configure_tiles() {}

void release_tiles() {}

std::vector<uint16_t> pack_rows(const uint16_t*, int64_t, int64_t, int64_t) { return {}; }

void gemm_bf16(const uint16_t*, const uint16_t*, int64_t, int64_t, int64_t, int64_t, int64_t,
               const Epilogue&) {}

void gemm_quant_bf16(const uint16_t*, int64_t, int64_t, int64_t, const QuantWeights&, int64_t,
                     int64_t, const Epilogue&) {}
#endif

}  // namespace llmbench_amx
