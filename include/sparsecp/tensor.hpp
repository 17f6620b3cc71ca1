// sparsecp: the tensor vocabulary every layer shares — element types and
// non-owning views of dense row-major host memory.
//
// The library never owns a caller's tensors: kernels read MatrixViews, the exchange
// reads TensorViews (which keep the seed's [1, local tokens, width] shapes so its
// batch/axis checks apply as written); integer id tensors are IndexTensorViews. bf16
// values are raw IEEE bfloat16 bits in uint16_t (the upper half of an fp32); see
// kernels/bf16.hpp for conversions.
#pragma once

#include <cstdint>
#include <vector>

namespace sparsecp {

// Element type of a floating-point tensor.
enum class DType { kFloat32, kBFloat16 };

// Name of a dtype for messages: "float32" or "bfloat16".
constexpr const char* dtype_name(DType dtype) {
  return dtype == DType::kFloat32 ? "float32" : "bfloat16";
}

// Bytes of one element of `dtype` (4 for float32, 2 for bfloat16).
constexpr int64_t dtype_bytes(DType dtype) { return dtype == DType::kBFloat16 ? 2 : 4; }

// A non-owning dense row-major [rows, cols] matrix of fp32 or bf16 elements.
struct MatrixView {
  const void* data = nullptr;
  DType dtype = DType::kFloat32;
  int64_t rows = 0;
  int64_t cols = 0;

  static MatrixView f32(const float* values, int64_t rows, int64_t cols) {
    return {values, DType::kFloat32, rows, cols};
  }
  static MatrixView bf16(const uint16_t* values, int64_t rows, int64_t cols) {
    return {values, DType::kBFloat16, rows, cols};
  }
};

// A non-owning dense row-major tensor of any rank (the seed's owner inputs are
// [1, local tokens, width]; `shape` lets the seed's batch/axis checks apply as is).
struct TensorView {
  const void* data = nullptr;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;

  // A [1, rows, cols] view of a matrix: a batch-one token tensor.
  static TensorView tokens(MatrixView matrix) {
    return {matrix.data, matrix.dtype, {1, matrix.rows, matrix.cols}};
  }
};

// Element type of an integer index tensor (e.g. top-k key ids).
enum class IndexDType { kInt32, kInt64 };

// Name of an index dtype for messages: "int32" or "int64".
constexpr const char* index_dtype_name(IndexDType dtype) {
  return dtype == IndexDType::kInt32 ? "int32" : "int64";
}

// A non-owning dense row-major tensor of int32 or int64 ids, of any rank: what PyTorch
// hands over for `topk_indices` (the indexer's selections are int32 here, int64 in
// torch.topk's output; both are read as is, without a conversion copy).
struct IndexTensorView {
  const void* data = nullptr;
  IndexDType dtype = IndexDType::kInt32;
  std::vector<int64_t> shape;

  // Element i (row-major order), widened to int64.
  int64_t at(int64_t i) const {
    return dtype == IndexDType::kInt32 ? static_cast<const int32_t*>(data)[i]
                                       : static_cast<const int64_t*>(data)[i];
  }
};

}  // namespace sparsecp
