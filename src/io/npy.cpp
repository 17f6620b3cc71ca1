// .npy reading and writing: a small parser for the header's Python dict literal.
#include "sparsecp/io/npy.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "sparsecp/error.hpp"
#include "sparsecp/io/output_set.hpp"

namespace sparsecp {

const char* npy_dtype_name(NpyDType dtype) {
  switch (dtype) {
    case NpyDType::kFloat32:
      return "float32";
    case NpyDType::kBFloat16:
      return "bfloat16";
    case NpyDType::kInt32:
      return "int32";
    case NpyDType::kInt64:
      return "int64";
    case NpyDType::kFloat64:
      return "float64";
  }
  return "unknown";
}

std::size_t npy_item_size(NpyDType dtype) {
  switch (dtype) {
    case NpyDType::kBFloat16:
      return 2;
    case NpyDType::kInt64:
    case NpyDType::kFloat64:
      return 8;
    default:
      return 4;
  }
}

int64_t NpyArray::elements() const {
  int64_t count = 1;
  for (const int64_t extent : shape) count *= extent;
  return count;
}

namespace {

constexpr char kMagic[] = "\x93NUMPY";

// The value text that follows 'key': in the header dict, up to the matching end.
std::string_view dict_value(std::string_view header, std::string_view key,
                            const std::string& name) {
  for (const char quote : {'\'', '"'}) {
    std::string quoted(1, quote);
    quoted.append(key);
    quoted.push_back(quote);
    const size_t at = header.find(quoted);
    if (at == std::string_view::npos) continue;
    size_t pos = header.find(':', at + quoted.size());
    SPARSECP_CHECK(pos != std::string_view::npos, name, ": malformed .npy header (no value for '",
                   key, "')");
    ++pos;
    while (pos < header.size() && header[pos] == ' ') ++pos;
    SPARSECP_CHECK(pos < header.size(), name, ": malformed .npy header (no value for '", key, "')");
    size_t end = pos;
    if (header[pos] == '\'' || header[pos] == '"') {
      end = header.find(header[pos], pos + 1);
      SPARSECP_CHECK(end != std::string_view::npos, name, ": malformed .npy header string");
      return header.substr(pos + 1, end - pos - 1);
    }
    if (header[pos] == '(') {
      end = header.find(')', pos);
      SPARSECP_CHECK(end != std::string_view::npos, name, ": malformed .npy header shape");
      return header.substr(pos + 1, end - pos - 1);
    }
    while (end < header.size() && header[end] != ',' && header[end] != '}') ++end;
    return header.substr(pos, end - pos);
  }
  SPARSECP_FAIL(name, ": .npy header has no '", key, "' entry");
}

std::vector<int64_t> parse_shape(std::string_view text, const std::string& name) {
  std::vector<int64_t> shape;
  size_t pos = 0;
  while (pos < text.size()) {
    while (pos < text.size() && (text[pos] == ' ' || text[pos] == ',')) ++pos;
    if (pos == text.size()) break;
    SPARSECP_CHECK(text[pos] >= '0' && text[pos] <= '9', name, ": malformed .npy shape '", text,
                   "'");
    int64_t value = 0;
    while (pos < text.size() && text[pos] >= '0' && text[pos] <= '9') {
      SPARSECP_CHECK(value <= (std::numeric_limits<int64_t>::max() - 9) / 10, name,
                     ": .npy shape extent too large");
      value = value * 10 + (text[pos] - '0');
      ++pos;
    }
    while (pos < text.size() && (text[pos] == 'L' || text[pos] == ' ')) ++pos;
    SPARSECP_CHECK(pos == text.size() || text[pos] == ',', name, ": malformed .npy shape '", text,
                   "'");
    shape.push_back(value);
  }
  return shape;
}

NpyDType parse_descr(std::string_view descr, const std::string& name) {
  if (descr == "<f4") return NpyDType::kFloat32;
  if (descr == "<i4") return NpyDType::kInt32;
  if (descr == "<i8") return NpyDType::kInt64;
  if (descr == "<f8") return NpyDType::kFloat64;
  if (descr == "bfloat16" || descr == "<V2" || descr == "|V2") return NpyDType::kBFloat16;
  SPARSECP_FAIL(name, ": unsupported .npy dtype '", descr,
                "' (supported: '<f4' float32, '<f8' float64, '<i4' int32, '<i8' int64, bfloat16 as "
                "'bfloat16' or '|V2'; C order, little-endian)");
}

// Parses `image` and points the result's bytes into it (the caller keeps it alive).
NpyArray parse_view(std::span<const std::byte> image, const std::string& name) {
  SPARSECP_CHECK(image.size() >= 10 && std::memcmp(image.data(), kMagic, 6) == 0, name,
                 ": not a .npy file (missing the \\x93NUMPY magic)");
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(image[i]); };
  const uint8_t major = byte(6);
  SPARSECP_CHECK(major >= 1 && major <= 3, name, ": unsupported .npy format version ",
                 static_cast<int>(major));
  size_t header_len = 0;
  size_t offset = 0;
  if (major == 1) {
    header_len = byte(8) | (static_cast<size_t>(byte(9)) << 8);
    offset = 10;
  } else {
    SPARSECP_CHECK(image.size() >= 12, name, ": truncated .npy header");
    header_len = byte(8) | (static_cast<size_t>(byte(9)) << 8) |
                 (static_cast<size_t>(byte(10)) << 16) | (static_cast<size_t>(byte(11)) << 24);
    offset = 12;
  }
  SPARSECP_CHECK(header_len <= image.size() - offset, name, ": truncated .npy header (", header_len,
                 " bytes announced, ", image.size() - offset, " present)");
  const std::string_view header(reinterpret_cast<const char*>(image.data() + offset), header_len);
  NpyArray array;
  array.dtype = parse_descr(dict_value(header, "descr", name), name);
  const std::string_view fortran = dict_value(header, "fortran_order", name);
  SPARSECP_CHECK(fortran.substr(0, 5) == "False", name,
                 ": Fortran-order .npy arrays are not supported (save with np.ascontiguousarray)");
  array.shape = parse_shape(dict_value(header, "shape", name), name);
  const size_t item = npy_item_size(array.dtype);
  uint64_t elements = 1;
  for (const int64_t extent : array.shape) {
    SPARSECP_CHECK(extent == 0 || elements <= std::numeric_limits<uint64_t>::max() / 16 /
                                                  static_cast<uint64_t>(extent),
                   name, ": .npy shape too large");
    elements *= static_cast<uint64_t>(extent);
  }
  const size_t data_begin = offset + header_len;
  const uint64_t expected = elements * item;
  SPARSECP_CHECK(image.size() - data_begin == expected, name, ": .npy data holds ",
                 image.size() - data_begin, " bytes, but shape and dtype ",
                 npy_dtype_name(array.dtype), " need ", expected);
  array.bytes = image.subspan(data_begin);
  return array;
}

}  // namespace

NpyArray parse_npy(std::span<const std::byte> image, const std::string& name) {
  NpyArray array = parse_view(image, name);
  auto copy = std::make_shared<std::vector<std::byte>>(array.bytes.begin(), array.bytes.end());
  array.bytes = *copy;
  array.storage = std::move(copy);
  return array;
}

NpyArray read_npy(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  SPARSECP_CHECK(fd >= 0, path, ": cannot open .npy file");
  struct stat info {};
  const bool known = ::fstat(fd, &info) == 0;
  if (known && S_ISDIR(info.st_mode)) {
    ::close(fd);
    SPARSECP_FAIL(path, ": is a directory, not a .npy file");
  }
  const bool sized = known && info.st_size > 0;
  void* mapped =
      sized ? ::mmap(nullptr, static_cast<size_t>(info.st_size), PROT_READ, MAP_PRIVATE, fd, 0)
            : MAP_FAILED;
  ::close(fd);
  if (mapped != MAP_FAILED) {
    const auto size = static_cast<size_t>(info.st_size);
    std::shared_ptr<const void> storage(
        mapped, [size](const void* address) { ::munmap(const_cast<void*>(address), size); });
    NpyArray array = parse_view({static_cast<const std::byte*>(mapped), size}, path);
    array.storage = std::move(storage);
    return array;
  }
  // Not mappable (empty, a pipe, ...): read it.
  std::ifstream file(path, std::ios::binary);
  SPARSECP_CHECK(file.good(), path, ": cannot open .npy file");
  const std::string text((std::istreambuf_iterator<char>(file)), {});
  return parse_npy(std::as_bytes(std::span<const char>(text)), path);
}

std::vector<std::byte> format_npy(NpyDType dtype, std::span<const int64_t> shape,
                                  const void* data) {
  std::string descr;
  switch (dtype) {
    case NpyDType::kFloat32:
      descr = "<f4";
      break;
    case NpyDType::kBFloat16:
      descr = "|V2";
      break;
    case NpyDType::kInt32:
      descr = "<i4";
      break;
    case NpyDType::kInt64:
      descr = "<i8";
      break;
    case NpyDType::kFloat64:
      descr = "<f8";
      break;
  }
  std::string extents;
  uint64_t elements = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    SPARSECP_CHECK(shape[i] >= 0, ".npy shape extent must be non-negative, got ", shape[i]);
    if (i > 0) extents.append(", ");
    extents.append(std::to_string(shape[i]));
    elements *= static_cast<uint64_t>(shape[i]);
  }
  if (shape.size() == 1) extents += ",";  // a Python 1-tuple
  std::string dict = "{'descr': '";
  dict.append(descr).append("', 'fortran_order': False, 'shape': (").append(extents).append("), }");
  // Pad with spaces to a multiple of 64 bytes including magic, lengths and '\n'.
  const bool v2 = dict.size() + 11 > 65535;
  const size_t prefix = v2 ? 12 : 10;
  const size_t total = (prefix + dict.size() + 1 + 63) / 64 * 64;
  dict.append(total - prefix - dict.size() - 1, ' ');
  dict += '\n';
  std::vector<std::byte> image(prefix);
  std::memcpy(image.data(), kMagic, 6);
  image[6] = std::byte{static_cast<uint8_t>(v2 ? 2 : 1)};
  image[7] = std::byte{0};
  const size_t length = dict.size();
  for (size_t i = 0; i < prefix - 8; ++i)
    image[8 + i] = std::byte{static_cast<uint8_t>(length >> (8 * i))};
  const auto* text = reinterpret_cast<const std::byte*>(dict.data());
  image.insert(image.end(), text, text + dict.size());
  const auto* bytes = static_cast<const std::byte*>(data);
  const size_t size = static_cast<size_t>(elements) * npy_item_size(dtype);
  if (size > 0) image.insert(image.end(), bytes, bytes + size);
  return image;
}

void write_npy(const std::string& path, NpyDType dtype, std::span<const int64_t> shape,
               const void* data) {
  OutputSet output;
  output.add(path, format_npy(dtype, shape, data));
  output.commit();
}

}  // namespace sparsecp
