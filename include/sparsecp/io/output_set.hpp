// sparsecp: files that are either whole or absent.
//
// A command that writes files (a .npy of selected ids, the KL's loss and gradients, a
// cost model, an SVG chart) must never leave a reader a half-written file, nor report a
// file written that was not (a full disk, a path that is a directory). An OutputSet
// collects every output of one run and makes them appear together (LevelDB
// `SetCurrentFile`: write a temporary, sync, rename over the old name):
//
//   * add(path, bytes) writes `bytes` to a new temporary file in the same folder as
//     `path` (`.<name>.tmp-<pid>-<n>`), checking every write, the fsync and the close;
//     it throws Error naming the path and the system's reason on any failure;
//   * commit() first checks that no destination is a directory, then renames every
//     temporary onto its final name (a rename inside one folder is atomic) and syncs
//     the folders; only after commit() returns may the caller say "wrote X";
//   * on any failure, and when the set is destroyed without commit(), every temporary is
//     removed and so is every file this run already renamed into place; files of
//     earlier runs are untouched until commit() and files that failed are never
//     created.
//
// A destination that exists and is not a regular file or a directory (a character
// device such as /dev/stdout or /dev/full, a FIFO) cannot be replaced by a rename: its
// bytes are written straight to it at commit(), with the same checks, so writing to
// /dev/full fails with "No space left on device" instead of reporting success.
// Not in the seed.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace sparsecp {

class OutputSet {
 public:
  OutputSet() = default;
  OutputSet(const OutputSet&) = delete;
  OutputSet& operator=(const OutputSet&) = delete;
  // Removes every temporary and every file renamed by a commit() that failed.
  ~OutputSet();

  // Stages `bytes` for `path` (see the header comment). `what` names the output in
  // messages (e.g. "--out"; empty: the path alone).
  void add(const std::string& path, std::span<const std::byte> bytes, std::string_view what = {});
  void add_text(const std::string& path, std::string_view text, std::string_view what = {});

  // Puts every staged output in place, or none (see the header comment). Throws Error.
  void commit();

  // The final paths, in the order added.
  std::vector<std::string> paths() const;

 private:
  struct Output {
    std::string path;       // final name
    std::string temporary;  // staged file beside it ("" when written in place)
    std::string what;
    std::vector<std::byte> in_place;  // bytes for a non-regular destination
  };
  void discard() noexcept;

  std::vector<Output> outputs_;
  std::vector<std::string> renamed_;  // destinations this commit() already replaced
  bool committed_ = false;
};

}  // namespace sparsecp
