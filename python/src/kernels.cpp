// sparsecp._core kernels: the CPU selection kernels on caller-owned arrays, in place.
//
// Inputs arrive as DLPack arrays (CPU torch tensors or numpy arrays) and are read where
// they are: the binding checks dtype, device and C-contiguity and never copies. Outputs
// are written into arrays the caller allocated (int32 ids, fp32 projections). The GIL is
// released while a kernel runs.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "bindings.hpp"
#include "sparsecp/error.hpp"
#include "sparsecp/kernels/rope.hpp"
#include "sparsecp/kernels/select.hpp"
#include "sparsecp/kernels/tnd_plan.hpp"

namespace sparsecp::python {
namespace {

static_assert(sizeof(TndSequence) == 6 * sizeof(int64_t), "TndSequence must be six int64 values");

// A [shape[0], prod(shape[1:])] view of a C-contiguous fp32 or bf16 array of rank >= 2.
MatrixView matrix(const CpuInput& array, const char* what) {
  SPARSECP_CHECK(array.ndim() >= 2, what, " must have at least 2 dimensions, got shape ",
                 shape_text(array));
  SPARSECP_CHECK(c_contiguous(array), what, " must be C-contiguous");
  const std::optional<DType> dtype = float_dtype(array);
  SPARSECP_CHECK(dtype.has_value(), what, " must be float32 or bfloat16");
  int64_t cols = 1;
  for (size_t i = 1; i < array.ndim(); ++i) cols *= static_cast<int64_t>(array.shape(i));
  return MatrixView{array.data(), *dtype, static_cast<int64_t>(array.shape(0)), cols};
}

// The writable element span of a C-contiguous array of `T` with `rows` x `cols` elements.
template <typename T>
std::span<T> output(const CpuArray& array, const char* what, int64_t rows, int64_t cols) {
  SPARSECP_CHECK(array.dtype() == nb::dtype<T>(), what, " has the wrong dtype");
  SPARSECP_CHECK(c_contiguous(array), what, " must be C-contiguous");
  SPARSECP_CHECK(array.ndim() == 2 && static_cast<int64_t>(array.shape(0)) == rows &&
                     static_cast<int64_t>(array.shape(1)) == cols,
                 what, " must have shape [", rows, ", ", cols, "], got ", shape_text(array));
  return {static_cast<T*>(array.data()), static_cast<size_t>(rows * cols)};
}

std::span<const Segment> segments_of(const SegmentArray& segments) {
  SPARSECP_CHECK(segments.shape(1) == 5,
                 "segments must be [n, 5] (q_begin, q_end, key_begin, key_end, residual)");
  return {reinterpret_cast<const Segment*>(segments.data()), segments.shape(0)};
}

SelectConfig config_of(int64_t heads, int64_t head_dim, int64_t rope_dim, int64_t ratio,
                       int64_t topk, int threads, std::string_view isa) {
  return make_select_config(heads, head_dim, rope_dim, topk, ratio, threads, parse_isa(isa));
}

WeightLayout layout_of(bool out_in) { return out_in ? WeightLayout::kOutIn : WeightLayout::kInOut; }

}  // namespace

KernelIsa parse_isa(std::string_view name) { return parse_kernel_isa(name, "isa"); }

void bind_kernels(nb::module_& m) {
  m.def(
      "interleaved_rope",
      [](const CpuInput& x, const CpuInput& cos, const CpuInput& sin, const CpuArray& out,
         bool inverse, int threads) {
        SPARSECP_CHECK(x.dtype() == nb::dtype<float>() && cos.dtype() == nb::dtype<float>() &&
                           sin.dtype() == nb::dtype<float>() && out.dtype() == nb::dtype<float>(),
                       "interleaved rope takes float32 x, cos, sin and out");
        SPARSECP_CHECK(x.ndim() == 4 && out.ndim() == 4,
                       "interleaved rope x and out must be [batch, heads, rows, dim], got ",
                       shape_text(x), " and ", shape_text(out));
        for (size_t i = 0; i < 4; ++i) {
          SPARSECP_CHECK(out.shape(i) == x.shape(i), "interleaved rope out ", shape_text(out),
                         " must have x's shape ", shape_text(x));
        }
        SPARSECP_CHECK(cos.ndim() == 3 && sin.ndim() == 3,
                       "interleaved rope cos and sin must be [batch, rows, rope_dim / 2], got ",
                       shape_text(cos), " and ", shape_text(sin));
        const auto batch = static_cast<int64_t>(x.shape(0));
        for (const CpuInput* table : {&cos, &sin}) {
          SPARSECP_CHECK((table->shape(0) == 1 || static_cast<int64_t>(table->shape(0)) == batch) &&
                             table->shape(1) == x.shape(2) && table->shape(2) == cos.shape(2) &&
                             (table->shape(2) <= 1 || table->stride(2) == 1),
                         "interleaved rope cos / sin ", shape_text(*table), " must be [1 or batch ",
                         batch, ", rows ", x.shape(2),
                         ", rope_dim / 2] with its last dimension contiguous");
        }
        SPARSECP_CHECK(cos.shape(0) == sin.shape(0),
                       "interleaved rope cos and sin must have the same shape, got ",
                       shape_text(cos), " and ", shape_text(sin));
        SPARSECP_CHECK(cos.stride(0) == sin.stride(0) && cos.stride(1) == sin.stride(1),
                       "interleaved rope cos and sin must share their strides");
        SPARSECP_CHECK(
            (x.shape(3) <= 1 || x.stride(3) == 1) && (out.shape(3) <= 1 || out.stride(3) == 1),
            "interleaved rope x and out must have their last dimension contiguous");
        bool in_place = out.data() == x.data();
        for (size_t i = 0; i < 4; ++i) in_place = in_place && out.stride(i) == x.stride(i);
        SPARSECP_CHECK(distinct_elements(out) && disjoint(out, cos) && disjoint(out, sin) &&
                           (in_place || disjoint(out, x)),
                       "interleaved rope out must not overlap itself, nor its memory span "
                       "cos's, sin's or x's (out may be x itself, with x's strides)");
        InterleavedRopeArgs a;
        a.x = static_cast<const float*>(x.data());
        a.out = static_cast<float*>(out.data());
        a.cos = static_cast<const float*>(cos.data());
        a.sin = static_cast<const float*>(sin.data());
        for (size_t i = 0; i < 3; ++i) {
          a.x_strides[i] = x.stride(i);
          a.out_strides[i] = out.stride(i);
        }
        a.table_strides[0] = cos.shape(0) == 1 ? 0 : cos.stride(0);
        a.table_strides[1] = cos.stride(1);
        a.batch = batch;
        a.heads = static_cast<int64_t>(x.shape(1));
        a.rows = static_cast<int64_t>(x.shape(2));
        a.dim = static_cast<int64_t>(x.shape(3));
        a.rope_dim = 2 * static_cast<int64_t>(cos.shape(2));
        a.inverse = inverse;
        a.threads = threads;
        nb::gil_scoped_release release;
        interleaved_rope(a);
      },
      nb::arg("x"), nb::arg("cos"), nb::arg("sin"), nb::arg("out"), nb::arg("inverse") = false,
      nb::arg("threads") = 0,
      "DeepSeek-V4's interleaved RoPE of x's trailing 2 * cos.shape[-1] channels into out "
      "(x, out: float32 [batch, heads, rows, dim], any strides but the last; cos, sin: [1 or "
      "batch, rows, rope_dim / 2]); inverse: the transpose (the gradient). The model's roundings.");

  m.def(
      "select_topk",
      [](const CpuInput& q, const CpuInput& weights, const CpuInput& keys,
         const SegmentArray& segments, const CpuArray& out, int64_t heads, int64_t head_dim,
         int64_t ratio, int64_t topk, int threads, std::string_view isa) {
        const SelectConfig config = config_of(heads, head_dim, 0, ratio, topk, threads, isa);
        const MatrixView q_view = matrix(q, "query");
        const MatrixView w_view = matrix(weights, "weights");
        const MatrixView k_view = matrix(keys, "key");
        const auto out_span = output<int32_t>(out, "out", q_view.rows, topk);
        const auto segment_span = segments_of(segments);
        nb::gil_scoped_release release;
        select_topk(q_view, w_view, k_view, segment_span, config, out_span);
      },
      nb::arg("q"), nb::arg("weights"), nb::arg("keys"), nb::arg("segments"), nb::arg("out"),
      nb::arg("heads"), nb::arg("head_dim"), nb::arg("ratio"), nb::arg("topk"),
      nb::arg("threads") = 0, nb::arg("isa") = "auto",
      "Fused scoring + top-k (kernels/select.hpp select_topk) into `out` [rows, topk] int32. "
      "q [rows, heads * head_dim] (any trailing shape), weights [rows, heads], keys [bank, "
      "head_dim]; fp32 or bf16; C-contiguous CPU arrays, read in place.");
  m.def(
      "select_worker_rows",
      [](const CpuInput& qr, const CpuInput& weights, const CpuInput& cos, const CpuInput& sin,
         const CpuInput& wq_b, const CpuInput& keys, const SegmentArray& segments,
         const CpuArray& out, int64_t heads, int64_t head_dim, int64_t rope_dim, int64_t ratio,
         int64_t topk, bool out_in, int threads, std::string_view isa) {
        const SelectConfig config = config_of(heads, head_dim, rope_dim, ratio, topk, threads, isa);
        const MatrixView qr_view = matrix(qr, "query_residual");
        const MatrixView w_view = matrix(weights, "weights");
        const MatrixView cos_view = matrix(cos, "cos");
        const MatrixView sin_view = matrix(sin, "sin");
        const MatrixView wq_view = matrix(wq_b, "wq_b");
        const MatrixView k_view = matrix(keys, "key");
        const auto out_span = output<int32_t>(out, "out", qr_view.rows, topk);
        const auto segment_span = segments_of(segments);
        nb::gil_scoped_release release;
        select_worker_rows(qr_view, w_view, cos_view, sin_view, wq_view, k_view, segment_span,
                           config, out_span, layout_of(out_in));
      },
      nb::arg("qr"), nb::arg("weights"), nb::arg("cos"), nb::arg("sin"), nb::arg("wq_b"),
      nb::arg("keys"), nb::arg("segments"), nb::arg("out"), nb::arg("heads"), nb::arg("head_dim"),
      nb::arg("rope_dim"), nb::arg("ratio"), nb::arg("topk"), nb::arg("out_in") = true,
      nb::arg("threads") = 0, nb::arg("isa") = "auto",
      "Worker selection (select_worker_rows): Index-Q projection qr @ Wq_b with RoPE, then "
      "fused top-k. wq_b is [heads * head_dim, q_rank] (out_in, torch Linear.weight) or "
      "[q_rank, heads * head_dim].");
  m.def(
      "project_index_query",
      [](const CpuInput& qr, const CpuInput& wq_b, const CpuInput& cos, const CpuInput& sin,
         const CpuArray& out, int64_t heads, int64_t head_dim, int64_t rope_dim, bool out_in,
         int threads) {
        const SelectConfig config = config_of(heads, head_dim, rope_dim, 1, 1, threads, "auto");
        const MatrixView qr_view = matrix(qr, "query_residual");
        const MatrixView wq_view = matrix(wq_b, "wq_b");
        const MatrixView cos_view = matrix(cos, "cos");
        const MatrixView sin_view = matrix(sin, "sin");
        const auto out_span = output<float>(out, "out", qr_view.rows, heads * head_dim);
        nb::gil_scoped_release release;
        project_index_query(qr_view, wq_view, cos_view, sin_view, config, out_span,
                            layout_of(out_in));
      },
      nb::arg("qr"), nb::arg("wq_b"), nb::arg("cos"), nb::arg("sin"), nb::arg("out"),
      nb::arg("heads"), nb::arg("head_dim"), nb::arg("rope_dim"), nb::arg("out_in") = true,
      nb::arg("threads") = 0,
      "Index-Q projection with RoPE (project_index_query) into `out` [rows, heads * head_dim] "
      "float32; threads 0: OpenMP's default (1 also keeps the BLAS product on this thread).");

  nb::class_<TndPlan>(m, "TndPlan",
                      "Packed layout of the rows that see a key (kernels/tnd_plan.hpp).")
      .def_prop_ro("ratio", &TndPlan::ratio)
      .def_prop_ro("packed_rows", &TndPlan::packed_rows)
      .def_prop_ro(
          "sequences",
          [](nb::handle self) {
            const TndPlan& plan = nb::cast<const TndPlan&>(self);
            const size_t shape[2] = {plan.sequences().size(), 6};
            return Int64Array(reinterpret_cast<const int64_t*>(plan.sequences().data()), 2, shape,
                              self);
          },
          "[n, 6] int64: row_begin, row_end, packed_begin, first_position, key_begin, "
          "key_end.",
          kView)
      .def("query_offsets", [](const TndPlan& plan) { return own_int64(plan.query_offsets()); })
      .def("key_offsets", [](const TndPlan& plan) { return own_int64(plan.key_offsets()); })
      .def("packed_row_ids", [](const TndPlan& plan) { return own_int64(plan.packed_row_ids()); })
      .def("covers_queries", &TndPlan::covers_queries, nb::arg("rows"));
  m.def(
      "check_select_config",
      [](int64_t heads, int64_t head_dim, int64_t ratio, int64_t topk) {
        (void)config_of(heads, head_dim, 0, ratio, topk, 0, "auto");
      },
      nb::arg("heads"), nb::arg("head_dim"), nb::arg("ratio"), nb::arg("topk"),
      "The selection kernels' configuration checks (e.g. \"Indexer topk ... is too large\"), "
      "before any output is allocated.");
  m.def(
      "csa_tnd_plan",
      [](const SegmentArray& segments, int64_t ratio) {
        return csa_tnd_plan(segments_of(segments), ratio);
      },
      nb::arg("segments"), nb::arg("ratio"), "Seed csa_tnd_plan: None when no row sees a key.");

  m.def(
      "kernel_isa",
      [] { return std::string(kernel_isa_name(resolve_kernel_isa(KernelIsa::kAuto))); },
      "The ISA the selection and KL kernels run with isa='auto': SPARSECP_ISA if set, else "
      "the best this CPU supports.");
  m.def(
      "select_bf16_products",
      [](std::string_view isa) { return std::string(select_bf16_products(parse_isa(isa))); },
      nb::arg("isa") = "auto",
      "What the selection multiplies bf16 keys with under `isa`: 'onednn <version>', 'vdpbf16ps' "
      "or 'widened'.");
  m.def(
      "kernel_isa_supported",
      [](std::string_view name) { return kernel_isa_supported(parse_isa(name)); }, nb::arg("name"));
  m.def(
      "array_address",
      [](const CpuInput& array) { return reinterpret_cast<uintptr_t>(array.data()); },
      nb::arg("array"),
      "The address of the data the binding reads for `array` (tests use it to prove zero copy).");
}

}  // namespace sparsecp::python
