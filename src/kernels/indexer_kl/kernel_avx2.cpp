// AVX2 + FMA kernels of the indexer KL loss: the same contracts as the AVX-512 ones
// (indexer_kl_internal.hpp), with 8-lane ymm vectors. The fused driver (indexer_kl.cpp:
// row tiling, the gather of selected keys through row pointers, bf16 widening of the
// student keys, the block-ordered key-gradient commit) is shared by every ISA; this file
// holds only the per-ISA primitives.
//
// Compiled with -mavx2 -mfma (src/CMakeLists.txt); the driver checks the CPU first.
// Intrinsics and plain loops only (no std templates, no inline helpers from headers), so
// no AVX2 code can leak into inline functions shared with other translation units.
//
// GEMM register blocking: up to 2 vectors (16 lanes) x 6 rows = 12 ymm accumulators, or
// 1 vector x 12 rows. The depth is cut into kGemmDepthBlock blocks as in the AVX-512
// kernel; each C element is one FMA chain over k = 0..depth-1 in order.
#include <immintrin.h>

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include "gemm_driver.hpp"
#include "indexer_kl_internal.hpp"

namespace sparsecp::kl_detail {
namespace {

constexpr int64_t kDepthBlock = kGemmDepthBlock;

// Lanes [0, lanes) set (lanes clamped to [0, 8]), as a maskload/maskstore mask.
inline __m256i lane_mask(int64_t lanes) {
  const int n = lanes >= 8 ? 8 : static_cast<int>(lanes);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

inline int64_t row_block(int64_t vectors) { return vectors >= 2 ? 6 : 12; }

// C[i][j0 + l] (+)= sum_{k < depth} A_i[k * a_step] * B_k[j0 + l], i < MR, l < 8 * NV
// (the last vector's lanes per `last`).
template <int MR, int NV>
__attribute__((noinline)) void micro(const float* const* a, int64_t a_step, const float* const* b,
                                     int64_t j0, int64_t depth, float* c, int64_t ldc, __m256i last,
                                     bool accumulate) {
  const __m256i full = _mm256_set1_epi32(-1);
  __m256 acc[MR][NV];
  if (accumulate) {
#pragma GCC unroll 12
    for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 2
      for (int j = 0; j < NV; ++j) {
        acc[i][j] = _mm256_maskload_ps(c + i * ldc + j0 + 8 * j, j == NV - 1 ? last : full);
      }
    }
  } else {
#pragma GCC unroll 12
    for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 2
      for (int j = 0; j < NV; ++j) acc[i][j] = _mm256_setzero_ps();
    }
  }
  const float* rows[MR];
#pragma GCC unroll 12
  for (int i = 0; i < MR; ++i) rows[i] = a[i];
  for (int64_t k = 0; k < depth; ++k) {
    const float* brow = b[k] + j0;
    __m256 bv[NV];
#pragma GCC unroll 2
    for (int j = 0; j < NV - 1; ++j) bv[j] = _mm256_loadu_ps(brow + 8 * j);
    bv[NV - 1] = _mm256_maskload_ps(brow + 8 * (NV - 1), last);
    const int64_t at = k * a_step;
#pragma GCC unroll 12
    for (int i = 0; i < MR; ++i) {
      const __m256 av = _mm256_broadcast_ss(rows[i] + at);
#pragma GCC unroll 2
      for (int j = 0; j < NV; ++j) acc[i][j] = _mm256_fmadd_ps(av, bv[j], acc[i][j]);
    }
  }
#pragma GCC unroll 12
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 2
    for (int j = 0; j < NV - 1; ++j) _mm256_storeu_ps(c + i * ldc + j0 + 8 * j, acc[i][j]);
    _mm256_maskstore_ps(c + i * ldc + j0 + 8 * (NV - 1), last, acc[i][NV - 1]);
  }
}

using Micro = void (*)(const float* const*, int64_t, const float* const*, int64_t, int64_t, float*,
                       int64_t, __m256i, bool);

template <int MR>
struct MicroRow {
  static constexpr Micro fns[2] = {micro<MR, 1>, micro<MR, 2>};
};
constexpr const Micro* kMicro[12] = {MicroRow<1>::fns,  MicroRow<2>::fns,  MicroRow<3>::fns,
                                     MicroRow<4>::fns,  MicroRow<5>::fns,  MicroRow<6>::fns,
                                     MicroRow<7>::fns,  MicroRow<8>::fns,  MicroRow<9>::fns,
                                     MicroRow<10>::fns, MicroRow<11>::fns, MicroRow<12>::fns};

void widen_bf16(const uint16_t* src, int64_t step, int64_t count, float* dst) {
  int64_t k = 0;
  if (step == 1) {
    for (; k + 8 <= count; k += 8) {
      const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + k));
      _mm256_storeu_ps(dst + k,
                       _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16)));
    }
  }
  for (; k < count; ++k) {
    const uint32_t bits = static_cast<uint32_t>(src[k * step]) << 16;
    float value;
    __builtin_memcpy(&value, &bits, 4);
    dst[k] = value;
  }
}

// e^x for x <= 0: Cody-Waite reduction and a degree-6 polynomial as in the AVX-512
// kernel; 2^n is built in the exponent bits, so results below e^-87.33 (under FLT_MIN)
// are flushed to 0 instead of rounded to a denormal. NaN propagates.
inline __m256 exp_ps(__m256 x) {
  const __m256 low = _mm256_set1_ps(-87.33f);
  const __m256 underflow = _mm256_cmp_ps(x, low, _CMP_LT_OQ);  // false for NaN
  __m256 xc = _mm256_max_ps(low, x);                           // NaN passes (second operand)
  xc = _mm256_min_ps(_mm256_set1_ps(88.3f), xc);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.0f / 720.0f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i bits =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  const __m256 result = _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
  return _mm256_andnot_ps(underflow, result);
}

// Sum of the 8 lanes in a fixed order.
inline float reduce_add(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// This ISA's side of the shared GEMM blocking (gemm_driver.hpp).
struct Traits {
  static constexpr int64_t kLanes = 8;
  static constexpr int64_t kMaxVectors = 2;
  static constexpr auto lane_mask = kl_detail::lane_mask;
  static constexpr auto row_block = kl_detail::row_block;
  static constexpr auto widen_bf16 = kl_detail::widen_bf16;
  static constexpr const Micro* const* micro = kMicro;
};

}  // namespace

void gemm_avx2(const GemmArgs& g) { blocked_gemm<Traits>(g); }

void teacher_avx2(const TeacherArgs& t) {
  for (int64_t j = 0; j < t.slots; ++j) t.probabilities[j] = 0.0f;
  const __m256 scale = _mm256_set1_ps(t.scale);
  for (int64_t h0 = 0; h0 < t.heads; h0 += 8) {
    const __m256i mask = lane_mask(t.heads - h0);
    const __m256 sink = _mm256_maskload_ps(t.sinks + h0, mask);
    __m256 top = sink;
    for (int64_t j = 0; j < t.slots; ++j) {
      const __m256 l = _mm256_mul_ps(scale, _mm256_maskload_ps(t.logits + j * t.ldl + h0, mask));
      top = _mm256_max_ps(l, top);
    }
    __m256 z = exp_ps(_mm256_sub_ps(sink, top));
    for (int64_t j = 0; j < t.slots; ++j) {
      float* row = t.logits + j * t.ldl + h0;
      const __m256 e = exp_ps(_mm256_fmsub_ps(scale, _mm256_maskload_ps(row, mask), top));
      _mm256_maskstore_ps(row, mask, e);
      z = _mm256_add_ps(z, e);
    }
    const __m256 inverse =
        _mm256_and_ps(_mm256_div_ps(_mm256_set1_ps(1.0f), z), _mm256_castsi256_ps(mask));
    for (int64_t j = 0; j < t.slots; ++j) {
      const __m256 e = _mm256_maskload_ps(t.logits + j * t.ldl + h0, mask);
      t.probabilities[j] += reduce_add(_mm256_mul_ps(e, inverse));
    }
  }
}

void scores_avx2(const ScoreArgs& s) {
  const __m256 zero = _mm256_setzero_ps();
  for (int64_t j = 0; j < s.slots; ++j) {
    __m256 acc = zero;
    for (int64_t h0 = 0; h0 < s.heads; h0 += 8) {
      const __m256i mask = lane_mask(s.heads - h0);
      const __m256 z = _mm256_maskload_ps(s.z + j * s.ldz + h0, mask);
      // ReLU as max(0, z): VMAXPS returns its second operand on NaN, so NaN passes.
      acc = _mm256_fmadd_ps(_mm256_maskload_ps(s.weights + h0, mask), _mm256_max_ps(zero, z), acc);
    }
    s.scores[j] = reduce_add(acc);
  }
}

void student_backward_avx2(const StudentBackwardArgs& s) {
  const __m256 zero = _mm256_setzero_ps();
  for (int64_t h0 = 0; h0 < s.heads; h0 += 8) {
    const __m256i mask = lane_mask(s.heads - h0);
    const __m256 w = _mm256_maskload_ps(s.weights + h0, mask);
    __m256 dw = zero;
    for (int64_t j = 0; j < s.slots; ++j) {
      float* row = s.z + j * s.ldz + h0;
      const __m256 z = _mm256_maskload_ps(row, mask);
      const __m256 g = _mm256_set1_ps(s.g[j]);
      dw = _mm256_fmadd_ps(g, _mm256_max_ps(zero, z), dw);  // NaN z passes
      // dz = g * w * [z > 0] as a product (as in torch): a NaN g or w stays NaN.
      const __m256 unit = _mm256_and_ps(_mm256_cmp_ps(z, zero, _CMP_GT_OQ), _mm256_set1_ps(1.0f));
      _mm256_maskstore_ps(row, mask, _mm256_mul_ps(_mm256_mul_ps(g, w), unit));
    }
    _mm256_maskstore_ps(s.dw + h0, mask, dw);
  }
}

}  // namespace sparsecp::kl_detail
