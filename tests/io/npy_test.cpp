// .npy round trips and clear errors on bad files.
#include "sparsecp/io/npy.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "sparsecp/error.hpp"

namespace sparsecp {
namespace {

std::vector<std::byte> bytes_of(const std::string& text) {
  std::vector<std::byte> out(text.size());
  std::memcpy(out.data(), text.data(), text.size());
  return out;
}

// A hand-built version-1.0 image, as np.save writes it.
std::vector<std::byte> image(const std::string& dict, size_t data_bytes) {
  std::string header = dict;
  while ((10 + header.size() + 1) % 64) header += ' ';
  header += '\n';
  std::string text = std::string("\x93NUMPY\x01\x00", 8);
  text += static_cast<char>(header.size() & 0xff);
  text += static_cast<char>(header.size() >> 8);
  text += header;
  text += std::string(data_bytes, '\x01');
  return bytes_of(text);
}

template <typename T>
void expect_round_trip(NpyDType dtype, std::vector<int64_t> shape, std::vector<T> values) {
  const auto encoded = format_npy(dtype, shape, values.data());
  EXPECT_EQ((encoded.size() - values.size() * sizeof(T)) % 64, 0u);  // aligned header
  const NpyArray array = parse_npy(encoded, "memory");
  EXPECT_EQ(array.dtype, dtype);
  EXPECT_EQ(array.shape, shape);
  ASSERT_EQ(array.bytes.size(), values.size() * sizeof(T));
  if (!values.empty()) {
    EXPECT_EQ(std::memcmp(array.bytes.data(), values.data(), array.bytes.size()), 0);
  }
}

TEST(Npy, RoundTripsEveryDtypeAndRank) {
  expect_round_trip<float>(NpyDType::kFloat32, {2, 3}, {1, 2, 3, 4, 5, -6.5f});
  expect_round_trip<int32_t>(NpyDType::kInt32, {4}, {1, -2, 3, 2147483647});
  expect_round_trip<int64_t>(NpyDType::kInt64, {1, 1, 2}, {-1, int64_t{1} << 40});
  expect_round_trip<uint16_t>(NpyDType::kBFloat16, {3, 1}, {0x3f80, 0xbf80, 0x7fc0});
  expect_round_trip<double>(NpyDType::kFloat64, {}, {-0.125});  // a float64 scalar (KL loss)
  expect_round_trip<float>(NpyDType::kFloat32, {}, {42.0f});    // a scalar
  expect_round_trip<float>(NpyDType::kFloat32, {0, 128}, {});   // empty
}

TEST(Npy, HeaderIsWhatNumpyWrites) {
  const std::vector<int64_t> shape{3};
  const int32_t values[3] = {1, 2, 3};
  const auto encoded = format_npy(NpyDType::kInt32, shape, values);
  ASSERT_EQ(encoded.size(), 128u + 12u);  // header padded to a multiple of 64 bytes
  const std::string text(reinterpret_cast<const char*>(encoded.data()), 128);
  EXPECT_EQ(text.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  EXPECT_EQ(text.substr(10).find("{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }"), 0u);
  EXPECT_EQ(text.back(), '\n');
}

TEST(Npy, ReadsFilesAndAcceptsBf16Descriptors) {
  const auto path = (std::filesystem::temp_directory_path() / "sparsecp_npy_test.npy").string();
  const std::vector<int64_t> shape{2, 2};
  const float values[4] = {1, 2, 3, 4};
  write_npy(path, NpyDType::kFloat32, shape, values);
  const NpyArray array = read_npy(path);
  EXPECT_EQ(array.shape, shape);
  EXPECT_EQ(array.as<float>()[3], 4.0f);
  std::filesystem::remove(path);
  for (const char* descr : {"bfloat16", "<V2", "|V2"}) {
    const auto bf16 = image(
        std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (2, 3), }", 12);
    EXPECT_EQ(parse_npy(bf16, "x").dtype, NpyDType::kBFloat16) << descr;
  }
}

void expect_error(const std::vector<std::byte>& bytes, const std::string& words) {
  try {
    parse_npy(bytes, "bad.npy");
    ADD_FAILURE() << "accepted a bad file; expected: " << words;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bad.npy"), std::string::npos) << e.what();
  }
}

TEST(Npy, BadFilesGiveClearErrors) {
  expect_error(bytes_of("not numpy at all"), "not a .npy file");
  expect_error({}, "not a .npy file");
  expect_error(image("{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", 8),
               "unsupported .npy dtype '>f4'");
  expect_error(image("{'descr': '<f2', 'fortran_order': False, 'shape': (2,), }", 4),
               "unsupported .npy dtype '<f2'");
  expect_error(image("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", 16),
               "Fortran-order");
  expect_error(image("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }", 15), "need 16");
  expect_error(image("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }", 17), "need 16");
  expect_error(image("{'descr': '<f4', 'fortran_order': False, 'shape': (2, x), }", 16),
               "malformed .npy shape");
  expect_error(image("{'descr': '<f4', 'fortran_order': False}", 4), "no 'shape' entry");
  expect_error(
      image("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }", 4),
      "too large");
  auto truncated = image("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", 8);
  truncated.resize(20);
  expect_error(truncated, "truncated");
  auto version = image("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", 8);
  version[6] = std::byte{9};
  expect_error(version, "version 9");
  EXPECT_THROW(read_npy("/nonexistent/dir/x.npy"), Error);
}

}  // namespace
}  // namespace sparsecp
