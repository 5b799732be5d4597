// bfloat16 products on Intel's AMX tiles (gemv_amx.cpp): a few rows of x against bfloat16 W,
// for gemv.cpp, and any number of rows against int8 or int4 W, for gemv_quant.cpp.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <vector>

#include "gemm_panels.h"

namespace llmbench_amx {

// Whether this build has the AMX path and the OS lets this process use the tiles (asked once).
bool available();

// Every tile 16 rows of 64 bytes on the calling thread, until release_tiles (for the tile
// products of prefill_attention.cpp).
void configure_tiles();
void release_tiles();

// x [M, K] (rows x_row apart, K a multiple of 32) as the tiles' B operand, once a call:
// [chunk of 16 rows][chunk of 32 k][16 pairs of k][16 rows][2], zeros past row M.
std::vector<uint16_t> pack_rows(const uint16_t* x, int64_t x_row, int64_t M, int64_t K);

using llmbench_gemm::Epilogue;
using llmbench_gemm::QuantWeights;

// y = x @ W^T (+ bias) (+ residual) for the rows of W [N, K] (contiguous, bfloat16) from
// n_begin to n_end (multiples of 16), x packed by pack_rows.
void gemm_bf16(const uint16_t* packed, const uint16_t* w, int64_t M, int64_t N, int64_t K,
               int64_t n_begin, int64_t n_end, const Epilogue& epilogue);

// y = x @ dequant(W)^T (+ bias) (+ residual) for W's row blocks block_begin .. block_end, with x
// [M, groups · 32] bfloat16 (rows x_row apart, readable up to M rounded up to 16 rows) and y
// [M, N]: each block's panel (gemm_panels.h) is dequantised once and meets every row of x.
void gemm_quant_bf16(const uint16_t* x, int64_t x_row, int64_t M, int64_t N,
                     const QuantWeights& w, int64_t block_begin, int64_t block_end,
                     const Epilogue& epilogue);

}  // namespace llmbench_amx
