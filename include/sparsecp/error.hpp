// sparsecp: the one error type of the library, and the check macro that raises it.
//
// Every invalid input reaching the library is reported by throwing sparsecp::Error
// with a message that names the bad value. Where the Python specification (the seed
// module indexer_balance.py) has an error text, the message is that text verbatim,
// so that users can grep for the same words in either implementation.
//
// The command-line tool turns an Error into "error: <message>" on stderr and exit
// status 2; nothing else reaches a user as a crash.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace sparsecp {

// Thrown for every invalid input and every misuse of a handle. Derives from
// std::invalid_argument so that generic callers can still catch std::exception.
class Error : public std::invalid_argument {
 public:
  explicit Error(const std::string& message) : std::invalid_argument(message) {}
};

namespace detail {
template <typename... Parts>
[[noreturn]] void raise(Parts&&... parts) {
  std::ostringstream stream;
  (stream << ... << std::forward<Parts>(parts));
  throw Error(stream.str());
}
}  // namespace detail

}  // namespace sparsecp

// SPARSECP_CHECK(condition, message parts...): throws sparsecp::Error with the
// concatenated message parts when the condition is false. The parts are only
// formatted on failure, so checks are cheap on hot paths.
#define SPARSECP_CHECK(condition, ...)        \
  do {                                        \
    if (!(condition)) [[unlikely]] {          \
      ::sparsecp::detail::raise(__VA_ARGS__); \
    }                                         \
  } while (false)

// SPARSECP_FAIL(message parts...): throws unconditionally.
#define SPARSECP_FAIL(...) ::sparsecp::detail::raise(__VA_ARGS__)
