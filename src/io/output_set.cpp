#include "sparsecp/io/output_set.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "sparsecp/error.hpp"

namespace sparsecp {
namespace {

std::string label(const std::string& path, std::string_view what) {
  return what.empty() ? path : std::string(what) + " " + path;
}

[[noreturn]] void fail_errno(const std::string& label_text, const char* action, int error) {
  SPARSECP_FAIL(label_text, ": ", action, " failed: ", std::strerror(error));
}

// Where writing `path` puts the bytes: a symbolic link's final target (followed hop by
// hop, relative targets against the link's folder), as a shell's `>` writes through a link.
// Renaming the temporary onto the link itself would replace the link with a file.
std::string through_links(const std::string& path) {
  namespace fs = std::filesystem;
  fs::path current(path);
  for (int hops = 0; hops < 40; ++hops) {
    std::error_code error;
    if (!fs::is_symlink(fs::symlink_status(current, error)) || error) return current.string();
    const fs::path target = fs::read_symlink(current, error);
    if (error) return current.string();
    current = target.is_absolute() ? target : current.parent_path() / target;
  }
  SPARSECP_FAIL(path, ": too many levels of symbolic links");
}

std::string folder_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string name_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// Writes all of `bytes` to `fd`, retrying short writes and EINTR; errno on failure.
int write_all(int fd, std::span<const std::byte> bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return EIO;
    done += static_cast<size_t>(n);
  }
  return 0;
}

void sync_folder(const std::string& folder) {
  const int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // best effort: the renames themselves succeeded
  (void)::fsync(fd);
  (void)::close(fd);
}

std::atomic<uint64_t> next_temporary{0};

}  // namespace

OutputSet::~OutputSet() {
  if (!committed_) discard();
}

void OutputSet::discard() noexcept {
  for (const Output& output : outputs_) {
    if (!output.temporary.empty()) (void)::unlink(output.temporary.c_str());
  }
  for (const std::string& path : renamed_) (void)::unlink(path.c_str());
  renamed_.clear();
}

void OutputSet::add_text(const std::string& path, std::string_view text, std::string_view what) {
  add(path, std::as_bytes(std::span<const char>(text.data(), text.size())), what);
}

void OutputSet::add(const std::string& path, std::span<const std::byte> bytes,
                    std::string_view what) {
  SPARSECP_CHECK(!committed_, "output set already committed");
  const std::string text = label(path, what);
  SPARSECP_CHECK(!path.empty(), (what.empty() ? std::string("output") : std::string(what)),
                 ": the output path is empty");
  for (const Output& output : outputs_) {
    SPARSECP_CHECK(output.path != path, text, ": the same output path is given twice");
  }
  Output output{
      .path = through_links(path), .temporary = {}, .what = std::string(what), .in_place = {}};
  struct stat status {};
  if (::stat(output.path.c_str(), &status) == 0) {
    SPARSECP_CHECK(!S_ISDIR(status.st_mode), text, ": is a directory");
    if (!S_ISREG(status.st_mode)) {  // a device or FIFO: written in place at commit()
      output.in_place.assign(bytes.begin(), bytes.end());
      outputs_.push_back(std::move(output));
      return;
    }
  }
  const std::string& target = output.path;
  const std::string temporary = (folder_of(target) == "/" ? "" : folder_of(target)) + "/." +
                                name_of(target) + ".tmp-" + std::to_string(::getpid()) + "-" +
                                std::to_string(next_temporary.fetch_add(1));
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) fail_errno(text, "creating a file in its folder", errno);
  output.temporary = temporary;
  outputs_.push_back(std::move(output));  // removed by discard() from here on
  int error = write_all(fd, bytes);
  const char* action = "write";
  if (error == 0 && ::fsync(fd) != 0) {
    error = errno;
    action = "fsync";
  }
  if (::close(fd) != 0 && error == 0) {
    error = errno;
    action = "close";
  }
  if (error != 0) {
    (void)::unlink(temporary.c_str());
    outputs_.back().temporary.clear();
    outputs_.pop_back();
    fail_errno(text, action, error);
  }
}

void OutputSet::commit() {
  SPARSECP_CHECK(!committed_, "output set already committed");
  try {
    // Nothing replaced before every destination is known to be replaceable.
    for (const Output& output : outputs_) {
      struct stat status {};
      if (output.temporary.empty() || ::stat(output.path.c_str(), &status) != 0) continue;
      SPARSECP_CHECK(!S_ISDIR(status.st_mode), label(output.path, output.what), ": is a directory");
    }
    for (const Output& output : outputs_) {
      if (!output.temporary.empty()) continue;
      const int fd = ::open(output.path.c_str(), O_WRONLY | O_CLOEXEC);
      if (fd < 0) fail_errno(label(output.path, output.what), "open", errno);
      const int error = write_all(fd, output.in_place);
      const int closed = ::close(fd) == 0 ? 0 : errno;
      if (error != 0) fail_errno(label(output.path, output.what), "write", error);
      if (closed != 0) fail_errno(label(output.path, output.what), "close", closed);
    }
    for (Output& output : outputs_) {
      if (output.temporary.empty()) continue;
      if (::rename(output.temporary.c_str(), output.path.c_str()) != 0) {
        fail_errno(label(output.path, output.what), "rename into place", errno);
      }
      output.temporary.clear();
      renamed_.push_back(output.path);
    }
  } catch (...) {
    discard();
    throw;
  }
  for (const std::string& path : renamed_) sync_folder(folder_of(path));
  renamed_.clear();
  committed_ = true;
}

std::vector<std::string> OutputSet::paths() const {
  std::vector<std::string> paths;
  for (const Output& output : outputs_) paths.push_back(output.path);
  return paths;
}

}  // namespace sparsecp
