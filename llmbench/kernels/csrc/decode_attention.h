// Paged decode attention's problem (decode_attention.cpp) as its two product paths see it: the
// vector path there, and the tile path for several rows of one sequence
// (decode_attention_tiles.cpp).
#pragma once

#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

namespace llmbench_decode_attention {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct AttentionProblem {
  int64_t batch, num_heads, num_kv_heads, head_dim, block_size, max_blocks;
  int64_t q_row, q_head, k_slot, v_slot;  // strides in elements
  const int32_t* block_tables;
  const int32_t* context_lens;
  float scale;
};

// Rows [first, first + count) of one sequence; `len` the longest of their contexts.
struct RowRun {
  int64_t first, count, len;
};

// The slots of positions p0 .. p1 − 1 of a sequence, in order (one table lookup per block).
inline void slots_of(const int32_t* table, int64_t block_size, int64_t p0, int64_t p1,
                     int64_t* slots) {
  for (int64_t p = p0; p < p1;) {
    const int64_t block = p / block_size;
    const int64_t base = static_cast<int64_t>(table[block]) * block_size - block * block_size;
    const int64_t end = std::min(p1, (block + 1) * block_size);
    for (; p < end; ++p) slots[p - p0] = base + p;
  }
}

// An item's (row, query head) states, state i·nh + h for row first + i and query head h:
// running max m (natural log: the weights are e^(scale·q·k − m)), running sum l of the
// weights, and accumulator [d] of the weighed values.
struct States {
  std::vector<float> m, l, acc;
  void reset(int64_t n, int64_t d) {
    m.assign(n, kNegInf);
    l.assign(n, 0.0f);
    acc.assign(n * d, 0.0f);
  }
};

// Whether the tile path takes a run: several rows of one sequence (speculative verification's
// k + 1), a bfloat16 cache, head_dim 32 or 64, and AMX tiles this build and OS can use.
bool tiles_take(const AttentionProblem& a, const RowRun& run, bool bfloat16);

// Rows `run` over positions [p0, p1) of every KV head on the tiles, into st (reset by the
// caller). The calling thread has configured the tiles (llmbench_amx::configure_tiles).
void attend_on_tiles(const AttentionProblem& a, const c10::BFloat16* q, const c10::BFloat16* kc,
                     const c10::BFloat16* vc, const RowRun& run, int64_t p0, int64_t p1,
                     States& st);

}  // namespace llmbench_decode_attention
