// sparsecp: reading and writing NumPy .npy files (the interchange format of training
// frameworks: np.save / np.load, torch via .numpy()).
//
// Supported: format versions 1.0, 2.0 and 3.0, C order, little-endian element types
//   float32 ('<f4'), float64 ('<f8'), int32 ('<i4'), int64 ('<i8') and bfloat16.
// NumPy has no bfloat16 dtype of its own: arrays of ml_dtypes.bfloat16 are stored
// with the descriptor 'bfloat16' or as 2-byte void ('|V2' / '<V2'); all three are read
// as bfloat16, and bfloat16 is written as '|V2' (load with
// `np.load(path).view(ml_dtypes.bfloat16)`).
// Anything else (Fortran order, big-endian, other dtypes, truncated or oversized data,
// malformed headers) throws sparsecp::Error naming the file and the problem.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace sparsecp {

enum class NpyDType { kFloat32, kBFloat16, kInt32, kInt64, kFloat64 };

// Name for messages: "float32", "bfloat16", "int32", "int64", "float64".
const char* npy_dtype_name(NpyDType dtype);
// Bytes per element.
std::size_t npy_item_size(NpyDType dtype);

// An array read from a .npy file: shape, element type and the raw little-endian bytes.
// `bytes` views memory that `storage` keeps alive: a copy (parse_npy) or the file mapped
// read-only into memory (read_npy), so reading a file costs no second copy of its data.
struct NpyArray {
  NpyDType dtype = NpyDType::kFloat32;
  std::vector<int64_t> shape;
  std::span<const std::byte> bytes;
  std::shared_ptr<const void> storage;

  int64_t elements() const;
  // Typed access; the caller checks `dtype` first. The data of a parsed .npy is at least
  // 4-byte aligned when the image is (the header pads it to a multiple of 16 bytes).
  template <typename T>
  const T* as() const {
    return reinterpret_cast<const T*>(bytes.data());
  }
};

// Parses a whole .npy image and copies its data; `name` is used in error messages.
NpyArray parse_npy(std::span<const std::byte> image, const std::string& name);
// Reads the file at `path` by mapping it read-only (no copy; falls back to reading it
// when it cannot be mapped) and parses it. As with numpy.memmap, the file must not be
// truncated or rewritten while the array is alive.
NpyArray read_npy(const std::string& path);

// Serialises `data` (shape product elements of `dtype`) as a version 1.0 image
// (version 2.0 if the header needs it).
std::vector<std::byte> format_npy(NpyDType dtype, std::span<const int64_t> shape, const void* data);
// Writes the image to `path`, whole or not at all (io/output_set.hpp); throws Error if
// the file cannot be written. Several files that belong together: OutputSet.
void write_npy(const std::string& path, NpyDType dtype, std::span<const int64_t> shape,
               const void* data);

}  // namespace sparsecp
