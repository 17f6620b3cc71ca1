// sparsecp._core sparse attention: the forward and backward kernels
// (kernels/sparse_attention.hpp) on caller-owned arrays, in place.
//
// The autograd function and custom op around these calls are in
// python/sparsecp/torch/attention.py. Inputs arrive as DLPack arrays (CPU torch tensors) and
// are read where they are: the binding checks dtype and C-contiguity and the shapes' agreement,
// and never copies; the library checks values (ids in range, a finite scale). Outputs are
// written into arrays the caller allocated. The GIL is released while the kernel runs.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "bindings.hpp"
#include "sparsecp/error.hpp"
#include "sparsecp/kernels/sparse_attention.hpp"

namespace sparsecp::python {
namespace {

AttentionDType attention_dtype(const CpuInput& array, const char* name) {
  if (array.dtype() == nb::dtype<float>()) return AttentionDType::kFloat32;
  if (array.dtype() == kBFloat16) return AttentionDType::kBFloat16;
  if (array.dtype() == nb::dtype<double>()) return AttentionDType::kFloat64;
  SPARSECP_FAIL("sparse attention ", name, " must be float32, bfloat16 or float64");
}

template <typename Array>
const void* checked(const Array& array, const char* name, size_t ndim) {
  SPARSECP_CHECK(array.ndim() == ndim, "sparse attention ", name, " must have ", ndim,
                 " dimensions, got shape ", shape_text(array));
  SPARSECP_CHECK(c_contiguous(array), "sparse attention ", name,
                 " must be C-contiguous, got shape ", shape_text(array), " with other strides");
  return array.data();
}

// Checks an array's dtype (the call's dtype, or its accumulation type) and shape.
template <typename Array>
void expect(const Array& array, const char* name, AttentionDType dtype, bool accumulate,
            std::initializer_list<int64_t> shape) {
  const bool wide = dtype == AttentionDType::kFloat64;
  const nb::dlpack::dtype want = accumulate ? (wide ? nb::dtype<double>() : nb::dtype<float>())
                                 : dtype == AttentionDType::kFloat32  ? nb::dtype<float>()
                                 : dtype == AttentionDType::kBFloat16 ? kBFloat16
                                                                      : nb::dtype<double>();
  SPARSECP_CHECK(array.dtype() == want, "sparse attention ", name, " has the wrong dtype for a ",
                 attention_dtype_name(dtype), " call");
  checked(array, name, shape.size());
  size_t i = 0;
  for (const int64_t extent : shape) {
    SPARSECP_CHECK(static_cast<int64_t>(array.shape(i)) == extent, "sparse attention ", name,
                   " has shape ", shape_text(array), ", dimension ", i, " should be ", extent);
    ++i;
  }
}

SparseAttentionInputs inputs_of(const CpuInput& q, const CpuInput& kv, const CpuInput& indices,
                                const std::optional<CpuInput>& sinks, double scale,
                                int64_t value_dim) {
  SparseAttentionInputs in;
  in.dtype = attention_dtype(q, "q");
  in.q = checked(q, "q", 3);
  in.kv = checked(kv, "kv", 2);
  in.indices = static_cast<const int32_t*>(checked(indices, "indices", 2));
  SPARSECP_CHECK(indices.dtype() == nb::dtype<int32_t>(), "sparse attention indices must be int32");
  in.rows = static_cast<int64_t>(q.shape(0));
  in.heads = static_cast<int64_t>(q.shape(1));
  in.qk_dim = static_cast<int64_t>(q.shape(2));
  in.keys = static_cast<int64_t>(kv.shape(0));
  in.columns = static_cast<int64_t>(indices.shape(1));
  in.value_dim = value_dim;
  in.scale = scale;
  expect(kv, "kv", in.dtype, false, {in.keys, in.qk_dim});
  SPARSECP_CHECK(static_cast<int64_t>(indices.shape(0)) == in.rows,
                 "sparse attention indices has shape ", shape_text(indices),
                 ", dimension 0 should be q's rows ", in.rows);
  if (sinks.has_value()) {
    expect(*sinks, "sinks", in.dtype, true, {in.heads});
    in.sinks = sinks->data();
  }
  return in;
}

SparseAttentionConfig config_of(int threads, std::string_view isa, std::string_view gemm,
                                int64_t scratch_bytes = 0) {
  SparseAttentionConfig config;
  config.threads = threads;
  SPARSECP_CHECK(scratch_bytes >= 0, "sparse attention scratch_bytes must be non-negative, got ",
                 scratch_bytes);
  if (scratch_bytes > 0) config.scratch_bytes = static_cast<std::size_t>(scratch_bytes);
  config.isa = parse_isa(isa);
  if (gemm == "auto") {
    config.gemm = AttentionGemm::kAuto;
  } else if (gemm == "onednn") {
    config.gemm = AttentionGemm::kOneDnn;
  } else if (gemm == "blas") {
    config.gemm = AttentionGemm::kBlas;
  } else if (gemm == "direct") {
    config.gemm = AttentionGemm::kDirect;
  } else {
    throw nb::value_error(("sparse attention gemm must be 'auto', 'onednn', 'blas' or 'direct', got '" +
                           std::string(gemm) + "'")
                              .c_str());
  }
  return config;
}

AttentionDType parse_dtype(std::string_view name) {
  if (name == "float32") return AttentionDType::kFloat32;
  if (name == "bfloat16") return AttentionDType::kBFloat16;
  if (name == "float64") return AttentionDType::kFloat64;
  throw nb::value_error(
      ("dtype must be 'float32', 'bfloat16' or 'float64', got '" + std::string(name) + "'")
          .c_str());
}

}  // namespace

void bind_attention(nb::module_& m) {
  m.def(
      "sparse_attention_forward",
      [](const CpuInput& q, const CpuInput& kv, const CpuInput& indices,
         const std::optional<CpuInput>& sinks, const CpuArray& out, const CpuArray& lse,
         double scale, int64_t value_dim, int threads, std::string_view isa, std::string_view gemm,
         int64_t scratch_bytes) {
        const SparseAttentionInputs in = inputs_of(q, kv, indices, sinks, scale, value_dim);
        const SparseAttentionConfig config = config_of(threads, isa, gemm, scratch_bytes);
        expect(out, "out", in.dtype, false, {in.rows, in.heads, in.value_dim});
        expect(lse, "lse", in.dtype, true, {in.rows, in.heads});
        nb::gil_scoped_release release;
        sparse_attention_forward(in, config, out.data(), lse.data());
      },
      nb::arg("q"), nb::arg("kv"), nb::arg("indices"), nb::arg("sinks").none(), nb::arg("out"),
      nb::arg("lse"), nb::arg("scale"), nb::arg("value_dim"), nb::arg("threads") = 0,
      nb::arg("isa") = "auto", nb::arg("gemm") = "auto", nb::arg("scratch_bytes") = 0,
      "Sparse attention forward (kernels/sparse_attention.hpp): q [rows, heads, qk_dim], kv [keys, "
      "qk_dim] "
      "(float32, bfloat16 or float64), indices [rows, columns] int32 (-1: none), sinks [heads] or "
      "None "
      "(float32; float64 for float64 calls); writes out [rows, heads, value_dim] and lse [rows, "
      "heads]. "
      "scratch_bytes: per-thread budget that sets the rows of a block (0: the default, 1 MiB).");
  m.def(
      "sparse_attention_backward",
      [](const CpuInput& q, const CpuInput& kv, const CpuInput& indices,
         const std::optional<CpuInput>& sinks, const CpuInput& out, const CpuInput& lse,
         const CpuInput& grad_out, const CpuArray& grad_q, const CpuArray& grad_kv,
         const std::optional<CpuArray>& grad_sinks, double scale, int64_t value_dim, int threads,
         std::string_view isa, std::string_view gemm, int64_t scratch_bytes) {
        const SparseAttentionInputs in = inputs_of(q, kv, indices, sinks, scale, value_dim);
        const SparseAttentionConfig config = config_of(threads, isa, gemm, scratch_bytes);
        expect(out, "out", in.dtype, false, {in.rows, in.heads, in.value_dim});
        expect(lse, "lse", in.dtype, true, {in.rows, in.heads});
        expect(grad_out, "grad_out", in.dtype, false, {in.rows, in.heads, in.value_dim});
        expect(grad_q, "grad_q", in.dtype, false, {in.rows, in.heads, in.qk_dim});
        expect(grad_kv, "grad_kv", in.dtype, true, {in.keys, in.qk_dim});
        void* sink_grad = nullptr;
        if (in.sinks != nullptr) {
          SPARSECP_CHECK(grad_sinks.has_value(),
                         "sparse attention grad_sinks is needed with sinks");
          expect(*grad_sinks, "grad_sinks", in.dtype, true, {in.heads});
          sink_grad = grad_sinks->data();
        }
        nb::gil_scoped_release release;
        sparse_attention_backward(in, config, out.data(), lse.data(), grad_out.data(),
                                  grad_q.data(), grad_kv.data(), sink_grad);
      },
      nb::arg("q"), nb::arg("kv"), nb::arg("indices"), nb::arg("sinks").none(), nb::arg("out"),
      nb::arg("lse"), nb::arg("grad_out"), nb::arg("grad_q"), nb::arg("grad_kv"),
      nb::arg("grad_sinks").none(), nb::arg("scale"), nb::arg("value_dim"), nb::arg("threads") = 0,
      nb::arg("isa") = "auto", nb::arg("gemm") = "auto", nb::arg("scratch_bytes") = 0,
      "Sparse attention backward: from the forward's out and lse and grad_out, writes grad_q (the "
      "call's dtype), "
      "grad_kv [keys, qk_dim] and grad_sinks [heads] (float32; float64 for float64 calls). grad_kv "
      "is summed "
      "in row order whatever the thread count.");
  m.def(
      "sparse_attention_gemm",
      [](std::string_view dtype, std::string_view gemm, int64_t heads) {
        SPARSECP_CHECK(heads >= 0, "sparse attention heads must be non-negative, got ", heads);
        return std::string(sparse_attention_gemm_name(parse_dtype(dtype),
                                                      config_of(0, "auto", gemm).gemm, heads));
      },
      nb::arg("dtype") = "bfloat16", nb::arg("gemm") = "auto", nb::arg("heads") = 0,
      "What multiplies a sparse attention call of this dtype and head count (0: more than 8): "
      "'onednn <version>', 'blas' or 'direct' (float32 with 1, 2, 4 or 8 heads: the kernel's own "
      "loops, reading each row's kv rows in place).");
}

}  // namespace sparsecp::python
