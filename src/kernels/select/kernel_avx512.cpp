// AVX-512 tile kernels: fp32 FMAs and AVX512_BF16 dot products (VDPBF16PS).
//
// Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512bf16 -mfma (see
// src/CMakeLists.txt); callers check the CPU first. This file uses
// intrinsics and plain loops only (no std templates), so no AVX-512 code can leak
// into inline functions shared with other translation units.
//
// Register blocking: 8 heads x 3 panels of 16 keys = 24 zmm accumulators. A key's
// lane runs the same instructions whichever group (3, 2 or 1 panels) or head chunk
// (8 heads or the remainder) it is in, so its score never depends on tile position.
#include <immintrin.h>

// GCC 12's intrinsics initialise pass-through operands with _mm512_undefined_*(),
// which -Wmaybe-uninitialized reports as a false positive (GCC bug 105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include "select_internal.hpp"

namespace sparsecp::select_detail {
namespace {

constexpr int kChunk = static_cast<int>(kChunkHeadsAvx512);

// score[j] += sum over heads i < HR of w[i] * ReLU(q_i . panel_j), fp32.
template <int HR, int NV>
__attribute__((noinline)) void chunk_f32(const float* q, int64_t q_stride, const float* keys,
                                         int64_t panel_stride, int64_t dim, const float* w,
                                         float* score) {
  __m512 acc[HR][NV];
#pragma GCC unroll 8
  for (int i = 0; i < HR; ++i) {
#pragma GCC unroll 3
    for (int j = 0; j < NV; ++j) acc[i][j] = _mm512_setzero_ps();
  }
  for (int64_t d = 0; d < dim; ++d) {
    __m512 k[NV];
#pragma GCC unroll 3
    for (int j = 0; j < NV; ++j) k[j] = _mm512_load_ps(keys + j * panel_stride + d * kPanelKeys);
#pragma GCC unroll 8
    for (int i = 0; i < HR; ++i) {
      const __m512 a = _mm512_set1_ps(q[i * q_stride + d]);
#pragma GCC unroll 3
      for (int j = 0; j < NV; ++j) acc[i][j] = _mm512_fmadd_ps(a, k[j], acc[i][j]);
    }
  }
  const __m512 zero = _mm512_setzero_ps();
  __m512 sum[NV];
#pragma GCC unroll 3
  for (int j = 0; j < NV; ++j) sum[j] = _mm512_loadu_ps(score + j * kPanelKeys);
#pragma GCC unroll 8
  for (int i = 0; i < HR; ++i) {
    const __m512 weight = _mm512_set1_ps(w[i]);
#pragma GCC unroll 3
    for (int j = 0; j < NV; ++j) {
      sum[j] = _mm512_fmadd_ps(weight, _mm512_max_ps(zero, acc[i][j]), sum[j]);
    }
  }
#pragma GCC unroll 3
  for (int j = 0; j < NV; ++j) _mm512_storeu_ps(score + j * kPanelKeys, sum[j]);
}

// The same with bf16 pairs: q holds (q[2p], q[2p+1]) per uint32, panels [p][16][2].
template <int HR, int NV>
__attribute__((noinline)) void chunk_bf16(const uint32_t* q, int64_t q_stride, const uint16_t* keys,
                                          int64_t panel_stride, int64_t pairs, const float* w,
                                          float* score) {
  __m512 acc[HR][NV];
#pragma GCC unroll 8
  for (int i = 0; i < HR; ++i) {
#pragma GCC unroll 3
    for (int j = 0; j < NV; ++j) acc[i][j] = _mm512_setzero_ps();
  }
  for (int64_t p = 0; p < pairs; ++p) {
    __m512bh k[NV];
#pragma GCC unroll 3
    for (int j = 0; j < NV; ++j) {
      k[j] = (__m512bh)_mm512_load_si512(keys + j * panel_stride + p * 2 * kPanelKeys);
    }
#pragma GCC unroll 8
    for (int i = 0; i < HR; ++i) {
      const __m512bh a = (__m512bh)_mm512_set1_epi32(static_cast<int>(q[i * q_stride + p]));
#pragma GCC unroll 3
      for (int j = 0; j < NV; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], a, k[j]);
    }
  }
  const __m512 zero = _mm512_setzero_ps();
  __m512 sum[NV];
#pragma GCC unroll 3
  for (int j = 0; j < NV; ++j) sum[j] = _mm512_loadu_ps(score + j * kPanelKeys);
#pragma GCC unroll 8
  for (int i = 0; i < HR; ++i) {
    const __m512 weight = _mm512_set1_ps(w[i]);
#pragma GCC unroll 3
    for (int j = 0; j < NV; ++j) {
      sum[j] = _mm512_fmadd_ps(weight, _mm512_max_ps(zero, acc[i][j]), sum[j]);
    }
  }
#pragma GCC unroll 3
  for (int j = 0; j < NV; ++j) _mm512_storeu_ps(score + j * kPanelKeys, sum[j]);
}

// One group of NV panels against all heads, chunk by chunk in head order.
template <int NV, bool Bf16>
void group(const ScoreRowArgs& args, int64_t panel) {
  // Running scores live in the caller's buffer between head chunks (keeping them in
  // registers would spill the key vectors of the inner loop).
  float* score = args.scores + panel * kPanelKeys;
  for (int64_t lane = 0; lane < NV * kPanelKeys; ++lane) score[lane] = 0.0f;
  const int64_t dim = args.head_dim;
  const int64_t depth = Bf16 ? (dim + 1) / 2 : dim;  // steps per dot product
  const int64_t panel_stride = depth * kPanelKeys * (Bf16 ? 2 : 1);
  const int64_t full = args.heads / kChunk * kChunk;
  const float* w = args.weights;
  if constexpr (Bf16) {
    const auto* q = static_cast<const uint32_t*>(args.q_pack);
    const auto* keys = static_cast<const uint16_t*>(args.key_pack) + panel * panel_stride;
    for (int64_t h = 0; h < full; h += kChunk) {
      chunk_bf16<kChunk, NV>(q + h * depth, depth, keys, panel_stride, depth, w + h, score);
    }
    using Tail =
        void (*)(const uint32_t*, int64_t, const uint16_t*, int64_t, int64_t, const float*, float*);
    constexpr Tail tails[kChunk] = {nullptr,           chunk_bf16<1, NV>, chunk_bf16<2, NV>,
                                    chunk_bf16<3, NV>, chunk_bf16<4, NV>, chunk_bf16<5, NV>,
                                    chunk_bf16<6, NV>, chunk_bf16<7, NV>};
    if (args.heads > full) {
      tails[args.heads - full](q + full * depth, depth, keys, panel_stride, depth, w + full, score);
    }
  } else {
    const auto* q = static_cast<const float*>(args.q_pack);
    const auto* keys = static_cast<const float*>(args.key_pack) + panel * panel_stride;
    for (int64_t h = 0; h < full; h += kChunk) {
      chunk_f32<kChunk, NV>(q + h * depth, depth, keys, panel_stride, depth, w + h, score);
    }
    using Tail =
        void (*)(const float*, int64_t, const float*, int64_t, int64_t, const float*, float*);
    constexpr Tail tails[kChunk] = {nullptr,          chunk_f32<1, NV>, chunk_f32<2, NV>,
                                    chunk_f32<3, NV>, chunk_f32<4, NV>, chunk_f32<5, NV>,
                                    chunk_f32<6, NV>, chunk_f32<7, NV>};
    if (args.heads > full) {
      tails[args.heads - full](q + full * depth, depth, keys, panel_stride, depth, w + full, score);
    }
  }
}

template <bool Bf16>
void score_row(const ScoreRowArgs& args) {
  int64_t panel = 0;
  for (; panel + 3 <= args.panels; panel += 3) group<3, Bf16>(args, panel);
  if (args.panels - panel == 2) group<2, Bf16>(args, panel);
  if (args.panels - panel == 1) group<1, Bf16>(args, panel);
}

__mmask16 first_lanes(int64_t left) {
  return left >= 16 ? static_cast<__mmask16>(0xffff)
                    : static_cast<__mmask16>((1u << static_cast<unsigned>(left)) - 1u);
}

void reduce_heads_impl(const ReduceHeadsArgs& a) {
  // 128 keys of a row at a time in 8 accumulators, heads in order inside: each logit is
  // read once and the sums never leave registers. ReLU as max(0, l) keeps NaN (MAXPS
  // returns its second operand when one is NaN) and -0, as `l < 0 ? 0 : l` does.
  constexpr int64_t kWidth = 128;
  const __m512 zero = _mm512_setzero_ps();
  for (int64_t r = 0; r < a.rows; ++r) {
    float* out = a.out + r * a.n;
    const float* weights = a.weights + r * a.heads;
    const float* logits = a.logits + r * a.heads * a.n;
    for (int64_t k0 = 0; k0 < a.n; k0 += kWidth) {
      const int64_t width = a.n - k0 < kWidth ? a.n - k0 : kWidth;  // no std templates here
      if (width < kWidth) {  // a short tail: one vector at a time
        for (int64_t k = k0; k < a.n; k += 16) {
          const __mmask16 valid = first_lanes(a.n - k);
          __m512 sum = zero;
          for (int64_t h = 0; h < a.heads; ++h) {
            const __m512 l = _mm512_maskz_loadu_ps(valid, logits + h * a.n + k);
            sum = _mm512_fmadd_ps(_mm512_set1_ps(weights[h]), _mm512_max_ps(zero, l), sum);
          }
          _mm512_mask_storeu_ps(out + k, valid, sum);
        }
        break;
      }
      __m512 sum[8];
      for (auto& v : sum) v = zero;
      for (int64_t h = 0; h < a.heads; ++h) {
        const __m512 w = _mm512_set1_ps(weights[h]);
        const float* l = logits + h * a.n + k0;
        for (int64_t v = 0; v < 8; ++v) {
          sum[v] = _mm512_fmadd_ps(w, _mm512_max_ps(zero, _mm512_loadu_ps(l + 16 * v)), sum[v]);
        }
      }
      for (int64_t v = 0; v < 8; ++v) _mm512_storeu_ps(out + k0 + 16 * v, sum[v]);
    }
  }
}
}  // namespace

void reduce_heads_avx512(const ReduceHeadsArgs& args) { reduce_heads_impl(args); }

namespace {
// score_order of 16 scores (select_internal.hpp): +0 for -0, every NaN above +inf,
// negatives inverted.
__m512i score_orders(__m512 score) {
  const __m512i ones = _mm512_set1_epi32(-1);
  score = _mm512_add_ps(score, _mm512_setzero_ps());
  const __m512i bits = _mm512_castps_si512(score);
  const __mmask16 negative = _mm512_cmplt_epi32_mask(bits, _mm512_setzero_si512());
  const __m512i order =
      _mm512_mask_xor_epi32(_mm512_or_si512(bits, _mm512_set1_epi32(static_cast<int>(0x80000000u))),
                            negative, bits, ones);
  return _mm512_mask_mov_epi32(order, _mm512_cmp_ps_mask(score, score, _CMP_UNORD_Q), ones);
}
}  // namespace

void candidates_avx512(const float* scores, int64_t count, int64_t key0, uint64_t* out) {
  const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int64_t i = 0; i < count; i += 16) {
    const __mmask16 valid = first_lanes(count - i);
    const __m512i order = score_orders(_mm512_maskz_loadu_ps(valid, scores + i));
    // The low half: 0xffffffff - key, as candidate() writes it.
    const __m512i key = _mm512_add_epi32(lanes, _mm512_set1_epi32(static_cast<int>(key0 + i)));
    const __m512i low = _mm512_sub_epi32(_mm512_set1_epi32(-1), key);
    const __m512i lo8 = _mm512_unpacklo_epi32(low, order);  // 64-bit (order << 32) | low
    const __m512i hi8 = _mm512_unpackhi_epi32(low, order);
    // unpack works per 128-bit lane: put the pairs back in key order.
    const __m512i first =
        _mm512_permutex2var_epi64(lo8, _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11), hi8);
    const __m512i second =
        _mm512_permutex2var_epi64(lo8, _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15), hi8);
    const auto lo_mask = static_cast<__mmask8>(valid & 0xffu);
    const auto hi_mask = static_cast<__mmask8>(valid >> 8);
    _mm512_mask_storeu_epi64(out + i, lo_mask, first);
    _mm512_mask_storeu_epi64(out + i + 8, hi_mask, second);
  }
}

int64_t scores_at_least_avx512(const float* scores, int64_t count, uint32_t floor, int32_t* out) {
  const __m512i floor_v = _mm512_set1_epi32(static_cast<int>(floor));
  const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  int64_t held = 0;
  for (int64_t i = 0; i < count; i += 16) {
    const __mmask16 valid = first_lanes(count - i);
    const __m512i order = score_orders(_mm512_maskz_loadu_ps(valid, scores + i));
    const __mmask16 pass = _mm512_mask_cmpge_epu32_mask(valid, order, floor_v);
    const __m512i index = _mm512_add_epi32(lanes, _mm512_set1_epi32(static_cast<int>(i)));
    _mm512_mask_compressstoreu_epi32(out + held, pass, index);
    held += __builtin_popcount(pass);
  }
  return held;
}
void score_row_f32_avx512(const ScoreRowArgs& args) { score_row<false>(args); }
void score_row_bf16_avx512(const ScoreRowArgs& args) { score_row<true>(args); }

// Transposes up to 16 rows x `cols` 32-bit elements (row stride `stride`) into
// dst[c * 16 + row], rows past `rows` as zero. 16 x 16 blocks through registers.
void pack_panel_u32_avx512(const void* src, int64_t stride, int64_t rows, int64_t cols,
                           uint32_t* dst) {
  const auto* bytes = static_cast<const char*>(src);
  for (int64_t c0 = 0; c0 < cols; c0 += 16) {
    const int64_t width = cols - c0 < 16 ? cols - c0 : 16;
    const __mmask16 mask = first_lanes(width);
    __m512i r[16];
    for (int i = 0; i < 16; ++i) {
      r[i] = i < rows ? _mm512_maskz_loadu_epi32(mask, bytes + (i * stride + c0) * 4)
                      : _mm512_setzero_si512();
    }
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
      t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
      t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
      r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
      r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
      r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
      r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    // r[4b + k] holds, in each 128-bit lane L, column 4L + k of rows 4b..4b+3.
    for (int k = 0; k < 4; ++k) {
      t[k] = _mm512_shuffle_i32x4(r[k], r[4 + k], 0x88);      // lanes 0,2 of each
      t[4 + k] = _mm512_shuffle_i32x4(r[k], r[4 + k], 0xdd);  // lanes 1,3
      t[8 + k] = _mm512_shuffle_i32x4(r[8 + k], r[12 + k], 0x88);
      t[12 + k] = _mm512_shuffle_i32x4(r[8 + k], r[12 + k], 0xdd);
    }
    for (int k = 0; k < 4; ++k) {
      // Columns 4L + k for L = 0..3: rows 0..7 from t[k] / t[4+k], rows 8..15 from t[8+k] /
      // t[12+k].
      const __m512i c0v = _mm512_shuffle_i32x4(t[k], t[8 + k], 0x88);       // L = 0
      const __m512i c2v = _mm512_shuffle_i32x4(t[k], t[8 + k], 0xdd);       // L = 2
      const __m512i c1v = _mm512_shuffle_i32x4(t[4 + k], t[12 + k], 0x88);  // L = 1
      const __m512i c3v = _mm512_shuffle_i32x4(t[4 + k], t[12 + k], 0xdd);  // L = 3
      const __m512i columns[4] = {c0v, c1v, c2v, c3v};
      for (int lane = 0; lane < 4; ++lane) {
        const int64_t c = 4 * lane + k;
        if (c < width) _mm512_store_si512(dst + (c0 + c) * 16, columns[lane]);
      }
    }
  }
}

}  // namespace sparsecp::select_detail
