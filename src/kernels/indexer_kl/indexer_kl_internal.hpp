// Private to the indexer KL component: validated shapes, element access, and the
// interface of the per-ISA kernels the fused driver calls.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

#include "sparsecp/kernels/indexer_kl.hpp"

namespace sparsecp::kl_detail {

// --- validation shared by the fast path, the reference and the size queries --------

// The extents of a validated call (names as in indexer_kl.hpp).
struct KlShape {
  int64_t batch = 0;       // B
  int64_t rows = 0;        // S
  int64_t heads = 0;       // H
  int64_t head_dim = 0;    // D
  int64_t index_keys = 0;  // Ki (index_key rows)
  int64_t att_heads = 0;   // Hm
  int64_t att_dim = 0;     // Dm
  int64_t keys = 0;        // K (compact bank rows)
  int64_t topk = 0;        // T
  int64_t offset = 0;      // main_key_offset
};

// Checks everything indexer_kl.hpp lists. `gradients` null: spans are not checked.
// `check_ids`: also every id (skipped anyway when loss_coeff == 0).
KlShape validate_indexer_kl(const IndexerKlInputs& inputs, const IndexerKlOptions& options,
                            const IndexerKlGradients* gradients, bool check_ids);

// Element i (row-major) of a float view, widened to fp32 (exact for bf16).
inline float element(const TensorView& view, int64_t i) {
  if (view.dtype == DType::kFloat32) return static_cast<const float*>(view.data)[i];
  return std::bit_cast<float>(static_cast<uint32_t>(static_cast<const uint16_t*>(view.data)[i])
                              << 16);
}

// --- kernels --------------------------------------------------------------------------
//
// GEMM over row pointers: C[i][j] = sum_k A_i[k * a_step] * B_k[j] for i < m, j < n,
// k < depth, with A_i = a[i] and B_k = b[k]; C row-major with row stride ldc (C is
// overwritten). A elements are fp32 or bf16 (widened exactly), B is fp32. The sum runs
// over k in order 0..depth-1 (one FMA chain per C element in the SIMD kernels, one
// multiply-add chain in the portable one): a C element's bits do not
// depend on m, n or its position. The four products of the loss are this one shape:
//   teacher  [slots, Hm] = Katt rows (A, via the ids)  x  qatt^T of the row (B rows)
//   student  [slots, H]  = Kidx rows (A)               x  q^T of the row
//   dq       [H, D]      = dz^T columns (A, step H)    x  Kidx rows (B, via the ids)
//   dK       [slots, D]  = dz^T rows (A)               x  q rows
struct GemmArgs {
  const void* const* a = nullptr;
  DType a_dtype = DType::kFloat32;
  int64_t a_step = 1;
  const float* const* b = nullptr;
  float* c = nullptr;
  int64_t ldc = 0;
  int64_t m = 0;
  int64_t n = 0;
  int64_t depth = 0;
  float* a_buffer = nullptr;  // kGemmRowBlock * kGemmDepthBlock floats when a_dtype is bf16
};
inline constexpr int64_t kGemmRowBlock = 12;     // the most A rows one micro-kernel call takes
inline constexpr int64_t kGemmDepthBlock = 128;  // depth handled per pass over B

// The same product with bf16 pairs (AVX512_BF16 VDPBF16PS): C[i][j] = sum_p
// A_i[2p] * B[p][j][0] + A_i[2p+1] * B[p][j][1], p < depth / 2 (depth even), A rows
// contiguous bf16, B packed as [depth / 2][ldb][2] bf16 (ldb >= n, a multiple of 16,
// padding zero). Products are exact; the accumulation is fp32.
struct PairGemmArgs {
  const uint16_t* const* a = nullptr;
  const uint16_t* b = nullptr;
  int64_t ldb = 0;
  float* c = nullptr;
  int64_t ldc = 0;
  int64_t m = 0;
  int64_t n = 0;
  int64_t depth = 0;  // even
};

// Teacher probabilities of one row from its logit tile l [slots][ldl] (heads in a row):
//   m_h = max(sink[h], max_j scale * l[j][h]),  e[j][h] = exp(scale * l[j][h] - m_h),
//   Z_h = exp(sink[h] - m_h) + sum_j e[j][h],  P[j] = sum_h e[j][h] / Z_h.
// Overwrites l with e. Sums over j and h run in index order within each lane layout.
struct TeacherArgs {
  float* logits = nullptr;
  int64_t ldl = 0;
  int64_t slots = 0;
  int64_t heads = 0;
  float scale = 1.0f;
  const float* sinks = nullptr;
  float* probabilities = nullptr;  // [slots]
};

// Student scores: I[j] = sum_h w[h] * ReLU(z[j][h]) for z [slots][ldz].
struct ScoreArgs {
  const float* z = nullptr;
  int64_t ldz = 0;
  int64_t slots = 0;
  int64_t heads = 0;
  const float* weights = nullptr;
  float* scores = nullptr;  // [slots]
};

// Student backward, in place: dw[h] = sum_j g[j] * ReLU(z[j][h]) (j in order), then
// z[j][h] <- g[j] * w[h] * [z[j][h] > 0] (dz, kept in the [slots][heads] layout).
struct StudentBackwardArgs {
  float* z = nullptr;
  int64_t ldz = 0;
  int64_t slots = 0;
  int64_t heads = 0;
  const float* weights = nullptr;
  const float* g = nullptr;
  float* dw = nullptr;  // [heads]
};

// Transpose of a [rows][cols] matrix of 32-bit elements, row r at src + r * stride
// (in source elements), into dst[c * ld + r]. With widen_bf16 the source elements are
// bf16 (uint16) and are widened to fp32; otherwise they are copied bit for bit (fp32, or
// a pair of bf16 viewed as one uint32: the pair GEMM's B packing).
struct TransposeArgs {
  const void* src = nullptr;
  int64_t stride = 0;
  bool widen_bf16 = false;
  int64_t rows = 0;
  int64_t cols = 0;
  void* dst = nullptr;
  int64_t ld = 0;
};

// A kernel set; the driver picks one per call (indexer_kl.cpp).
struct KlKernels {
  void (*gemm)(const GemmArgs&) = nullptr;
  void (*pair_gemm)(const PairGemmArgs&) = nullptr;  // null: bf16 factors are widened
  void (*teacher)(const TeacherArgs&) = nullptr;
  void (*scores)(const ScoreArgs&) = nullptr;
  void (*student_backward)(const StudentBackwardArgs&) = nullptr;
  void (*transpose)(const TransposeArgs&) = nullptr;
};

// Implemented in kernel_*.cpp; each file is compiled for its ISA, and its functions
// must only be called when the CPU supports it.
void gemm_portable(const GemmArgs& args);
void teacher_portable(const TeacherArgs& args);
void scores_portable(const ScoreArgs& args);
void student_backward_portable(const StudentBackwardArgs& args);
void transpose_portable(const TransposeArgs& args);

void gemm_avx2(const GemmArgs& args);  // -mavx2 -mfma
void teacher_avx2(const TeacherArgs& args);
void scores_avx2(const ScoreArgs& args);
void student_backward_avx2(const StudentBackwardArgs& args);

void gemm_avx512(const GemmArgs& args);
void teacher_avx512(const TeacherArgs& args);
void scores_avx512(const ScoreArgs& args);
void student_backward_avx512(const StudentBackwardArgs& args);
void transpose_avx512(const TransposeArgs& args);
void pair_gemm_avx512_bf16(const PairGemmArgs& args);  // VDPBF16PS: needs AVX512_BF16
// The same loops with each VDPBF16PS replaced by two AVX-512F FMAs (odd pair element
// first, as the instruction's definition adds them). Bit-identical to VDPBF16PS except
// for denormals (which VDPBF16PS flushes). Tests use it to exercise the pair packing on
// AVX-512 CPUs without AVX512_BF16.
void pair_gemm_avx512_emulated(const PairGemmArgs& args);

// Tests only: with `enabled`, kAvx512 calls use pair_gemm_avx512_emulated for bf16
// forward products where the CPU lacks AVX512_BF16 (instead of widening to fp32).
// Set it between calls, never during one.
void set_bf16_pair_emulation_for_testing(bool enabled);

}  // namespace sparsecp::kl_detail
