// Portable kernels of the indexer KL loss: the same contracts as the AVX-512 ones, in
// plain C++ (the compiler vectorises the inner loops for whatever the build targets).
// No std::fma: at the x86-64 baseline (no FMA instruction) it is a call to fmaf per
// element.
#include <bit>
#include <cmath>
#include <cstring>

#include "indexer_kl_internal.hpp"

namespace sparsecp::kl_detail {

namespace {

// Register blocking of the portable GEMM: MR rows x kLanes columns of C held in a local
// array across the whole depth, so that the compiler keeps them in vector registers and
// vectorises the column loop for whatever the build targets (SSE2 at the x86-64
// baseline: 4 rows x 8 columns = 8 xmm accumulators). Each C element is one
// multiply-add chain over k = 0..depth-1 in order (fused only where the build's ISA
// has FMA and the compiler contracts; never a call to fmaf).
constexpr int64_t kLanes = 8;
constexpr int64_t kRows = 4;

// Element k of A row `row` (fp32, or bf16 widened exactly).
inline float a_at(const GemmArgs& g, int64_t row, int64_t k) {
  if (g.a_dtype == DType::kBFloat16) {
    return std::bit_cast<float>(
        static_cast<uint32_t>(static_cast<const uint16_t*>(g.a[row])[k * g.a_step]) << 16);
  }
  return static_cast<const float*>(g.a[row])[k * g.a_step];
}

template <int MR>
void block_full(const GemmArgs& g, int64_t i0, int64_t j0) {
  float acc[MR][kLanes] = {};
  for (int64_t k = 0; k < g.depth; ++k) {
    const float* b = g.b[k] + j0;
    float bk[kLanes];
    for (int64_t l = 0; l < kLanes; ++l) bk[l] = b[l];
    for (int i = 0; i < MR; ++i) {
      const float a = a_at(g, i0 + i, k);
      for (int64_t l = 0; l < kLanes; ++l) acc[i][l] += a * bk[l];
    }
  }
  for (int i = 0; i < MR; ++i) {
    float* c = g.c + (i0 + i) * g.ldc + j0;
    for (int64_t l = 0; l < kLanes; ++l) c[l] = acc[i][l];
  }
}

// Columns [j0, n) with n - j0 < kLanes: the same chains, fewer lanes.
template <int MR>
void block_tail(const GemmArgs& g, int64_t i0, int64_t j0) {
  const int64_t lanes = g.n - j0;
  float acc[MR][kLanes] = {};
  for (int64_t k = 0; k < g.depth; ++k) {
    const float* b = g.b[k] + j0;
    for (int i = 0; i < MR; ++i) {
      const float a = a_at(g, i0 + i, k);
      for (int64_t l = 0; l < lanes; ++l) acc[i][l] += a * b[l];
    }
  }
  for (int i = 0; i < MR; ++i) {
    float* c = g.c + (i0 + i) * g.ldc + j0;
    for (int64_t l = 0; l < lanes; ++l) c[l] = acc[i][l];
  }
}

template <int MR>
void row_block(const GemmArgs& g, int64_t i0) {
  int64_t j0 = 0;
  for (; j0 + kLanes <= g.n; j0 += kLanes) block_full<MR>(g, i0, j0);
  if (j0 < g.n) block_tail<MR>(g, i0, j0);
}

}  // namespace

void gemm_portable(const GemmArgs& g) {
  int64_t i0 = 0;
  for (; i0 + kRows <= g.m; i0 += kRows) row_block<kRows>(g, i0);
  switch (g.m - i0) {
    case 1:
      row_block<1>(g, i0);
      break;
    case 2:
      row_block<2>(g, i0);
      break;
    case 3:
      row_block<3>(g, i0);
      break;
    default:
      break;
  }
}

void teacher_portable(const TeacherArgs& t) {
  for (int64_t j = 0; j < t.slots; ++j) t.probabilities[j] = 0.0f;
  for (int64_t h = 0; h < t.heads; ++h) {
    float top = t.sinks[h];
    for (int64_t j = 0; j < t.slots; ++j) {
      // A comparison, not fmaxf (a call at the baseline ISA). A NaN logit is skipped
      // here and reaches z through its exp below, as in the SIMD kernels.
      const float l = t.scale * t.logits[j * t.ldl + h];
      top = l > top ? l : top;
    }
    float z = std::exp(t.sinks[h] - top);
    for (int64_t j = 0; j < t.slots; ++j) {
      float& l = t.logits[j * t.ldl + h];
      l = std::exp(t.scale * l - top);
      z += l;
    }
    const float inverse = 1.0f / z;
    for (int64_t j = 0; j < t.slots; ++j) t.probabilities[j] += t.logits[j * t.ldl + h] * inverse;
  }
}

void scores_portable(const ScoreArgs& s) {
  for (int64_t j = 0; j < s.slots; ++j) {
    float sum = 0.0f;
    for (int64_t h = 0; h < s.heads; ++h) {
      const float z = s.z[j * s.ldz + h];
      sum += s.weights[h] * (z < 0.0f ? 0.0f : z);  // ReLU; NaN passes
    }
    s.scores[j] = sum;
  }
}

void student_backward_portable(const StudentBackwardArgs& s) {
  for (int64_t h = 0; h < s.heads; ++h) s.dw[h] = 0.0f;
  for (int64_t j = 0; j < s.slots; ++j) {
    float* z = s.z + j * s.ldz;
    const float g = s.g[j];
    for (int64_t h = 0; h < s.heads; ++h) {
      const float relu = z[h] < 0.0f ? 0.0f : z[h];  // NaN passes
      const float mask = z[h] > 0.0f ? 1.0f : 0.0f;
      s.dw[h] += g * relu;
      z[h] = g * s.weights[h] * mask;  // a product, as in torch: NaN g or w stays NaN
    }
  }
}

void transpose_portable(const TransposeArgs& t) {
  // Elements are copied with memcpy: the source may be fp32 (or bf16 pairs) memory.
  auto* dst = static_cast<char*>(t.dst);
  for (int64_t r = 0; r < t.rows; ++r) {
    for (int64_t c = 0; c < t.cols; ++c) {
      uint32_t value = 0;
      if (t.widen_bf16) {
        value = uint32_t{static_cast<const uint16_t*>(t.src)[r * t.stride + c]} << 16;
      } else {
        std::memcpy(&value, static_cast<const char*>(t.src) + (r * t.stride + c) * 4, 4);
      }
      std::memcpy(dst + (c * t.ld + r) * 4, &value, 4);
    }
  }
}

}  // namespace sparsecp::kl_detail
