// sparsecp._core indexer KL: the fused loss + gradients (kernels/indexer_kl.hpp) on
// caller-owned arrays, in place.
//
// Seed: hyper_parallel's `shared_compressed_indexer_kl_loss` (the autograd function around
// this call is python/sparsecp/torch/kl.py). Inputs arrive as DLPack arrays (CPU torch
// tensors or numpy arrays) and are read where they are: the binding checks device, dtype
// and C-contiguity, turns each into a view with its shape, and never copies; the library
// checks ranks, extents and ids with the seed's texts. The three gradients are written
// into float32 arrays the caller allocated. The GIL is released while the kernel runs.
#include "sparsecp/kernels/indexer_kl.hpp"

#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "bindings.hpp"
#include "sparsecp/error.hpp"

namespace sparsecp::python {
namespace {

std::vector<int64_t> shape_of(const CpuInput& array) {
  std::vector<int64_t> shape(array.ndim());
  for (size_t i = 0; i < array.ndim(); ++i) shape[i] = static_cast<int64_t>(array.shape(i));
  return shape;
}

// A float32 or bfloat16 C-contiguous array as a view with its shape.
TensorView float_view(const CpuInput& array, const char* name) {
  SPARSECP_CHECK(c_contiguous(array), "Indexer KL ", name, " must be C-contiguous, got shape ",
                 shape_text(array), " with other strides");
  const std::optional<DType> dtype = float_dtype(array);
  SPARSECP_CHECK(dtype.has_value(), "Indexer KL ", name,
                 " must be float32 or bfloat16 for the fused kernel");
  return {array.data(), *dtype, shape_of(array)};
}

// int32 or int64 ids, C-contiguous, as a view with its shape.
IndexTensorView id_view(const CpuInput& array) {
  SPARSECP_CHECK(c_contiguous(array), "Indexer KL topk_indices must be C-contiguous, got shape ",
                 shape_text(array), " with other strides");
  IndexDType dtype = IndexDType::kInt32;
  if (array.dtype() == nb::dtype<int32_t>()) {
    dtype = IndexDType::kInt32;
  } else if (array.dtype() == nb::dtype<int64_t>()) {
    dtype = IndexDType::kInt64;
  } else {
    SPARSECP_FAIL("Indexer KL topk_indices must be int32 or int64");
  }
  return {array.data(), dtype, shape_of(array)};
}

// A writable C-contiguous float32 array as a span of all its elements (the library checks
// the element count against its input's shape).
std::span<float> gradient_span(const CpuArray& array, const char* name) {
  SPARSECP_CHECK(array.dtype() == nb::dtype<float>(), "Indexer KL ", name, " must be float32");
  SPARSECP_CHECK(c_contiguous(array), "Indexer KL ", name, " must be C-contiguous");
  return {static_cast<float*>(array.data()), array.size()};
}

IndexerKlInputs inputs_of(const CpuInput& index_query, const CpuInput& index_key,
                          const CpuInput& merge_weight, const CpuInput& attention_query,
                          const CpuInput& compressed_key, const CpuInput& topk_indices,
                          const CpuInput& sinks) {
  return {float_view(index_query, "index_query"),
          float_view(index_key, "index_key"),
          float_view(merge_weight, "merge_weight"),
          float_view(attention_query, "attention_query"),
          float_view(compressed_key, "compressed_key"),
          id_view(topk_indices),
          float_view(sinks, "sinks")};
}

IndexerKlOptions options_of(double attention_scale, double loss_coeff, int64_t main_key_offset,
                            int threads, std::string_view isa) {
  IndexerKlOptions options;
  options.attention_scale = attention_scale;
  options.loss_coeff = loss_coeff;
  options.main_key_offset = main_key_offset;
  options.threads = threads;
  options.isa = parse_isa(isa);
  return options;
}

}  // namespace

void bind_indexer_kl(nb::module_& m) {
  m.def(
      "indexer_kl_loss",
      [](const CpuInput& index_query, const CpuInput& index_key, const CpuInput& merge_weight,
         const CpuInput& attention_query, const CpuInput& compressed_key,
         const CpuInput& topk_indices, const CpuInput& sinks, const CpuArray& grad_index_query,
         const CpuArray& grad_index_key, const CpuArray& grad_merge_weight, double attention_scale,
         double loss_coeff, int64_t main_key_offset, int threads, std::string_view isa,
         bool reference, bool any_topk) {
        const IndexerKlInputs inputs =
            inputs_of(index_query, index_key, merge_weight, attention_query, compressed_key,
                      topk_indices, sinks);
        IndexerKlOptions options =
            options_of(attention_scale, loss_coeff, main_key_offset, threads, isa);
        options.any_topk = any_topk;
        const IndexerKlGradients gradients{gradient_span(grad_index_query, "grad_index_query"),
                                           gradient_span(grad_index_key, "grad_index_key"),
                                           gradient_span(grad_merge_weight, "grad_merge_weight")};
        nb::gil_scoped_release release;
        return reference ? indexer_kl_loss_reference(inputs, options, gradients)
                         : indexer_kl_loss(inputs, options, gradients);
      },
      nb::arg("index_query"), nb::arg("index_key"), nb::arg("merge_weight"),
      nb::arg("attention_query"), nb::arg("compressed_key"), nb::arg("topk_indices"),
      nb::arg("sinks"), nb::arg("grad_index_query"), nb::arg("grad_index_key"),
      nb::arg("grad_merge_weight"), nb::arg("attention_scale"), nb::arg("loss_coeff"),
      nb::arg("main_key_offset") = 0, nb::arg("threads") = 0, nb::arg("isa") = "auto",
      nb::arg("reference") = false, nb::arg("any_topk") = false,
      "Fused indexer KL loss + gradients (kernels/indexer_kl.hpp indexer_kl_loss; seed "
      "shared_compressed_indexer_kl_loss): returns the loss and writes the three float32 "
      "gradients. index_query [B, S, H, D], index_key [B, Ki, D], merge_weight [B, S, H], "
      "attention_query [B, Hm, S, Dm], compressed_key [B, K, Dm], topk_indices [B, S, T] "
      "int32/int64 (-1 padded), sinks [Hm]; float inputs fp32 or bf16; C-contiguous CPU "
      "arrays, read in place. reference=True runs the double-precision reference instead. "
      "any_topk=True waives the seed's TopK512 rule (1 <= TopK <= 512: a model's own index_topk).");
  m.def(
      "indexer_kl_scratch_bytes",
      [](const CpuInput& index_query, const CpuInput& index_key, const CpuInput& merge_weight,
         const CpuInput& attention_query, const CpuInput& compressed_key,
         const CpuInput& topk_indices, const CpuInput& sinks, int64_t main_key_offset, int threads,
         std::string_view isa, bool any_topk) {
        const IndexerKlInputs inputs =
            inputs_of(index_query, index_key, merge_weight, attention_query, compressed_key,
                      topk_indices, sinks);
        IndexerKlOptions options = options_of(1.0, 1.0, main_key_offset, threads, isa);
        options.any_topk = any_topk;
        return indexer_kl_scratch_bytes(inputs, options);
      },
      nb::arg("index_query"), nb::arg("index_key"), nb::arg("merge_weight"),
      nb::arg("attention_query"), nb::arg("compressed_key"), nb::arg("topk_indices"),
      nb::arg("sinks"), nb::arg("main_key_offset") = 0, nb::arg("threads") = 0,
      nb::arg("isa") = "auto", nb::arg("any_topk") = false,
      "Upper bound of indexer_kl_loss's scratch bytes for these shapes, dtypes and threads "
      "(0: OpenMP's default); independent of B and S (indexer_kl_scratch_bytes). any_topk as in "
      "indexer_kl_loss.");
}

}  // namespace sparsecp::python
