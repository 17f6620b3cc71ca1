// sparsecp: sparse attention over each query row's own listed keys, forward and backward, on
// the contract every DSA kernel shares (FlashMLA's sparse forward, cuDNN-frontend's DSA
// backward, Megatron-LM's DSA backends). Compute only: no communication.
//
// The contract. Shapes: q [rows, heads, qk_dim] token-major; kv [keys, qk_dim], one key
// row shared by every head, whose first value_dim columns are the value (DeepSeek-V4's
// K=V: value_dim == qk_dim; V3.2's absorbed MLA: 576 / 512); indices [rows, columns]
// int32, each an id into kv or -1 for no key (a key listed twice in one row counts twice);
// sinks [heads] or none. For row r and head h, with s_c = scale * q[r,h] . kv[indices[r,c]]
// over the row's valid columns c,
//   L[r,h]   = log(sum_c exp(s_c) + exp(sinks[h]))      (no sink term without sinks)
//   out[r,h] = sum_c exp(s_c - L) * kv[indices[r,c], :value_dim]
//   lse[r,h] = log(sum_c exp(s_c))                       (the keys only; -inf with no key)
// A row with no valid column outputs zeros. The sink is a logit with no value: its
// probability is dropped. Gradients: d q, d kv (summed over every listing of a key), d sinks.
//
// The FlashAttention recipe. The forward keeps out and lse; the backward recomputes each
// row block's probabilities from lse and the sink and uses Delta = rowsum(dO * O). Rows go
// in blocks; a block gathers each row's listed kv rows once into per-thread scratch whose
// size is fixed by the shape (columns, dims, heads), never by the number of rows
// (sparse_attention_scratch_bytes). The key gradient is accumulated in row order, then
// column order, whatever the thread count: it is bit-identical across runs and threads.
//
// Products. float32 and bfloat16 products run through oneDNN's matmul primitive where the
// build has oneDNN (it picks AMX, AVX512_BF16 or AVX-512 at run time; bf16 operands,
// float32 accumulation), else through the linked BLAS (bf16 widened to float32 exactly).
// float64 (for tests and float64 models) runs through the BLAS. The softmax passes run the
// kernels' ISA (isa.hpp: portable, avx2, avx512). sparse_attention_gemm_name() says which
// library ran.
//
// Precision. float32: products and softmax in float32. bfloat16: q, kv, the probabilities
// and the logit gradient enter the products as bf16 (as FlashAttention does), products
// accumulate in float32, out and d q are rounded to bf16 once; lse, d kv and d sinks stay
// float32. float64: everything in float64.
//
// NaN and infinity propagate: a NaN in a row's logits makes that row's output NaN; it never
// reaches other rows except through a key gradient they share.
#pragma once

#include <cstddef>
#include <cstdint>

#include "sparsecp/kernels/isa.hpp"

namespace sparsecp {

// Element type of q, kv, out, d out and d q. The accumulation type (lse, sinks, d kv,
// d sinks) is float64 for kFloat64 and float32 otherwise.
enum class AttentionDType { kFloat32, kBFloat16, kFloat64 };

// Name for messages: "float32", "bfloat16", "float64".
const char* attention_dtype_name(AttentionDType dtype);

// One call's inputs. Pointers are to dense row-major arrays of the shapes above; `sinks`
// may be null (no sink). Elements of q and kv are `dtype`; sinks are the accumulation type.
struct SparseAttentionInputs {
  AttentionDType dtype = AttentionDType::kFloat32;
  int64_t rows = 0;
  int64_t heads = 0;
  int64_t qk_dim = 0;
  int64_t value_dim = 0;
  int64_t keys = 0;
  int64_t columns = 0;
  const void* q = nullptr;
  const void* kv = nullptr;
  const int32_t* indices = nullptr;
  const void* sinks = nullptr;
  double scale = 1.0;
};

// Which products: kAuto takes the direct loops (kDirect) for float32 with 1, 2, 4 or 8 heads on
// the avx512 and avx2 ISAs (faster there than oneDNN's products; not on the portable ISA, where
// they were not measured) and otherwise a library:
// oneDNN where built and where it has an optimised implementation of the dtype on this CPU (not its
// reference loops: bf16 on some AVX2-only CPUs has none), unless the environment variable
// SPARSECP_ATTENTION_GEMM is "blas"; else the BLAS (bf16 widened to float32 exactly).
// SPARSECP_ATTENTION_GEMM "blas" or "onednn" also puts that library in place of kAuto's direct
// loops. kDirect: each query row's kv rows read where they lie in kv (no gathered copy) by the
// ISA's vector loops; float32 with 1, 2, 4 or 8 heads only, where a row's products are
// matrix-vector shapes and a library call a row cost more than its arithmetic (measured:
// docs/RESULTS.md, "Sparse attention"). Never changes the contract; results may differ between
// choices in the last bits of real values, never between thread counts.
enum class AttentionGemm { kAuto, kOneDnn, kBlas, kDirect };

struct SparseAttentionConfig {
  int threads = 0;  // 0 = OpenMP's default. Never changes results.
  KernelIsa isa = KernelIsa::kAuto;
  AttentionGemm gemm = AttentionGemm::kAuto;
  // Per-thread scratch budget in bytes; sets the rows of a block (at least one row, at most
  // 16). The default keeps a block's working set near a core's L2: on an AMX Xeon it ran at
  // 0.91-1.23x (median about 1.03) the rate of 16 MiB at V4-Flash's shape and at 4 heads of 64
  // (python/benchmarks/attention_speed.py --chunk-bytes 1048576,16777216), with a sixteenth
  // of the scratch.
  std::size_t scratch_bytes = std::size_t{1} << 20;
};

// Throws Error naming the bad value unless: heads, qk_dim >= 1; 1 <= value_dim <= qk_dim;
// rows, keys, columns >= 0; scale finite; every index in [-1, keys); pointers non-null
// where their arrays are non-empty; config's ISA runs on this CPU; threads in
// [0, kMaxAttentionThreads]; the gemm asked for is built and multiplies the dtype on this CPU
// (kOneDnn: not bfloat16 where oneDNN has no bf16 products, as oneDNN 2.6 without AVX-512;
// kDirect: float32 with 1, 2, 4 or 8 heads).
void validate_sparse_attention(const SparseAttentionInputs& inputs,
                               const SparseAttentionConfig& config);

inline constexpr int kMaxAttentionThreads = 4096;

// Forward. out: [rows, heads, value_dim] of `dtype`; lse: [rows, heads] accumulation type.
// Validates first (nothing is written when validation fails).
void sparse_attention_forward(const SparseAttentionInputs& inputs,
                              const SparseAttentionConfig& config, void* out, void* lse);

// Backward from the forward's out and lse and the output gradient grad_out
// ([rows, heads, value_dim], `dtype`). grad_q: [rows, heads, qk_dim] of `dtype`;
// grad_kv: [keys, qk_dim] accumulation type, overwritten; grad_sinks: [heads] accumulation
// type, overwritten (may be null when inputs.sinks is null).
void sparse_attention_backward(const SparseAttentionInputs& inputs,
                               const SparseAttentionConfig& config, const void* out,
                               const void* lse, const void* grad_out, void* grad_q, void* grad_kv,
                               void* grad_sinks);

// The plain reference: loops over rows, heads and columns in float64, whatever `dtype`
// (inputs are widened exactly). Outputs are written in float64: out [rows, heads,
// value_dim], lse [rows, heads]; grad_* as in the backward, in float64 (grad_out given
// in `dtype`). For tests.
void sparse_attention_reference(const SparseAttentionInputs& inputs, double* out, double* lse);
void sparse_attention_reference_backward(const SparseAttentionInputs& inputs, const void* grad_out,
                                         double* grad_q, double* grad_kv, double* grad_sinks);

// Rows per block and the per-thread scratch bytes a call of this shape uses.
int64_t sparse_attention_block_rows(const SparseAttentionInputs& inputs,
                                    const SparseAttentionConfig& config);
std::size_t sparse_attention_scratch_bytes(const SparseAttentionInputs& inputs,
                                           const SparseAttentionConfig& config);

// Whether this build's oneDNN multiplies `dtype` on this CPU (never float64; bfloat16 not in
// oneDNN 2.6 without AVX-512), and what `gemm` resolves to for `dtype` with `heads` (0: not
// given, which kAuto reads as more than 8 heads): "onednn <version>", "blas" or "direct".
// Throws InvalidInputError, as a call would, for kDirect with a dtype or head count it cannot
// take and for kOneDnn with a dtype oneDNN cannot multiply here (sparse_attention_block_rows
// and _scratch_bytes too).
bool sparse_attention_has_onednn(AttentionDType dtype = AttentionDType::kFloat32);
const char* sparse_attention_gemm_name(AttentionDType dtype,
                                       AttentionGemm gemm = AttentionGemm::kAuto,
                                       int64_t heads = 0);

}  // namespace sparsecp
