// Portable tile kernel (fp32): the same loop nest as the SIMD kernels, in plain C++.
#include "select_internal.hpp"

namespace sparsecp::select_detail {

void score_row_f32_portable(const ScoreRowArgs& args) {
  const int64_t dim = args.head_dim;
  const int64_t chunk = kChunkHeadsPortable;
  const auto* q_pack = static_cast<const float*>(args.q_pack);
  const auto* key_pack = static_cast<const float*>(args.key_pack);
  for (int64_t panel = 0; panel < args.panels; ++panel) {
    const float* keys = key_pack + panel * dim * kPanelKeys;
    float score[kPanelKeys] = {};
    for (int64_t h0 = 0; h0 < args.heads; h0 += chunk) {
      const float* q = q_pack + h0 * dim;  // heads h0.. in natural [head][dim] layout
      const int64_t count = args.heads - h0 < chunk ? args.heads - h0 : chunk;
      for (int64_t i = 0; i < count; ++i) {
        float dot[kPanelKeys] = {};
        for (int64_t d = 0; d < dim; ++d) {
          const float a = q[i * dim + d];
          for (int64_t lane = 0; lane < kPanelKeys; ++lane)
            dot[lane] += a * keys[d * kPanelKeys + lane];
        }
        const float w = args.weights[h0 + i];
        for (int64_t lane = 0; lane < kPanelKeys; ++lane) {
          score[lane] += w * (dot[lane] < 0.0f ? 0.0f : dot[lane]);
        }
      }
    }
    for (int64_t lane = 0; lane < kPanelKeys; ++lane)
      args.scores[panel * kPanelKeys + lane] = score[lane];
  }
}

}  // namespace sparsecp::select_detail
