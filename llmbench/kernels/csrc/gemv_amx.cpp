// bfloat16 products of a few rows (2 .. 64: verification rows, small batches) on Intel's AMX
// tiles, the weights as they are: out = x @ W^T computed as its transpose, W @ x^T, so that W
// is the A operand, loaded 16 rows × 32 k at a time straight from its [N, K] rows (no repacking
// per call, as oneDNN's matmul does: it streamed SmolLM2's weights at ~10 GB/s at 20 rows), and
// x^T is the B operand, repacked once a call into TDPBF16PS's pair layout:
//     B[p][2m + t] = x[m][k0 + 2p + t]     (16 pairs of k × 16 rows of x)
//     C[n][m] += Σ_k W[n][k0 + k] · x[m][k0 + k]   (float32)
// Two 16-row blocks of W at a time, each A tile used for two chunks of 16 rows of x: W is read
// from memory once for up to 32 rows, twice for 64. The tiles need the OS's permission
// (arch_prctl ARCH_REQ_XCOMP_PERM, once a process) and a tile configuration on every thread
// that uses them, loaded at the start of its share and released at the end.
#include "gemv_amx.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>

#include "simd.h"
#endif

namespace llmbench_amx {

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
namespace {

constexpr long kArchReqXcompPerm = 0x1023;  // arch_prctl: ask for an XSTATE feature
constexpr long kXfeatureXtiledata = 18;     // the tiles' data
constexpr int64_t kTileRows = 16;
constexpr int64_t kTileK = 32;  // bfloat16 elements of k in a tile row (64 bytes)

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
TileConfig full_tiles() {
  TileConfig c;
  for (int t = 0; t < 8; ++t) {
    c.rows[t] = kTileRows;
    c.colsb[t] = 64;
  }
  return c;
}

}  // namespace

bool available() {
  static const bool ok = syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  return ok;
}

std::vector<uint16_t> pack_rows(const uint16_t* x, int64_t x_row, int64_t M, int64_t K) {
  const int64_t chunks = K / kTileK, m_chunks = (M + kTileRows - 1) / kTileRows;
  std::vector<uint32_t> b(m_chunks * chunks * kTileRows * kTileRows, 0);  // a pair a dword
  for (int64_t i = 0; i < M; ++i) {
    const auto* row = reinterpret_cast<const uint32_t*>(x + i * x_row);  // k pairs
    uint32_t* dst = b.data() + (i / kTileRows) * chunks * kTileRows * kTileRows + i % kTileRows;
    for (int64_t c = 0; c < chunks; ++c)
      for (int64_t p = 0; p < kTileRows; ++p)
        dst[(c * kTileRows + p) * kTileRows] = row[c * kTileRows + p];
  }
  std::vector<uint16_t> out(b.size() * 2);
  std::memcpy(out.data(), b.data(), b.size() * sizeof(uint32_t));
  return out;
}

void gemm_bf16(const uint16_t* packed, const uint16_t* w, int64_t M, int64_t N, int64_t K,
               int64_t n_begin, int64_t n_end, const Epilogue& e) {
  const int64_t chunks = K / kTileK, m_chunks = (M + kTileRows - 1) / kTileRows;
  const int64_t b_tile = kTileRows * kTileRows * 2;  // uint16 elements of one B tile
  const TileConfig config = full_tiles();
  _tile_loadconfig(&config);
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
    for (int64_t mc = 0; mc < m_chunks; mc += 2) {
      const bool two_m = mc + 1 < m_chunks;
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t c = 0; c < chunks; ++c) {
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
  }
  _tile_release();
}
#else
bool available() { return false; }

std::vector<uint16_t> pack_rows(const uint16_t*, int64_t, int64_t, int64_t) { return {}; }

void gemm_bf16(const uint16_t*, const uint16_t*, int64_t, int64_t, int64_t, int64_t, int64_t,
               const Epilogue&) {}
#endif

}  // namespace llmbench_amx
