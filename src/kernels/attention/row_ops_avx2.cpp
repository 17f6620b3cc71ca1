// The attention kernel's softmax passes compiled for the avx2 ISA (row_ops.inc).
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "row_ops.hpp"

namespace sparsecp::attention_detail {
namespace {
#include "row_ops.inc"
// after row_ops.inc, whose helpers it uses; 8 floats a vector (direct_rows.inc says why)
#define SPARSECP_DIRECT_LANES 8
#include "direct_rows.inc"
#undef SPARSECP_DIRECT_LANES
}  // namespace

RowOps row_ops_avx2() {
  return {softmax,  logit_gradient, scatter_add,         gather_bytes,       widen, narrow, dot_f32,
          dot_bf16, direct_dots,    direct_weighted_sum, direct_key_gradient};
}

}  // namespace sparsecp::attention_detail
