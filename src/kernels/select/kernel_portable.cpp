// Portable tile kernel (fp32): the same loop nest as the SIMD kernels, in plain C++.
#include "select_internal.hpp"

namespace sparsecp::select_detail {
namespace {

// Register blocking as in the AVX2 kernel, sized for the x86-64 baseline: HR heads x
// one 16-key panel of dot products held in registers across the whole head_dim loop.
// The lanes are GCC/Clang vector types of 4 floats (SSE2 at the baseline, whatever the
// target has elsewhere): left to itself, GCC 12 -O3 vectorises the head_dim loop with
// strided gathers instead and runs 16x behind the AVX2 kernel. 2 heads x 4 vectors =
// 8 accumulators, the panel's 4 and a broadcast: 13 of the 16 xmm registers. Each dot
// product is one multiply-add chain over d = 0..head_dim-1 in order (never fused: the
// baseline has no FMA), and the score sums heads in order h = 0..H-1, as the contract
// in select_internal.hpp requires.
using Lanes = float __attribute__((vector_size(16)));
constexpr int kVectors = static_cast<int>(kPanelKeys) / 4;

inline Lanes load(const float* p) {
  Lanes v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}

template <int HR>
inline void chunk(const float* q, int64_t dim, const float* keys, const float* w, Lanes* score) {
  Lanes acc[HR][kVectors] = {};
  for (int64_t d = 0; d < dim; ++d) {
    Lanes k[kVectors];
    for (int v = 0; v < kVectors; ++v) k[v] = load(keys + d * kPanelKeys + 4 * v);
    for (int i = 0; i < HR; ++i) {
      const float a = q[i * dim + d];
      for (int v = 0; v < kVectors; ++v) acc[i][v] += a * k[v];
    }
  }
  const Lanes zero = {};
  for (int i = 0; i < HR; ++i) {
    // ReLU as (dot < 0 ? 0 : dot): a NaN dot product passes, as in the SIMD kernels.
    for (int v = 0; v < kVectors; ++v) score[v] += w[i] * (acc[i][v] < zero ? zero : acc[i][v]);
  }
}

}  // namespace

void score_row_f32_portable(const ScoreRowArgs& args) {
  constexpr int kChunk = static_cast<int>(kChunkHeadsPortable);
  const int64_t dim = args.head_dim;
  const auto* q = static_cast<const float*>(args.q_pack);
  const auto* key_pack = static_cast<const float*>(args.key_pack);
  const int64_t full = args.heads / kChunk * kChunk;
  for (int64_t panel = 0; panel < args.panels; ++panel) {
    const float* keys = key_pack + panel * dim * kPanelKeys;
    Lanes score[kVectors] = {};
    for (int64_t h = 0; h < full; h += kChunk)
      chunk<kChunk>(q + h * dim, dim, keys, args.weights + h, score);
    for (int64_t h = full; h < args.heads; ++h)
      chunk<1>(q + h * dim, dim, keys, args.weights + h, score);
    __builtin_memcpy(args.scores + panel * kPanelKeys, score, sizeof score);
  }
}

}  // namespace sparsecp::select_detail
