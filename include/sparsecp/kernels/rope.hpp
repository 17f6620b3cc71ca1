// DeepSeek-V4's interleaved rotary position embedding, in one pass over a tensor.
//
// The model (transformers' apply_rotary_pos_emb) rotates the trailing rope_dim channels of every
// head in pairs and copies the leading ones; written there as separate tensor operations, it
// makes many passes over tensors as large as the indexer's query (rows x 32 or 64 heads x 128
// values). This kernel computes the same numbers in one pass: for pair i of a row (channels
// 2i, 2i+1 of the rope part), with c = cos[i], s = sin[i] of the row,
//
//   forward:  out[2i] = x[2i] * c - x[2i+1] * s        out[2i+1] = x[2i+1] * c + x[2i] * s
//   inverse:  out[2i] = x[2i] * c + x[2i+1] * s        out[2i+1] = x[2i+1] * c - x[2i] * s
//
// (the inverse is the forward's transpose: the gradient), each product rounded to float32 and
// then their sum or difference, as the model's separate multiplications and addition round them
// (no fused multiply-add). Tested equal to the model's function, forward and backward, in
// python/tests/test_v4_rope.py.
#pragma once

#include <cstdint>

namespace sparsecp {

// x and out are [batch, heads, rows, dim] with element strides for the first three dimensions
// (dim contiguous; any layout, e.g. a [batch, rows, heads, dim] tensor seen transposed); cos and
// sin are [batch, rows, rope_dim / 2] with strides for the first two (the last contiguous; a
// batch stride of 0 shares one table). out's elements are distinct and overlap neither cos, sin
// nor x, except out == x with x's strides (in place: each pair is read before it is written).
struct InterleavedRopeArgs {
  const float* x = nullptr;
  int64_t x_strides[3] = {0, 0, 0};
  float* out = nullptr;
  int64_t out_strides[3] = {0, 0, 0};
  const float* cos = nullptr;
  const float* sin = nullptr;
  int64_t table_strides[2] = {0, 0};
  int64_t batch = 0;
  int64_t heads = 0;
  int64_t rows = 0;
  int64_t dim = 0;
  int64_t rope_dim = 0;  // even, at most dim: the trailing channels rotated
  bool inverse = false;
  int threads = 0;  // 0 = OpenMP's default; at most kMaxRopeThreads
};

inline constexpr int kMaxRopeThreads = 4096;

// Throws Error naming the bad value: negative extents, rope_dim odd or above dim, null pointers
// with elements, threads outside [0, kMaxRopeThreads].
void interleaved_rope(const InterleavedRopeArgs& args);

}  // namespace sparsecp
