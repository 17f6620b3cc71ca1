// What a call raised: the kind and text of the sparsecp::Error it threw, or nothing.
// For tests that check error kinds and texts (and, in multi-rank tests, that every rank
// threw).
#pragma once

#include <string>

#include "sparsecp/error.hpp"

namespace sparsecp::test_support {

struct Raised {
  bool raised = false;
  ErrorKind kind = ErrorKind::kInvalidInput;
  std::string text;  // what(); "" when nothing was raised
};

template <typename Call>
Raised raised_by(Call&& call) {
  try {
    call();
  } catch (const Error& error) {
    return {true, error.kind(), error.what()};
  }
  return {};
}

}  // namespace sparsecp::test_support
