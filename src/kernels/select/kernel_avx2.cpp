// AVX2 + FMA tile kernel (fp32). A 16-key panel is two ymm registers; 6 heads x 2
// halves = 12 accumulators. Compiled with -mavx2 -mfma; intrinsics and plain loops only.
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

constexpr int kChunk = static_cast<int>(kChunkHeadsAvx2);

template <int HR>
inline void chunk(const float* q, int64_t dim, const float* keys, const float* w, __m256* score) {
  __m256 acc[HR][2];
#pragma GCC unroll 6
  for (int i = 0; i < HR; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  for (int64_t d = 0; d < dim; ++d) {
    const __m256 k0 = _mm256_load_ps(keys + d * kPanelKeys);
    const __m256 k1 = _mm256_load_ps(keys + d * kPanelKeys + 8);
#pragma GCC unroll 6
    for (int i = 0; i < HR; ++i) {
      const __m256 a = _mm256_broadcast_ss(q + i * dim + d);
      acc[i][0] = _mm256_fmadd_ps(a, k0, acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(a, k1, acc[i][1]);
    }
  }
  const __m256 zero = _mm256_setzero_ps();
#pragma GCC unroll 6
  for (int i = 0; i < HR; ++i) {
    const __m256 weight = _mm256_broadcast_ss(w + i);
    score[0] = _mm256_fmadd_ps(weight, _mm256_max_ps(zero, acc[i][0]), score[0]);
    score[1] = _mm256_fmadd_ps(weight, _mm256_max_ps(zero, acc[i][1]), score[1]);
  }
}

}  // namespace

void score_row_f32_avx2(const ScoreRowArgs& args) {
  const int64_t dim = args.head_dim;
  const auto* q = static_cast<const float*>(args.q_pack);
  const int64_t full = args.heads / kChunk * kChunk;
  for (int64_t panel = 0; panel < args.panels; ++panel) {
    const float* keys = static_cast<const float*>(args.key_pack) + panel * dim * kPanelKeys;
    __m256 score[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t h = 0; h < full; h += kChunk) {
      chunk<kChunk>(q + h * dim, dim, keys, args.weights + h, score);
    }
    const float* qt = q + full * dim;
    const float* wt = args.weights + full;
    switch (args.heads - full) {
      case 1:
        chunk<1>(qt, dim, keys, wt, score);
        break;
      case 2:
        chunk<2>(qt, dim, keys, wt, score);
        break;
      case 3:
        chunk<3>(qt, dim, keys, wt, score);
        break;
      case 4:
        chunk<4>(qt, dim, keys, wt, score);
        break;
      case 5:
        chunk<5>(qt, dim, keys, wt, score);
        break;
      default:
        break;
    }
    _mm256_storeu_ps(args.scores + panel * kPanelKeys, score[0]);
    _mm256_storeu_ps(args.scores + panel * kPanelKeys + 8, score[1]);
  }
}

}  // namespace sparsecp::select_detail
