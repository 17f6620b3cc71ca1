// libFuzzer target: the .npy reader (src/io/npy.cpp), which `sparsecp select` uses on
// user files.
//
// Any image must either parse or raise sparsecp::Error. A parsed array holds exactly
// elements() * item size bytes, with a non-negative shape whose product fits, and
// survives format_npy -> parse_npy unchanged.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <vector>

#include "sparsecp/error.hpp"
#include "sparsecp/io/npy.hpp"

namespace {
[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "invariant violated: %s\n", what);
  std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> image(reinterpret_cast<const std::byte*>(data), size);
  sparsecp::NpyArray array;
  try {
    array = sparsecp::parse_npy(image, "fuzz.npy");
  } catch (const sparsecp::Error&) {
    return 0;
  }
  __int128 elements = 1;
  for (const int64_t extent : array.shape) {
    if (extent < 0) fail("negative extent");
    elements *= extent;
    if (elements > INT64_MAX) fail("shape product overflows");
  }
  if (array.elements() != static_cast<int64_t>(elements)) fail("elements() != shape product");
  if (static_cast<__int128>(array.bytes.size()) !=
      elements * static_cast<__int128>(sparsecp::npy_item_size(array.dtype))) {
    fail("byte count does not match the shape");
  }
  const std::vector<std::byte> again =
      sparsecp::format_npy(array.dtype, array.shape, array.bytes.data());
  const sparsecp::NpyArray back = sparsecp::parse_npy(again, "again.npy");
  if (back.dtype != array.dtype || back.shape != array.shape ||
      !std::ranges::equal(back.bytes, array.bytes)) {
    fail("format_npy -> parse_npy does not round-trip");
  }
  return 0;
}
