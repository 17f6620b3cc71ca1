// sparsecp CLI: checking the size of what a command is about to allocate.
//
// Commands that generate or time problems from size flags (`bench select`, `calibrate`)
// allocate buffers whose sizes are products of those flags. A product that overflows
// int64 is undefined behaviour, and a problem larger than the machine's memory would
// only fail after minutes of paging, so every product is checked first and the total
// against physical memory, before anything is allocated:
//
//   ProblemSize size("calibrate", "--rows, --heads, --head-dim, --q-rank, --topk, --visible");
//   const int64_t width = size.product({heads, head_dim});
//   size.add_buffer({rows, width}, 4);   // a [rows, width] fp32 buffer
//   size.check_memory();
//
// Errors (sparsecp::Error, exit status 2): "<command>: problem size overflows 64 bits
// (<flags>)" and "<command> needs about X GiB of buffers, more than this machine's Y GiB
// of memory".
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

namespace sparsecp::cli {

// The most repetitions a command accepts (--repeat, --repeats, seed counts): a typo such
// as 9223372036854775807 is an error instead of a run that never ends.
inline constexpr int64_t kMaxRepeat = 1000000;

class ProblemSize {
 public:
  // `command` names the command in messages, `flags` the flags whose values multiply.
  ProblemSize(std::string command, std::string flags);

  // The product of non-negative `factors`, or Error when it does not fit in 64 bits.
  int64_t product(std::initializer_list<int64_t> factors) const;
  // The sum a + b, or the same Error.
  int64_t sum(int64_t a, int64_t b) const;
  // Counts a buffer of product(extents) elements of `element_bytes` bytes each.
  void add_buffer(std::initializer_list<int64_t> extents, int64_t element_bytes);
  // Bytes of all buffers counted so far.
  int64_t bytes() const { return bytes_; }
  // Error unless bytes() fits in this machine's physical memory.
  void check_memory() const;

 private:
  [[noreturn]] void overflow() const;

  std::string command_;
  std::string flags_;
  int64_t bytes_ = 0;
};

}  // namespace sparsecp::cli
