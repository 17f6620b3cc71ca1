#include "problem_size.hpp"

#include <unistd.h>

#include <utility>

#include "sparsecp/error.hpp"

namespace sparsecp::cli {

ProblemSize::ProblemSize(std::string command, std::string flags)
    : command_(std::move(command)), flags_(std::move(flags)) {}

void ProblemSize::overflow() const {
  SPARSECP_FAIL(command_, ": problem size overflows 64 bits (", flags_, ")");
}

int64_t ProblemSize::product(std::initializer_list<int64_t> factors) const {
  int64_t result = 1;
  for (const int64_t factor : factors) {
    if (factor < 0 || __builtin_mul_overflow(result, factor, &result)) overflow();
  }
  return result;
}

int64_t ProblemSize::sum(int64_t a, int64_t b) const {
  int64_t result = 0;
  if (__builtin_add_overflow(a, b, &result)) overflow();
  return result;
}

void ProblemSize::add_buffer(std::initializer_list<int64_t> extents, int64_t element_bytes) {
  const int64_t elements = product(extents);
  bytes_ = sum(bytes_, product({elements, element_bytes}));
}

void ProblemSize::check_memory() const {
  const double need = static_cast<double>(bytes_);
  const double have =
      static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  SPARSECP_CHECK(need <= have, command_, " needs about ", need / (1 << 30),
                 " GiB of buffers, more than this machine's ", have / (1 << 30), " GiB of memory");
}

}  // namespace sparsecp::cli
