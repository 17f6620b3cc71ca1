// The attention kernel's softmax passes compiled for the avx2 ISA (row_ops.inc).
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "row_ops.hpp"

namespace sparsecp::attention_detail {
namespace {
#include "row_ops.inc"
}  // namespace

RowOps row_ops_avx2() {
  return {softmax, logit_gradient, scatter_add, gather_bytes, widen, narrow, dot_f32, dot_bf16};
}

}  // namespace sparsecp::attention_detail
