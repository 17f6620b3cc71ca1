// sparsecp._core: shared helpers of the nanobind bindings (python/src/*.cpp).
//
// The extension never links libtorch. Arrays cross the boundary as nanobind ndarrays:
// inputs through DLPack (a CPU torch tensor or a numpy array, zero copy when it is
// C-contiguous), outputs as numpy arrays that either view memory owned by a bound C++
// object (a route's row lists) or own a moved std::vector (a capsule frees it).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sparsecp/kernels/select.hpp"  // KernelIsa
#include "sparsecp/segment.hpp"
#include "sparsecp/tensor.hpp"

namespace sparsecp::python {

namespace nb = nanobind;

// Read-only int64 numpy array.
using Int64Array = nb::ndarray<nb::numpy, const int64_t>;
// Any CPU array-like input (torch tensor, numpy array, read-only or not) of any dtype and
// shape; the binding only reads it.
using CpuInput = nb::ndarray<nb::ro, nb::device::cpu>;
// A writable CPU array the binding writes results into.
using CpuArray = nb::ndarray<nb::device::cpu>;
// A [n, 5] int64 segment table (q_begin, q_end, key_begin, key_end, residual).
using SegmentArray = nb::ndarray<const int64_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;

// DLPack's bfloat16 (torch.bfloat16 tensors arrive with it).
inline constexpr nb::dlpack::dtype kBFloat16{static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat),
                                             16, 1};

// True when `array` is dense row-major (extent-1 dimensions may have any stride; an array
// without elements always is).
template <typename Array>
bool c_contiguous(const Array& array) {
  if (array.size() == 0) return true;
  int64_t expected = 1;
  for (size_t i = array.ndim(); i-- > 0;) {
    if (array.shape(i) != 1 && array.stride(i) != expected) return false;
    expected *= static_cast<int64_t>(array.shape(i));
  }
  return true;
}

// True when no two of `array`'s elements share memory: its dimensions of extent above 1, by
// increasing stride, each step over everything inside the one before (no zero stride, no
// interleaving, as torch's expand or as_strided can make).
template <typename Array>
bool distinct_elements(const Array& array) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // |stride|, extent
  for (size_t i = 0; i < array.ndim(); ++i) {
    const auto extent = static_cast<int64_t>(array.shape(i));
    if (extent == 0) return true;
    const int64_t stride = array.stride(i);
    if (extent > 1) dims.emplace_back(stride < 0 ? -stride : stride, extent);
  }
  std::sort(dims.begin(), dims.end());
  int64_t span = 1;  // elements covered by the dimensions so far
  for (const auto& [stride, extent] : dims) {
    if (stride < span) return false;
    span = stride * extent;
  }
  return true;
}

// The bytes [first, last) `array`'s elements lie in (empty for an array without elements).
template <typename Array>
std::pair<uintptr_t, uintptr_t> byte_span(const Array& array) {
  const auto base = reinterpret_cast<uintptr_t>(array.data());
  if (array.size() == 0) return {base, base};
  int64_t low = 0, high = 0;
  for (size_t i = 0; i < array.ndim(); ++i) {
    const int64_t reach = array.stride(i) * (static_cast<int64_t>(array.shape(i)) - 1);
    (reach < 0 ? low : high) += reach;
  }
  const auto item = static_cast<int64_t>(array.itemsize());
  return {static_cast<uintptr_t>(static_cast<int64_t>(base) + low * item),
          static_cast<uintptr_t>(static_cast<int64_t>(base) + (high + 1) * item)};
}

// True when `a` and `b` share no byte (arrays without elements share none).
template <typename A, typename B>
bool disjoint(const A& a, const B& b) {
  const auto [a_first, a_last] = byte_span(a);
  const auto [b_first, b_last] = byte_span(b);
  return a_first == a_last || b_first == b_last || a_last <= b_first || b_last <= a_first;
}

// The element type of a float32 or bfloat16 array; nullopt for any other dtype.
inline std::optional<DType> float_dtype(const CpuInput& array) {
  if (array.dtype() == nb::dtype<float>()) return DType::kFloat32;
  if (array.dtype() == kBFloat16) return DType::kBFloat16;
  return std::nullopt;
}

// "[2, 3, 4]": an array's shape for messages.
template <typename Array>
std::string shape_text(const Array& array) {
  std::string text = "[";
  for (size_t i = 0; i < array.ndim(); ++i) {
    text += (i ? ", " : "") + std::to_string(array.shape(i));
  }
  return text + "]";
}

// Properties that return numpy views of memory their object owns (the array holds the owner).
inline constexpr auto kView = nb::rv_policy::reference;

static_assert(sizeof(Segment) == 5 * sizeof(int64_t), "Segment must be five packed int64 values");

// A read-only numpy view of `values` ([values.size()] or `shape`), kept alive by `owner`
// (the Python object that owns the C++ vector).
inline Int64Array view_int64(const std::vector<int64_t>& values, nb::handle owner) {
  const size_t shape[1] = {values.size()};
  return Int64Array(values.data(), 1, shape, owner);
}

// A read-only numpy array that takes over `values` (freed with the array).
inline Int64Array own_int64(std::vector<int64_t>&& values, std::vector<size_t> shape = {}) {
  auto* heap = new std::vector<int64_t>(std::move(values));
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<int64_t>*>(p); });
  if (shape.empty()) shape = {heap->size()};
  return Int64Array(heap->data(), shape.size(), shape.data(), owner);
}

// "auto", "portable", "avx2" or "avx512" as a KernelIsa (kernels.cpp); anything else raises
// ValueError naming the choices.
KernelIsa parse_isa(std::string_view name);

void bind_planning(nb::module_& m);
void bind_transport(nb::module_& m);
void bind_kernels(nb::module_& m);
void bind_indexer_kl(nb::module_& m);
void bind_attention(nb::module_& m);

}  // namespace sparsecp::python
