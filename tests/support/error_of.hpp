// The one helper every test uses to look at an error's text.
#pragma once

#include <string>

#include "sparsecp/error.hpp"

namespace sparsecp::testing {

// The message of the sparsecp::Error `call` throws, or "" when it returns normally.
template <typename Call>
std::string error_of(Call&& call) {
  try {
    call();
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

}  // namespace sparsecp::testing
