// Private to the sparse attention kernel: one description of a batched matrix product, run
// by oneDNN's matmul primitive (where built) or by the linked BLAS, one batch entry at a time.
// The attention driver (sparse_attention.cpp) states each product once, in this form.
#pragma once

#include <cstdint>

namespace sparsecp::attention_detail {

enum class Element { kFloat32, kBFloat16, kFloat64 };

// A batch of matrices in row-major storage. An operand that is `transposed` is stored as
// its transpose (cols x rows of the product's view) with leading dimension `ld`.
struct Operand {
  const void* data = nullptr;
  int64_t batch_stride = 0;  // elements between batch entries
  int64_t ld = 0;            // elements between stored rows
  bool transposed = false;
};

// C[b] = A[b] (m x k) * B[b] (k x n) (+ C[b] when `accumulate`), b in [0, batch).
// A and B are `in`; C is float32 for float32 and bf16 inputs, float64 for float64.
struct BatchedGemm {
  Element in = Element::kFloat32;
  int64_t batch = 0;
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  Operand a;
  Operand b;
  void* c = nullptr;
  int64_t c_batch_stride = 0;
  int64_t ldc = 0;
  bool accumulate = false;
};

// Runs `gemm` on the calling thread (inside the driver's own parallel region, oneDNN and the
// BLAS run single-threaded). `onednn` must only be true where onednn_built() and `in` is
// float32 or bf16; bf16 with the BLAS is not supported (the driver widens instead).
void run_gemm(const BatchedGemm& gemm, bool onednn);

bool onednn_built();
// Whether oneDNN multiplies `in` at all on this CPU (oneDNN 2.6 has no bf16 products without
// AVX-512). False without oneDNN.
bool onednn_runs(Element in);
// Whether oneDNN multiplies `in` with an optimised implementation on this CPU (not its
// reference loops, which it falls back to where it has none, e.g. bf16 on some AVX2-only
// CPUs): checked once per element type on a probe shape. False without oneDNN.
bool onednn_fast(Element in);
// Whether that optimised implementation runs on the CPU's matrix units (AMX tiles), read from
// the probe's implementation name. False without oneDNN.
bool onednn_uses_amx(Element in);
// "onednn 2.6.3" (the library's version at run time) or "blas".
const char* gemm_library_name(bool onednn);

}  // namespace sparsecp::attention_detail
