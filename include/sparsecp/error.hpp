// sparsecp: the library's error type, its kinds, and the check macros that raise it.
//
// Every failure the library reports is a sparsecp::Error. Its message names the bad
// value; where the Python specification (Huawei hyper_parallel's `indexer_balance`
// module) has an error text, the message is that text verbatim, so that users can grep
// for the same words in either implementation.
//
// An Error says what kind of failure it is, so that callers can react differently to a
// bad argument and to a broken network (and the Python package can raise the seed's
// exception types):
//   kInvalidInput  a value the caller passed is invalid         (Python: ValueError)
//   kMisuse        an object was used out of order, e.g. a      (Python: RuntimeError)
//                  single-use handle waited twice
//   kTransport     the communication backend failed             (Python: RuntimeError)
//   kResource      memory or another resource ran out           (Python: MemoryError)
// Each kind is also a subclass (InvalidInputError, ...), for catch clauses.
//
// An Error also records where it was raised (source file relative to the repository,
// and line). That is debug detail: `what()` is the one-line user message only, and
// `detail()` adds the kind and the place. The command-line tool prints `what()` as
// "error: <message>" and exits with status 2; with SPARSECP_ERROR_DETAIL=1 in the
// environment it prints `detail()` on a second line.
#pragma once

#include <exception>
#include <new>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace sparsecp {

enum class ErrorKind { kInvalidInput, kMisuse, kTransport, kResource };

// "invalid input", "misuse", "transport failure" or "resource exhausted".
constexpr const char* error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidInput:
      return "invalid input";
    case ErrorKind::kMisuse:
      return "misuse";
    case ErrorKind::kTransport:
      return "transport failure";
    case ErrorKind::kResource:
      return "resource exhausted";
  }
  return "error";
}

class Error : public std::runtime_error {
 public:
  // An invalid-input error raised at an unknown place (kept for callers that build
  // their message themselves).
  explicit Error(const std::string& message) : Error(ErrorKind::kInvalidInput, message) {}
  Error(ErrorKind kind, const std::string& message, const char* file = "", int line = 0)
      : std::runtime_error(message), kind_(kind), file_(file), line_(line) {}

  ErrorKind kind() const noexcept { return kind_; }
  // Source file (relative to the repository) and line that raised it; "" and 0 when
  // unknown.
  const char* file() const noexcept { return file_; }
  int line() const noexcept { return line_; }
  // "<kind> raised at <file>:<line>: <message>" (the place only when known).
  std::string detail() const {
    std::string text = error_kind_name(kind_);
    if (line_ > 0) text += std::string(" raised at ") + file_ + ":" + std::to_string(line_);
    return text + ": " + what();
  }

 private:
  ErrorKind kind_;
  const char* file_;
  int line_;
};

// The kinds as types. Throw through the macros below, which pick the subclass.
class InvalidInputError : public Error {
 public:
  InvalidInputError(const std::string& message, const char* file = "", int line = 0)
      : Error(ErrorKind::kInvalidInput, message, file, line) {}
};
class MisuseError : public Error {
 public:
  MisuseError(const std::string& message, const char* file = "", int line = 0)
      : Error(ErrorKind::kMisuse, message, file, line) {}
};
class TransportError : public Error {
 public:
  TransportError(const std::string& message, const char* file = "", int line = 0)
      : Error(ErrorKind::kTransport, message, file, line) {}
};
class ResourceError : public Error {
 public:
  ResourceError(const std::string& message, const char* file = "", int line = 0)
      : Error(ErrorKind::kResource, message, file, line) {}
};

// The kind of any exception: an Error's own kind, kResource for std::bad_alloc, and
// kInvalidInput for anything else. For code that carries a failure across ranks as a
// kind (the agreement steps of the transport layer).
inline ErrorKind error_kind_of(const std::exception_ptr& failure) {
  try {
    std::rethrow_exception(failure);
  } catch (const Error& error) {
    return error.kind();
  } catch (const std::bad_alloc&) {
    return ErrorKind::kResource;
  } catch (...) {
    return ErrorKind::kInvalidInput;
  }
}

namespace detail {

// __FILE__ from the repository root on: the part from the last "src/", "include/",
// "tools/", "tests/", "bench/", "fuzz/" or "python/" folder on (the whole path when
// none), so that messages do not carry the build machine's paths.
constexpr const char* repository_path(const char* file) {
  const std::string_view path(file);
  size_t best = std::string_view::npos;
  for (const std::string_view root :
       {"/src/", "/include/", "/tools/", "/tests/", "/bench/", "/fuzz/", "/python/"}) {
    const size_t at = path.rfind(root);
    if (at != std::string_view::npos && (best == std::string_view::npos || at > best)) best = at;
  }
  return best == std::string_view::npos ? file : file + best + 1;
}

template <typename... Parts>
[[noreturn]] void raise(ErrorKind kind, const char* file, int line, Parts&&... parts) {
  std::ostringstream stream;
  (stream << ... << std::forward<Parts>(parts));
  switch (kind) {
    case ErrorKind::kMisuse:
      throw MisuseError(stream.str(), file, line);
    case ErrorKind::kTransport:
      throw TransportError(stream.str(), file, line);
    case ErrorKind::kResource:
      throw ResourceError(stream.str(), file, line);
    case ErrorKind::kInvalidInput:
      break;
  }
  throw InvalidInputError(stream.str(), file, line);
}

}  // namespace detail
}  // namespace sparsecp

// SPARSECP_CHECK(condition, message parts...): throws an InvalidInputError with the
// concatenated message parts when the condition is false. The parts are only formatted
// on failure, so checks are cheap on hot paths.
#define SPARSECP_CHECK(condition, ...) \
  SPARSECP_CHECK_AS(::sparsecp::ErrorKind::kInvalidInput, condition, __VA_ARGS__)

// SPARSECP_CHECK_AS(kind, condition, message parts...): the same with an explicit
// ErrorKind, e.g. SPARSECP_CHECK_AS(ErrorKind::kMisuse, !consumed, "... twice").
#define SPARSECP_CHECK_AS(kind, condition, ...)                                                \
  do {                                                                                         \
    if (!(condition)) [[unlikely]] {                                                           \
      ::sparsecp::detail::raise(kind, ::sparsecp::detail::repository_path(__FILE__), __LINE__, \
                                __VA_ARGS__);                                                  \
    }                                                                                          \
  } while (false)

// SPARSECP_FAIL(message parts...) / SPARSECP_FAIL_AS(kind, message parts...): throw
// unconditionally.
#define SPARSECP_FAIL(...) SPARSECP_FAIL_AS(::sparsecp::ErrorKind::kInvalidInput, __VA_ARGS__)
#define SPARSECP_FAIL_AS(kind, ...)                                                        \
  ::sparsecp::detail::raise(kind, ::sparsecp::detail::repository_path(__FILE__), __LINE__, \
                            __VA_ARGS__)
