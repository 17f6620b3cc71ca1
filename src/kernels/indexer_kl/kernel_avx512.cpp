// AVX-512 kernels of the indexer KL loss: the row-pointer GEMM (fp32 FMAs), its bf16
// pair variant (AVX512_BF16 VDPBF16PS, or emulated with FMAs for tests), and the
// per-row softmax/ReLU passes with a vectorised exp.
//
// Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512bf16 -mfma (see
// src/CMakeLists.txt); the driver checks the CPU first. Intrinsics and plain loops only
// (no std templates, no inline helpers from headers), so no AVX-512 code can leak into
// inline functions shared with other translation units.
//
// GEMM register blocking: heads (or channels) in the 16 lanes of a vector, up to 4
// vectors (64 lanes) x 6 rows = 24 zmm accumulators; fewer lanes take more rows (8 rows
// x 3 vectors, 12 x 2 or 1). The depth is cut into blocks of kDepthBlock so that B's
// block stays in L1 while every row block streams past it; each C element is one FMA
// chain over k = 0..depth-1 in order (stored and reloaded between depth blocks), so its
// bits never depend on the blocking.
#include <immintrin.h>

// GCC 12's intrinsics initialise pass-through operands with _mm512_undefined_*(),
// which -Wmaybe-uninitialized reports as a false positive (GCC bug 105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include "gemm_driver.hpp"
#include "indexer_kl_internal.hpp"

namespace sparsecp::kl_detail {
namespace {

constexpr int64_t kDepthBlock = kGemmDepthBlock;

inline __mmask16 lane_mask(int64_t lanes) {
  return lanes >= 16 ? static_cast<__mmask16>(0xffff)
                     : static_cast<__mmask16>((1u << static_cast<unsigned>(lanes)) - 1u);
}

// Rows per micro-kernel call for a call whose widest column block has `vectors` vectors.
inline int64_t row_block(int64_t vectors) { return vectors >= 4 ? 6 : vectors == 3 ? 8 : 12; }

// Stores an MR x (16 * NV) accumulator tile at c (row stride ldc), the last vector's
// lanes per `last`.
template <int MR, int NV>
inline void store_tile(const __m512 (&acc)[MR][NV], float* c, int64_t ldc, __mmask16 last) {
#pragma GCC unroll 12
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < NV - 1; ++j) _mm512_storeu_ps(c + i * ldc + 16 * j, acc[i][j]);
    _mm512_mask_storeu_ps(c + i * ldc + 16 * (NV - 1), last, acc[i][NV - 1]);
  }
}

// --- fp32 GEMM -----------------------------------------------------------------------------

// C[i][j0 + l] (+)= sum_{k < depth} A_i[k * a_step] * B_k[j0 + l] for i < MR, l < 16 * NV
// (the last vector's lanes per `last`). `accumulate`: start from C instead of 0.
template <int MR, int NV>
__attribute__((noinline)) void micro(const float* const* a, int64_t a_step, const float* const* b,
                                     int64_t j0, int64_t depth, float* c, int64_t ldc,
                                     __mmask16 last, bool accumulate) {
  __m512 acc[MR][NV];
  if (accumulate) {
#pragma GCC unroll 12
    for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) {
        acc[i][j] = _mm512_maskz_loadu_ps(j == NV - 1 ? last : static_cast<__mmask16>(0xffff),
                                          c + i * ldc + j0 + 16 * j);
      }
    }
  } else {
#pragma GCC unroll 12
    for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) acc[i][j] = _mm512_setzero_ps();
    }
  }
  const float* rows[MR];
#pragma GCC unroll 12
  for (int i = 0; i < MR; ++i) rows[i] = a[i];
  for (int64_t k = 0; k < depth; ++k) {
    const float* brow = b[k] + j0;
    __m512 bv[NV];
#pragma GCC unroll 4
    for (int j = 0; j < NV - 1; ++j) bv[j] = _mm512_loadu_ps(brow + 16 * j);
    bv[NV - 1] = _mm512_maskz_loadu_ps(last, brow + 16 * (NV - 1));
    const int64_t at = k * a_step;
#pragma GCC unroll 12
    for (int i = 0; i < MR; ++i) {
      const __m512 av = _mm512_set1_ps(rows[i][at]);
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) acc[i][j] = _mm512_fmadd_ps(av, bv[j], acc[i][j]);
    }
  }
  store_tile<MR, NV>(acc, c + j0, ldc, last);
}

using Micro = void (*)(const float* const*, int64_t, const float* const*, int64_t, int64_t, float*,
                       int64_t, __mmask16, bool);

template <int MR>
struct MicroRow {
  static constexpr Micro fns[4] = {micro<MR, 1>, micro<MR, 2>, micro<MR, 3>, micro<MR, 4>};
};
// kMicro[mr - 1][nv - 1]; combinations a call never makes (e.g. 12 rows x 4 vectors)
// exist but are unused.
constexpr const Micro* kMicro[12] = {MicroRow<1>::fns,  MicroRow<2>::fns,  MicroRow<3>::fns,
                                     MicroRow<4>::fns,  MicroRow<5>::fns,  MicroRow<6>::fns,
                                     MicroRow<7>::fns,  MicroRow<8>::fns,  MicroRow<9>::fns,
                                     MicroRow<10>::fns, MicroRow<11>::fns, MicroRow<12>::fns};

// Widens `count` bf16 values at stride `step` to fp32.
void widen_bf16(const uint16_t* src, int64_t step, int64_t count, float* dst) {
  int64_t k = 0;
  if (step == 1) {
    for (; k + 16 <= count; k += 16) {
      const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + k));
      _mm512_storeu_ps(dst + k,
                       _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16)));
    }
  }
  for (; k < count; ++k) {
    const uint32_t bits = static_cast<uint32_t>(src[k * step]) << 16;
    float value;
    __builtin_memcpy(&value, &bits, 4);
    dst[k] = value;
  }
}

// --- bf16 pair GEMM ------------------------------------------------------------------------

template <bool Native>
inline __m512 pair_dot(__m512 acc, __m512i a, __m512i b) {
  if constexpr (Native) {
    return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
  } else {
    // VDPBF16PS's definition: acc += a.odd * b.odd; acc += a.even * b.even (each product
    // exact, each add rounded once).
    const __m512i high = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
    acc = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(a, high)),
                          _mm512_castsi512_ps(_mm512_and_si512(b, high)), acc);
    return _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(a, 16)),
                           _mm512_castsi512_ps(_mm512_slli_epi32(b, 16)), acc);
  }
}

template <int MR, int NV, bool Native>
__attribute__((noinline)) void micro_pairs(const uint16_t* const* a, const uint16_t* b, int64_t ldb,
                                           int64_t j0, int64_t pairs, float* c, int64_t ldc,
                                           __mmask16 last) {
  __m512 acc[MR][NV];
#pragma GCC unroll 12
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) acc[i][j] = _mm512_setzero_ps();
  }
  const uint16_t* rows[MR];
#pragma GCC unroll 12
  for (int i = 0; i < MR; ++i) rows[i] = a[i];
  for (int64_t p = 0; p < pairs; ++p) {
    const uint16_t* brow = b + (p * ldb + j0) * 2;
    __m512i bv[NV];
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) bv[j] = _mm512_loadu_si512(brow + 32 * j);
#pragma GCC unroll 12
    for (int i = 0; i < MR; ++i) {
      int32_t pair;
      __builtin_memcpy(&pair, rows[i] + 2 * p, 4);
      const __m512i av = _mm512_set1_epi32(pair);
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) acc[i][j] = pair_dot<Native>(acc[i][j], av, bv[j]);
    }
  }
  store_tile<MR, NV>(acc, c + j0, ldc, last);
}

using PairMicro = void (*)(const uint16_t* const*, const uint16_t*, int64_t, int64_t, int64_t,
                           float*, int64_t, __mmask16);

template <int MR, bool Native>
struct PairRow {
  static constexpr PairMicro fns[4] = {micro_pairs<MR, 1, Native>, micro_pairs<MR, 2, Native>,
                                       micro_pairs<MR, 3, Native>, micro_pairs<MR, 4, Native>};
};
template <bool Native>
struct PairTable {
  static constexpr const PairMicro* rows[12] = {
      PairRow<1, Native>::fns,  PairRow<2, Native>::fns,  PairRow<3, Native>::fns,
      PairRow<4, Native>::fns,  PairRow<5, Native>::fns,  PairRow<6, Native>::fns,
      PairRow<7, Native>::fns,  PairRow<8, Native>::fns,  PairRow<9, Native>::fns,
      PairRow<10, Native>::fns, PairRow<11, Native>::fns, PairRow<12, Native>::fns};
};

template <bool Native>
void pair_gemm(const PairGemmArgs& g) {
  if (g.m == 0 || g.n == 0) return;
  const int64_t widest = g.n >= 64 ? 4 : (g.n + 15) / 16;
  const int64_t block = row_block(widest);
  for (int64_t i0 = 0; i0 < g.m; i0 += block) {
    const int64_t mr = g.m - i0 < block ? g.m - i0 : block;
    for (int64_t j0 = 0; j0 < g.n; j0 += 64) {
      const int64_t lanes = g.n - j0 < 64 ? g.n - j0 : 64;
      const int64_t nv = (lanes + 15) / 16;
      PairTable<Native>::rows[mr - 1][nv - 1](g.a + i0, g.b, g.ldb, j0, g.depth / 2,
                                              g.c + i0 * g.ldc, g.ldc,
                                              lane_mask(lanes - 16 * (nv - 1)));
    }
  }
}

// --- transpose -------------------------------------------------------------------------

// Transposes 16 rows of 16 32-bit elements in registers: on return r[c] holds column c.
// Stages: 32-bit and 64-bit interleaves within 128-bit lanes, then two rounds of
// 128-bit lane shuffles.
inline void transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  // u[4b + k]: in 128-bit lane L, column 4L + k of rows 4b..4b+3.
  __m512i u[16];
  for (int b = 0; b < 16; b += 4) {
    u[b] = _mm512_unpacklo_epi64(t[b], t[b + 2]);
    u[b + 1] = _mm512_unpackhi_epi64(t[b], t[b + 2]);
    u[b + 2] = _mm512_unpacklo_epi64(t[b + 1], t[b + 3]);
    u[b + 3] = _mm512_unpackhi_epi64(t[b + 1], t[b + 3]);
  }
  for (int k = 0; k < 4; ++k) {
    // v[k] = (rows 0-3 col k, rows 0-3 col 8+k, rows 4-7 col k, rows 4-7 col 8+k), ...
    const __m512i v0 = _mm512_shuffle_i32x4(u[k], u[4 + k], 0x88);
    const __m512i v4 = _mm512_shuffle_i32x4(u[k], u[4 + k], 0xdd);
    const __m512i v8 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0x88);
    const __m512i v12 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0xdd);
    r[k] = _mm512_shuffle_i32x4(v0, v8, 0x88);
    r[8 + k] = _mm512_shuffle_i32x4(v0, v8, 0xdd);
    r[4 + k] = _mm512_shuffle_i32x4(v4, v12, 0x88);
    r[12 + k] = _mm512_shuffle_i32x4(v4, v12, 0xdd);
  }
}

// --- exp -------------------------------------------------------------------------------------

// e^x for x <= 0 (larger x is clamped at 88.7): Cody-Waite reduction x = n ln2 + r,
// |r| <= ln2 / 2, a degree-6 polynomial, then scalef (correct underflow to denormals
// and 0). About 2 ulp; NaN propagates.
inline __m512 exp_ps(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-104.0f), x);  // NaN in x passes through (second operand)
  x = _mm512_min_ps(_mm512_set1_ps(88.7f), x);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.0f / 720.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// This ISA's side of the shared GEMM blocking (gemm_driver.hpp).
struct Traits {
  static constexpr int64_t kLanes = 16;
  static constexpr int64_t kMaxVectors = 4;
  static constexpr auto lane_mask = kl_detail::lane_mask;
  static constexpr auto row_block = kl_detail::row_block;
  static constexpr auto widen_bf16 = kl_detail::widen_bf16;
  static constexpr const Micro* const* micro = kMicro;
};

}  // namespace

void gemm_avx512(const GemmArgs& g) { blocked_gemm<Traits>(g); }

void transpose_avx512(const TransposeArgs& t) {
  auto* dst = static_cast<uint32_t*>(t.dst);
  for (int64_t r0 = 0; r0 < t.rows; r0 += 16) {
    const int64_t rows = t.rows - r0 < 16 ? t.rows - r0 : 16;
    const __mmask16 row_mask = lane_mask(rows);
    for (int64_t c0 = 0; c0 < t.cols; c0 += 16) {
      const int64_t cols = t.cols - c0 < 16 ? t.cols - c0 : 16;
      const __mmask16 col_mask = lane_mask(cols);
      __m512i r[16];
      for (int64_t i = 0; i < 16; ++i) {
        const int64_t at = (r0 + i) * t.stride + c0;
        if (i >= rows) {
          r[i] = _mm512_setzero_si512();
        } else if (t.widen_bf16) {
          const __m256i bits =
              _mm256_maskz_loadu_epi16(col_mask, static_cast<const uint16_t*>(t.src) + at);
          r[i] = _mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16);
        } else {
          r[i] = _mm512_maskz_loadu_epi32(col_mask, static_cast<const uint32_t*>(t.src) + at);
        }
      }
      transpose16(r);
      for (int64_t c = 0; c < cols; ++c) {
        _mm512_mask_storeu_epi32(dst + (c0 + c) * t.ld + r0, row_mask, r[c]);
      }
    }
  }
}

void pair_gemm_avx512_bf16(const PairGemmArgs& args) { pair_gemm<true>(args); }
void pair_gemm_avx512_emulated(const PairGemmArgs& args) { pair_gemm<false>(args); }

void teacher_avx512(const TeacherArgs& t) {
  for (int64_t j = 0; j < t.slots; ++j) t.probabilities[j] = 0.0f;
  const __m512 scale = _mm512_set1_ps(t.scale);
  for (int64_t h0 = 0; h0 < t.heads; h0 += 16) {
    const __mmask16 mask = lane_mask(t.heads - h0);
    const __m512 sink = _mm512_maskz_loadu_ps(mask, t.sinks + h0);
    __m512 top = sink;
    for (int64_t j = 0; j < t.slots; ++j) {
      const __m512 l = _mm512_mul_ps(scale, _mm512_maskz_loadu_ps(mask, t.logits + j * t.ldl + h0));
      top = _mm512_max_ps(l, top);
    }
    __m512 z = exp_ps(_mm512_sub_ps(sink, top));
    for (int64_t j = 0; j < t.slots; ++j) {
      float* row = t.logits + j * t.ldl + h0;
      const __m512 e = exp_ps(_mm512_fmsub_ps(scale, _mm512_maskz_loadu_ps(mask, row), top));
      _mm512_mask_storeu_ps(row, mask, e);
      z = _mm512_add_ps(z, e);
    }
    const __m512 inverse = _mm512_maskz_div_ps(mask, _mm512_set1_ps(1.0f), z);
    for (int64_t j = 0; j < t.slots; ++j) {
      const __m512 e = _mm512_maskz_loadu_ps(mask, t.logits + j * t.ldl + h0);
      t.probabilities[j] += _mm512_reduce_add_ps(_mm512_mul_ps(e, inverse));
    }
  }
}

void scores_avx512(const ScoreArgs& s) {
  const __m512 zero = _mm512_setzero_ps();
  for (int64_t j = 0; j < s.slots; ++j) {
    __m512 acc = zero;
    for (int64_t h0 = 0; h0 < s.heads; h0 += 16) {
      const __mmask16 mask = lane_mask(s.heads - h0);
      const __m512 z = _mm512_maskz_loadu_ps(mask, s.z + j * s.ldz + h0);
      // ReLU as max(0, z): VMAXPS returns its second operand when either is NaN, so a NaN
      // z passes (max(z, 0) would drop it).
      acc =
          _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, s.weights + h0), _mm512_max_ps(zero, z), acc);
    }
    s.scores[j] = _mm512_reduce_add_ps(acc);
  }
}

void student_backward_avx512(const StudentBackwardArgs& s) {
  const __m512 zero = _mm512_setzero_ps();
  for (int64_t h0 = 0; h0 < s.heads; h0 += 16) {
    const __mmask16 mask = lane_mask(s.heads - h0);
    const __m512 w = _mm512_maskz_loadu_ps(mask, s.weights + h0);
    __m512 dw = zero;
    for (int64_t j = 0; j < s.slots; ++j) {
      float* row = s.z + j * s.ldz + h0;
      const __m512 z = _mm512_maskz_loadu_ps(mask, row);
      const __m512 g = _mm512_set1_ps(s.g[j]);
      dw = _mm512_fmadd_ps(g, _mm512_max_ps(zero, z), dw);  // NaN z passes
      // dz = g * w * [z > 0] as a product (as in torch): a NaN g or w stays NaN.
      const __mmask16 active = _mm512_cmp_ps_mask(z, zero, _CMP_GT_OQ);
      const __m512 unit = _mm512_maskz_mov_ps(active, _mm512_set1_ps(1.0f));
      _mm512_mask_storeu_ps(row, mask, _mm512_mul_ps(_mm512_mul_ps(g, w), unit));
    }
    _mm512_mask_storeu_ps(s.dw + h0, mask, dw);
  }
}

}  // namespace sparsecp::kl_detail
