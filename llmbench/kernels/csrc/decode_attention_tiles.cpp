// Paged decode attention for several query rows of one sequence — speculative verification's
// k + 1 rows, row i seeing its own context — on Intel's AMX tiles. The vector path
// (decode_attention.cpp) reads each key and value once for all the rows, but its products grow
// with them: 5 rows × 3 query heads of SmolLM2 made a layer's attention 79 µs against one row's
// 33 (a 600-token context), the largest part of a verify step's cost over a decode step's.
//
// The rows' (row, query head) pairs of one KV head are the states, 16 a pass (lanes); for every
// 32 positions:
//     S^T [32 keys][16 states] = K · Q^T      (K straight from the cache's slots as the A
//                                              operand where 16 positions lie in consecutive
//                                              slots, else copied; Q^T packed once a pass)
//     p = e^(S^T · scale − m), m the reference of each state (a lane), masked to the
//                                              positions each row sees: one vector per key,
//                                              no sum or max across lanes
//     O [16 states][d] += P · V               (P^T's key pairs transposed into P's rows, the A
//                                              operand; V's rows interleaved by pairs of keys
//                                              into the B operand, [16 pairs][16 d][2])
// O stays in tiles (d ≤ 64: four); it leaves them to be rescaled only when a state's scores
// outgrow its reference by more than kSlack (as prefill_attention.cpp does). P is two bfloat16
// parts (`weights`), so that the values are weighed to ~2^-17, as the vector path's float32
// weights do; every product's sum, and Σp, are float32. Within a bfloat16 unit of the vector
// path's outputs.
#include "decode_attention.h"

#include "gemv_amx.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "simd.h"
#define LLMBENCH_DECODE_TILES 1
#endif

namespace llmbench_decode_attention {

#ifdef LLMBENCH_DECODE_TILES
namespace {

constexpr int64_t kLanes = 16;   // states a pass: the columns of S^T, the rows of O
constexpr int64_t kKeys = 32;    // positions a step: two tiles of S^T, the k of P · V
constexpr float kSlack = 8.0f;   // how far a scaled score may pass its reference (e^8)
constexpr int64_t kAhead = 2;    // steps ahead that K and V are prefetched

// One pass: KV head kv, states s0 .. s0 + lanes − 1 (state t: row t / g, query head kv·g +
// t % g), positions [p0, p1).
struct Pass {
  int64_t kv, s0, lanes;
};

class TileAttention {
 public:
  TileAttention(const AttentionProblem& a, const c10::BFloat16* q, const c10::BFloat16* kc,
                const c10::BFloat16* vc, const RowRun& run, int64_t p0, int64_t p1)
      : a_(a),
        q_(reinterpret_cast<const uint16_t*>(q)),
        kc_(reinterpret_cast<const uint16_t*>(kc)),
        vc_(reinterpret_cast<const uint16_t*>(vc)),
        run_(run),
        p0_(p0),
        p1_(p1),
        d_(a.head_dim),
        g_(a.num_heads / a.num_kv_heads),
        table_(a.block_tables + run.first * a.max_blocks) {}

  void attend(const Pass& pass, States& st) {
    pack_queries(pass);
    __m512 row_max = _mm512_set1_ps(kNegInf), row_sum = _mm512_setzero_ps();
    const __m512 scale = _mm512_set1_ps(a_.scale);
    const __m512 slack = _mm512_set1_ps(kSlack);
    _tile_zero(2);
    _tile_zero(3);
    _tile_zero(4);
    _tile_zero(5);
    bool started = false;
    for (int64_t c0 = p0_ / kKeys * kKeys; c0 < p1_; c0 += kKeys) {
      slots_from(c0);
      scores(pass.kv);
      // Key j is seen by the states whose row's context passes it, from p0 on.
      __mmask16 seen[kKeys];
      __m512 block_max = _mm512_set1_ps(kNegInf);
      for (int64_t j = 0; j < kKeys; ++j) {
        const int64_t pos = c0 + j;
        seen[j] = pos < p0_ ? 0 : _mm512_cmpgt_epi32_mask(lens_, _mm512_set1_epi32(pos));
        block_max = _mm512_mask_max_ps(block_max, seen[j], block_max,
                                       _mm512_load_ps(s_t_ + j * kLanes));
      }
      block_max = _mm512_mul_ps(block_max, scale);  // scale > 0: the max of the scaled scores
      const __m512 new_max = _mm512_max_ps(row_max, block_max);
      if (!started) {
        row_max = new_max;  // O and Σp are still 0
        started = true;
      } else if (_mm512_cmp_ps_mask(block_max, _mm512_add_ps(row_max, slack), _CMP_GT_OQ)) {
        // e^(m_old − m_new); a state with no key seen before gets 0 (−inf: exp's floor)
        const __m512 alpha = llmbench_simd::exp_nonpositive(_mm512_sub_ps(row_max, new_max));
        row_sum = _mm512_mul_ps(row_sum, alpha);
        rescale_output(alpha);
        row_max = new_max;
      }
      row_sum = _mm512_add_ps(row_sum, weights(pass.kv, seen, scale, row_max));
      values(pass.kv);
      _tile_loadd(0, p_hi_, 64);
      _tile_loadd(1, p_lo_, 64);
      _tile_loadd(6, v_panel_, 64);
      _tile_dpbf16ps(2, 0, 6);
      _tile_dpbf16ps(2, 1, 6);
      _tile_loadd(7, v_panel_ + 512, 64);
      _tile_dpbf16ps(3, 0, 7);
      _tile_dpbf16ps(3, 1, 7);
      if (d_ == 64) {
        _tile_loadd(6, v_panel_ + 1024, 64);
        _tile_dpbf16ps(4, 0, 6);
        _tile_dpbf16ps(4, 1, 6);
        _tile_loadd(7, v_panel_ + 1536, 64);
        _tile_dpbf16ps(5, 0, 7);
        _tile_dpbf16ps(5, 1, 7);
      }
    }
    store_output();
    finish(pass, row_max, row_sum, st);
  }

 private:
  // Q^T as B tiles, per 32 of d: [16 pairs of d][16 states] dwords, zeros past `lanes`; each
  // lane's context (0 past `lanes`: it sees nothing).
  void pack_queries(const Pass& pass) {
    alignas(64) int32_t lens[kLanes] = {};
    const uint16_t* rows[kLanes];
    for (int64_t lane = 0; lane < pass.lanes; ++lane) {
      const int64_t t = pass.s0 + lane, i = t / g_, h = pass.kv * g_ + t % g_;
      rows[lane] = q_ + (run_.first + i) * a_.q_row + h * a_.q_head;
      lens[lane] = static_cast<int32_t>(std::min<int64_t>(a_.context_lens[run_.first + i], p1_));
    }
    llmbench_simd::pack_pair_rows(rows, pass.lanes, d_, reinterpret_cast<uint16_t*>(q_t_));
    lens_ = _mm512_load_si512(lens);
  }

  // The slots of positions c0 .. c0 + 31 below p1 (those from p1 on: −1), and those of the
  // step kAhead steps on.
  void slots_from(int64_t c0) {
    slots_below_p1(c0, slots_);
    slots_below_p1(c0 + kAhead * kKeys, ahead_);
  }

  void slots_below_p1(int64_t c0, int64_t* slots) const {
    const int64_t end = std::max(c0, std::min(c0 + kKeys, p1_));
    slots_of(table_, a_.block_size, c0, end, slots);
    std::fill(slots + (end - c0), slots + kKeys, -1);
  }

  // Positions first .. first + 15 of head kv as an A operand: the cache's rows where their
  // slots are consecutive (stride: a slot), else copied into stage_ (zeros past p1).
  const uint16_t* keys_of(int64_t kv, int64_t first, int64_t& stride) {
    const int64_t* s = slots_ + first;
    bool in_a_row = s[0] >= 0;
    for (int64_t r = 1; r < 16; ++r) in_a_row = in_a_row && s[r] == s[0] + r;
    if (in_a_row) {
      stride = a_.k_slot * 2;
      return kc_ + s[0] * a_.k_slot + kv * d_;
    }
    uint16_t* stage = stage_ + first * d_;
    for (int64_t r = 0; r < 16; ++r) {
      if (s[r] >= 0)
        std::memcpy(stage + r * d_, kc_ + s[r] * a_.k_slot + kv * d_, d_ * 2);
      else
        std::memset(stage + r * d_, 0, d_ * 2);
    }
    stride = d_ * 2;
    return stage;
  }

  // S^T of the step's 32 positions (slots_) into s_t_: tmm0 the first 16, tmm1 the next.
  void scores(int64_t kv) {
    int64_t stride0, stride1;
    const uint16_t* k0 = keys_of(kv, 0, stride0);
    const uint16_t* k1 = keys_of(kv, 16, stride1);
    _tile_zero(0);
    _tile_zero(1);
    for (int64_t s = 0; s < d_ / 32; ++s) {
      _tile_loadd(7, q_t_ + s * 256, 64);
      _tile_loadd(6, k0 + s * 32, stride0);
      _tile_dpbf16ps(0, 6, 7);
      _tile_loadd(6, k1 + s * 32, stride1);
      _tile_dpbf16ps(1, 6, 7);
    }
    _tile_stored(0, s_t_, 64);
    _tile_stored(1, s_t_ + 16 * kLanes, 64);
  }

  // p = e^(s · scale − m) where seen, 0 elsewhere, into P's rows as two bfloat16 parts,
  // p_hi_ = p rounded and p_lo_ = what that left, rounded: P · V as P_hi · V + P_lo · V weighs
  // the values with p to ~2^-17, as the vector path's float32 weights do. bfloat16 p alone (as
  // flash kernels and the prefill tiles use) was off by up to 4 bfloat16 units; the second
  // part's products cost no time measurable beside the step's memory traffic (5 rows × 4
  // sequences, 600 positions: 123-131 against 123-129 µs). Returns Σp per state.
  __m512 weights(int64_t kv, const __mmask16* seen, __m512 scale, __m512 row_max) {
    __m512 sum = _mm512_setzero_ps();
    for (int64_t p = 0; p < kKeys / 2; ++p) {
      prefetch_slot(kv, ahead_[p]);
      __m512 e[2];
      for (int t = 0; t < 2; ++t) {
        const int64_t j = 2 * p + t;
        e[t] = _mm512_maskz_mov_ps(seen[j], llmbench_simd::exp_nonpositive(_mm512_fmsub_ps(
                                                _mm512_load_ps(s_t_ + j * kLanes), scale, row_max)));
        sum = _mm512_add_ps(sum, e[t]);
      }
      const __m512i hi_bits = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(e[1], e[0]));
      const __m512 lo0 = _mm512_sub_ps(
          e[0], _mm512_cvtpbh_ps(reinterpret_cast<__m256bh>(_mm512_castsi512_si256(hi_bits))));
      const __m512 lo1 = _mm512_sub_ps(
          e[1],
          _mm512_cvtpbh_ps(reinterpret_cast<__m256bh>(_mm512_extracti64x4_epi64(hi_bits, 1))));
      const __m512i lo_bits = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(lo1, lo0));
      // keys 2p in lanes 0..15, 2p + 1 in 16..31 → interleaved: dword lane = (p[2p],
      // p[2p + 1]) of that lane's state
      _mm512_store_si512(pairs_ + p * 16, llmbench_simd::interleave_halves_epi16(hi_bits));
      _mm512_store_si512(pairs_ + (16 + p) * 16, llmbench_simd::interleave_halves_epi16(lo_bits));
    }
    for (int part = 0; part < 2; ++part) {  // P^T's pairs → P's rows: one state's 32 weights
      __m512i rows[16];
      for (int64_t p = 0; p < 16; ++p) rows[p] = _mm512_load_si512(pairs_ + (16 * part + p) * 16);
      llmbench_simd::transpose_16x16(rows);
      uint16_t* out = part == 0 ? p_hi_ : p_lo_;
      for (int64_t lane = 0; lane < kLanes; ++lane) _mm512_store_si512(out + lane * 32, rows[lane]);
    }
    return sum;
  }

  // V of the step's 32 positions as B tiles, per 16 of d: [16 pairs of keys][16 d][2]
  // (positions from p1 on: zeros, so that a weight of 0 never meets stale memory).
  void values(int64_t kv) {
    static const uint16_t zeros[64] = {};
    const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9,
                                        40, 8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1,
                                        32, 0);
    const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
    for (int64_t p = 0; p < kKeys / 2; ++p) {
      prefetch_slot(kv, ahead_[16 + p]);
      const int64_t s0 = slots_[2 * p], s1 = slots_[2 * p + 1];
      const uint16_t* r0 = s0 >= 0 ? vc_ + s0 * a_.v_slot + kv * d_ : zeros;
      const uint16_t* r1 = s1 >= 0 ? vc_ + s1 * a_.v_slot + kv * d_ : zeros;
      for (int64_t h = 0; h < d_ / 32; ++h) {
        const __m512i x0 = _mm512_loadu_si512(r0 + 32 * h), x1 = _mm512_loadu_si512(r1 + 32 * h);
        _mm512_store_si512(v_panel_ + (2 * h) * 512 + p * 32, _mm512_permutex2var_epi16(x0, lo, x1));
        _mm512_store_si512(v_panel_ + (2 * h + 1) * 512 + p * 32,
                           _mm512_permutex2var_epi16(x0, hi, x1));
      }
    }
  }

  // This head's K and V at a slot kAhead steps on, into L1 (gcc 12 judged this function,
  // prefetches only, free of effects and dropped its calls unless inlined by force).
  [[gnu::always_inline]] void prefetch_slot(int64_t kv, int64_t slot) {
    if (slot < 0) return;  // past p1
    const char* k = reinterpret_cast<const char*>(kc_ + slot * a_.k_slot + kv * d_);
    const char* v = reinterpret_cast<const char*>(vc_ + slot * a_.v_slot + kv * d_);
    for (int64_t b = 0; b < d_ * 2; b += 64) {
      _mm_prefetch(k + b, _MM_HINT_T0);
      _mm_prefetch(v + b, _MM_HINT_T0);
    }
  }

  void store_output() {
    _tile_stored(2, o_, 64);
    _tile_stored(3, o_ + 256, 64);
    if (d_ == 64) {
      _tile_stored(4, o_ + 512, 64);
      _tile_stored(5, o_ + 768, 64);
    }
  }

  // O's row of each state times that state's alpha.
  void rescale_output(__m512 alpha) {
    store_output();
    alignas(64) float by[kLanes];
    _mm512_store_ps(by, alpha);
    for (int64_t tile = 0; tile < d_ / 16; ++tile)
      for (int64_t lane = 0; lane < kLanes; ++lane) {
        float* row = o_ + tile * 256 + lane * 16;
        _mm512_store_ps(row, _mm512_mul_ps(_mm512_load_ps(row), _mm512_set1_ps(by[lane])));
      }
    _tile_loadd(2, o_, 64);
    _tile_loadd(3, o_ + 256, 64);
    if (d_ == 64) {
      _tile_loadd(4, o_ + 512, 64);
      _tile_loadd(5, o_ + 768, 64);
    }
  }

  // The pass's states into st: m, Σp, and O's rows.
  void finish(const Pass& pass, __m512 row_max, __m512 row_sum, States& st) {
    alignas(64) float m[kLanes], l[kLanes];
    _mm512_store_ps(m, row_max);
    _mm512_store_ps(l, row_sum);
    for (int64_t lane = 0; lane < pass.lanes; ++lane) {
      const int64_t t = pass.s0 + lane, i = t / g_, h = pass.kv * g_ + t % g_;
      const int64_t state = i * a_.num_heads + h;
      const bool saw = l[lane] > 0.0f;
      st.m[state] = saw ? m[lane] : kNegInf;
      st.l[state] = saw ? l[lane] : 0.0f;
      for (int64_t tile = 0; tile < d_ / 16; ++tile)
        std::memcpy(&st.acc[state * d_ + tile * 16], o_ + tile * 256 + lane * 16,
                    16 * sizeof(float));
    }
  }

  const AttentionProblem& a_;
  const uint16_t* q_;
  const uint16_t* kc_;
  const uint16_t* vc_;
  const RowRun& run_;
  const int64_t p0_, p1_, d_, g_;
  const int32_t* table_;
  __m512i lens_;
  int64_t slots_[kKeys], ahead_[kKeys];
  alignas(64) uint32_t q_t_[2 * 256];        // Q^T: per 32 of d, 16 pairs × 16 states
  alignas(64) float s_t_[kKeys * kLanes];    // S^T of a step
  alignas(64) uint32_t pairs_[2 * 16 * 16];  // P^T's hi, lo parts: 16 pairs of keys × 16 states
  alignas(64) uint16_t p_hi_[kLanes * kKeys];  // P's parts: 16 states × 32 keys
  alignas(64) uint16_t p_lo_[kLanes * kKeys];
  alignas(64) uint16_t v_panel_[4 * 512];    // V per 16 of d: 16 pairs of keys × 16 d × 2
  alignas(64) uint16_t stage_[kKeys * 64];   // keys copied where their slots are not in a row
  alignas(64) float o_[4 * 256];             // O when it leaves the tiles: per 16 of d
};

}  // namespace

bool tiles_take(const AttentionProblem& a, const RowRun& run, bool bfloat16) {
  return bfloat16 && run.count >= 2 && (a.head_dim == 32 || a.head_dim == 64) &&
         llmbench_amx::available();
}

void attend_on_tiles(const AttentionProblem& a, const c10::BFloat16* q, const c10::BFloat16* kc,
                     const c10::BFloat16* vc, const RowRun& run, int64_t p0, int64_t p1,
                     States& st) {
  TileAttention tiles(a, q, kc, vc, run, p0, p1);
  const int64_t states = run.count * (a.num_heads / a.num_kv_heads);
  for (int64_t kv = 0; kv < a.num_kv_heads; ++kv)
    for (int64_t s0 = 0; s0 < states; s0 += kLanes)
      tiles.attend({kv, s0, std::min(kLanes, states - s0)}, st);
}
#else
bool tiles_take(const AttentionProblem&, const RowRun&, bool) { return false; }

void attend_on_tiles(const AttentionProblem&, const c10::BFloat16*, const c10::BFloat16*,
                     const c10::BFloat16*, const RowRun&, int64_t, int64_t, States&) {}
#endif

}  // namespace llmbench_decode_attention
