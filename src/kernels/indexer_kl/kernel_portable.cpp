// Portable kernels of the indexer KL loss: the same contracts as the AVX-512 ones, in
// plain C++ (the compiler vectorises the inner loops for whatever the build targets).
#include <cmath>
#include <cstring>

#include "indexer_kl_internal.hpp"

namespace sparsecp::kl_detail {

void gemm_portable(const GemmArgs& g) {
  for (int64_t i = 0; i < g.m; ++i) {
    float* c = g.c + i * g.ldc;
    for (int64_t j = 0; j < g.n; ++j) c[j] = 0.0f;
    const bool bf16 = g.a_dtype == DType::kBFloat16;
    const auto* a32 = static_cast<const float*>(g.a[i]);
    const auto* a16 = static_cast<const uint16_t*>(g.a[i]);
    for (int64_t k = 0; k < g.depth; ++k) {
      const float a = bf16 ? std::bit_cast<float>(static_cast<uint32_t>(a16[k * g.a_step]) << 16)
                           : a32[k * g.a_step];
      const float* b = g.b[k];
      for (int64_t j = 0; j < g.n; ++j) c[j] = std::fma(a, b[j], c[j]);
    }
  }
}

void teacher_portable(const TeacherArgs& t) {
  for (int64_t j = 0; j < t.slots; ++j) t.probabilities[j] = 0.0f;
  for (int64_t h = 0; h < t.heads; ++h) {
    float top = t.sinks[h];
    for (int64_t j = 0; j < t.slots; ++j) top = std::fmax(top, t.scale * t.logits[j * t.ldl + h]);
    float z = std::exp(t.sinks[h] - top);
    for (int64_t j = 0; j < t.slots; ++j) {
      float& l = t.logits[j * t.ldl + h];
      l = std::exp(std::fma(t.scale, l, -top));
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
      sum = std::fma(s.weights[h], z > 0.0f ? z : 0.0f, sum);
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
      const bool active = z[h] > 0.0f;
      s.dw[h] = std::fma(g, active ? z[h] : 0.0f, s.dw[h]);
      z[h] = active ? g * s.weights[h] : 0.0f;
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
