// bfloat16 products of a few rows on Intel's AMX tiles (gemv_amx.cpp), for gemv.cpp.
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>
#include <vector>

namespace llmbench_amx {

// Whether this build has the AMX path and the OS lets this process use the tiles (asked once).
bool available();

// x [M, K] (rows x_row apart, K a multiple of 32) as the tiles' B operand, once a call:
// [chunk of 16 rows][chunk of 32 k][16 pairs of k][16 rows][2], zeros past row M.
std::vector<uint16_t> pack_rows(const uint16_t* x, int64_t x_row, int64_t M, int64_t K);

// What each 16 x 16 result becomes: y[m, n] = Σ + bias[n] + residual[m, n] (those given),
// rounded once to bfloat16; y [M, N] contiguous, residual rows res_row apart.
struct Epilogue {
  const c10::BFloat16* bias;
  const c10::BFloat16* residual;
  int64_t res_row;
  c10::BFloat16* y;
};

// y = x @ W^T (+ bias) (+ residual) for the rows of W [N, K] (contiguous, bfloat16) from
// n_begin to n_end (multiples of 16), x packed by pack_rows.
void gemm_bf16(const uint16_t* packed, const uint16_t* w, int64_t M, int64_t N, int64_t K,
               int64_t n_begin, int64_t n_end, const Epilogue& epilogue);

}  // namespace llmbench_amx
