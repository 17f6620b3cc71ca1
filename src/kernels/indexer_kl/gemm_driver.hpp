// Private to the indexer KL component: the blocking of the SIMD GEMMs (GemmArgs,
// indexer_kl_internal.hpp), shared by the AVX2 and AVX-512 kernels. An ISA supplies its
// micro-kernel table and vector width; this loop nest cuts the depth into
// kGemmDepthBlock blocks, C's rows into micro-kernel row blocks and its columns into
// blocks of the ISA's widest micro-kernel, and widens bf16 A rows once per block.
//
// Included only by kernel_<isa>.cpp, each compiled with its own ISA flags. Everything
// here is a template of the ISA's traits type, which each kernel file defines in an
// anonymous namespace: every instantiation has internal linkage, so no code built for
// one ISA can be merged (ODR) into a caller of another.
//
// The traits type Isa provides (static constexpr members):
//   kLanes, kMaxVectors   floats per vector (8, 16); vectors in the widest micro-kernel
//   lane_mask(lanes)      the ISA's mask of lanes [0, lanes) of the last vector
//   row_block(vectors)    rows per micro-kernel call when the widest block has `vectors`
//   widen_bf16(src, step, count, dst)   count bf16 at stride step -> fp32
//   micro[rows - 1][vectors - 1](a, a_step, b, j0, depth, c, ldc, last, accumulate):
//                         C[i][j0 + l] (+)= sum_k A_i[k * a_step] * B_k[j0 + l], a table
//                         with every (rows <= 12, vectors <= kMaxVectors) entry
#pragma once

#include <cstdint>

#include "indexer_kl_internal.hpp"

namespace sparsecp::kl_detail {

template <class Isa>
void blocked_gemm(const GemmArgs& g) {
  if (g.m == 0 || g.n == 0) return;
  if (g.depth == 0) {
    for (int64_t i = 0; i < g.m; ++i) {
      for (int64_t j = 0; j < g.n; ++j) g.c[i * g.ldc + j] = 0.0f;
    }
    return;
  }
  constexpr int64_t kWidest = Isa::kLanes * Isa::kMaxVectors;  // columns per block
  const int64_t widest = g.n >= kWidest ? Isa::kMaxVectors : (g.n + Isa::kLanes - 1) / Isa::kLanes;
  const int64_t block = Isa::row_block(widest);
  const bool widen = g.a_dtype == DType::kBFloat16;
  const float* rows[kGemmRowBlock];
  for (int64_t k0 = 0; k0 < g.depth; k0 += kGemmDepthBlock) {
    const int64_t depth = g.depth - k0 < kGemmDepthBlock ? g.depth - k0 : kGemmDepthBlock;
    const float* const* b = g.b + k0;
    for (int64_t i0 = 0; i0 < g.m; i0 += block) {
      const int64_t mr = g.m - i0 < block ? g.m - i0 : block;
      for (int64_t i = 0; i < mr; ++i) {
        if (widen) {
          float* dst = g.a_buffer + i * kGemmDepthBlock;
          Isa::widen_bf16(static_cast<const uint16_t*>(g.a[i0 + i]) + k0 * g.a_step, g.a_step,
                          depth, dst);
          rows[i] = dst;
        } else {
          rows[i] = static_cast<const float*>(g.a[i0 + i]) + k0 * g.a_step;
        }
      }
      const int64_t step = widen ? 1 : g.a_step;
      for (int64_t j0 = 0; j0 < g.n; j0 += kWidest) {
        const int64_t lanes = g.n - j0 < kWidest ? g.n - j0 : kWidest;
        const int64_t nv = (lanes + Isa::kLanes - 1) / Isa::kLanes;
        // A narrower block in a call whose blocks are wider still takes `block` rows: the
        // micro-kernel table has every (rows <= 12, vectors <= kMaxVectors) entry.
        Isa::micro[mr - 1][nv - 1](rows, step, b, j0, depth, g.c + i0 * g.ldc, g.ldc,
                                   Isa::lane_mask(lanes - Isa::kLanes * (nv - 1)), k0 > 0);
      }
    }
  }
}

}  // namespace sparsecp::kl_detail
