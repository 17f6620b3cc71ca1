// The interleaved rotary embedding (rope.hpp). Plain loops: the pass is bound by memory, and this
// file is compiled without floating-point contraction (the project's ISO C++ mode), so every
// product is rounded before its sum as in the model.
#include "sparsecp/kernels/rope.hpp"

#include <omp.h>

#include <algorithm>

#include "sparsecp/error.hpp"

namespace sparsecp {

void interleaved_rope(const InterleavedRopeArgs& a) {
  SPARSECP_CHECK(a.batch >= 0 && a.heads >= 0 && a.rows >= 0 && a.dim >= 0,
                 "interleaved rope extents must be non-negative, got batch ", a.batch, ", heads ",
                 a.heads, ", rows ", a.rows, ", dim ", a.dim);
  SPARSECP_CHECK(a.rope_dim >= 0 && a.rope_dim % 2 == 0 && a.rope_dim <= a.dim,
                 "interleaved rope rope_dim must be even and in [0, dim ", a.dim, "], got ",
                 a.rope_dim);
  SPARSECP_CHECK(a.threads >= 0 && a.threads <= kMaxRopeThreads,
                 "interleaved rope threads must be in [0, ", kMaxRopeThreads, "], got ", a.threads);
  const int64_t units = a.batch * a.heads * a.rows;
  if (units == 0 || a.dim == 0) return;
  SPARSECP_CHECK(a.x != nullptr && a.out != nullptr, "interleaved rope x or out is null");
  SPARSECP_CHECK(a.rope_dim == 0 || (a.cos != nullptr && a.sin != nullptr),
                 "interleaved rope cos or sin is null");
  const int64_t nope = a.dim - a.rope_dim, pairs = a.rope_dim / 2;
  const int threads =
      static_cast<int>(std::min<int64_t>(a.threads > 0 ? a.threads : omp_get_max_threads(), units));
  const float sign = a.inverse ? -1.0f : 1.0f;  // exact: it only flips the sign of a product
  // Units in x's memory order (its outer dimensions by decreasing stride): a [batch, rows,
  // heads, dim] tensor seen as [batch, heads, rows, dim] is read and written front to back.
  const int64_t extent[3] = {a.batch, a.heads, a.rows};
  int order[3] = {0, 1, 2};
  std::stable_sort(order, order + 3, [&](int p, int q) { return a.x_strides[p] > a.x_strides[q]; });
  const int64_t inner = extent[order[2]], middle = extent[order[1]];
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t unit = 0; unit < units; ++unit) {
    int64_t index[3];
    index[order[2]] = unit % inner;
    index[order[1]] = unit / inner % middle;
    index[order[0]] = unit / (inner * middle);
    const int64_t b = index[0], h = index[1], r = index[2];
    const float* x = a.x + b * a.x_strides[0] + h * a.x_strides[1] + r * a.x_strides[2];
    float* out = a.out + b * a.out_strides[0] + h * a.out_strides[1] + r * a.out_strides[2];
    for (int64_t i = 0; i < nope; ++i) out[i] = x[i];
    if (pairs == 0) continue;
    const int64_t table = b * a.table_strides[0] + r * a.table_strides[1];
    const float* c = a.cos + table;
    const float* s = a.sin + table;
    const float* xr = x + nope;
    float* o = out + nope;
    for (int64_t i = 0; i < pairs; ++i) {
      const float even = xr[2 * i], odd = xr[2 * i + 1];
      const float ec = even * c[i], os = odd * s[i], oc = odd * c[i], es = even * s[i];
      o[2 * i] = ec - sign * os;
      o[2 * i + 1] = oc + sign * es;
    }
  }
}

}  // namespace sparsecp
