#include "progress.hpp"

#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "timing.hpp"

namespace sparsecp::cli {
namespace {

// Under mpirun a rank's stderr is a pipe to mpirun; mpirun's is what the person sees.
// Open MPI launches local ranks as children of mpirun (or of its orted daemon, whose
// stderr is mpirun's on a single machine).
bool parent_stderr_is_terminal() {
  if (std::getenv("OMPI_COMM_WORLD_SIZE") == nullptr && std::getenv("PMI_SIZE") == nullptr) {
    return false;
  }
  const std::string link = "/proc/" + std::to_string(getppid()) + "/fd/2";
  char target[256] = {};
  const ssize_t length = readlink(link.c_str(), target, sizeof target - 1);
  if (length <= 0) return false;
  return std::strncmp(target, "/dev/pts/", 9) == 0 || std::strncmp(target, "/dev/tty", 8) == 0;
}

}  // namespace

bool progress_wanted() {
  if (const char* forced = std::getenv("SPARSECP_PROGRESS"); forced && *forced) {
    return std::strcmp(forced, "0") != 0;
  }
  return isatty(STDERR_FILENO) == 1 || parent_stderr_is_terminal();
}

Progress::Progress(std::string command, bool quiet)
    : command_(std::move(command)), on_(!quiet && progress_wanted()), start_(wall_seconds()) {}

Progress Progress::off() { return Progress(); }

double Progress::elapsed() const { return wall_seconds() - start_; }

void Progress::print(const char* format, va_list arguments) const {
  char text[1024];
  std::vsnprintf(text, sizeof text, format, arguments);
  last_ = elapsed();
  std::fprintf(stderr, "%s [%4.0f s] %s\n", command_.c_str(), last_, text);
  std::fflush(stderr);
}

void Progress::say(const char* format, ...) const {
  if (!on_) return;
  va_list arguments;
  va_start(arguments, format);
  print(format, arguments);
  va_end(arguments);
}

void Progress::tick(const char* format, ...) const {
  if (!on_ || elapsed() - last_ < 1.0) return;
  va_list arguments;
  va_start(arguments, format);
  print(format, arguments);
  va_end(arguments);
}

std::string human_seconds(double seconds) {
  char text[48];
  if (seconds < 10) {
    std::snprintf(text, sizeof text, "%.1f s", seconds);
  } else if (seconds < 90) {
    std::snprintf(text, sizeof text, "%.0f s", seconds);
  } else {
    const long whole = static_cast<long>(seconds + 0.5);
    std::snprintf(text, sizeof text, "%ld min %02ld s", whole / 60, whole % 60);
  }
  return text;
}

}  // namespace sparsecp::cli
