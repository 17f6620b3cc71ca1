// OutputSet: every output whole or absent — a full device, a full filesystem (a small
// tmpfs mounted for the test when this process may mount), a destination that is a
// directory, and earlier files left untouched by a failed run.
#include "sparsecp/io/output_set.hpp"

#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "sparsecp/error.hpp"

namespace sparsecp {
namespace {

namespace fs = std::filesystem;

std::string read_text(const fs::path& path) {
  std::ifstream file(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()};
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// Names of every entry in `dir` (temporaries included: they start with '.').
std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string error_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

class OutputSetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("sparsecp_output_set_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(OutputSetTest, CommitPutsEveryFileInPlaceAndLeavesNoTemporary) {
  write_text(dir_ / "a.txt", "old a");
  OutputSet outputs;
  outputs.add_text((dir_ / "a.txt").string(), "new a");
  outputs.add_text((dir_ / "b.txt").string(), "new b");
  // Nothing is visible before commit(): the earlier file is untouched.
  EXPECT_EQ(read_text(dir_ / "a.txt"), "old a");
  EXPECT_FALSE(fs::exists(dir_ / "b.txt"));
  outputs.commit();
  EXPECT_EQ(read_text(dir_ / "a.txt"), "new a");
  EXPECT_EQ(read_text(dir_ / "b.txt"), "new b");
  EXPECT_EQ(entries(dir_), (std::vector<std::string>{"a.txt", "b.txt"}));
}

TEST_F(OutputSetTest, ASymbolicLinkIsWrittenThroughNotReplaced) {
  // Issue 30: `calibrate --out link` replaced the link with a file.
  fs::create_directories(dir_ / "real");
  write_text(dir_ / "real" / "model.txt", "old");
  fs::create_symlink("real/model.txt", dir_ / "link");       // relative target
  fs::create_symlink(dir_ / "link", dir_ / "link_to_link");  // a chain, absolute
  fs::create_symlink("real/new.txt", dir_ / "dangling");     // target not there yet
  OutputSet outputs;
  outputs.add_text((dir_ / "link_to_link").string(), "new");
  outputs.add_text((dir_ / "dangling").string(), "made");
  outputs.commit();
  EXPECT_TRUE(fs::is_symlink(fs::symlink_status(dir_ / "link")));
  EXPECT_TRUE(fs::is_symlink(fs::symlink_status(dir_ / "link_to_link")));
  EXPECT_TRUE(fs::is_symlink(fs::symlink_status(dir_ / "dangling")));
  EXPECT_EQ(read_text(dir_ / "real" / "model.txt"), "new");
  EXPECT_EQ(read_text(dir_ / "real" / "new.txt"), "made");
  EXPECT_EQ(entries(dir_ / "real"), (std::vector<std::string>{"model.txt", "new.txt"}));
  fs::create_symlink("loop_b", dir_ / "loop_a");
  fs::create_symlink("loop_a", dir_ / "loop_b");
  OutputSet looping;
  EXPECT_NE(error_of([&] {
              looping.add_text((dir_ / "loop_a").string(), "x");
            }).find("too many levels of symbolic links"),
            std::string::npos);
}

TEST_F(OutputSetTest, AbandonedSetRemovesItsTemporaries) {
  write_text(dir_ / "a.txt", "old a");
  {
    OutputSet outputs;
    outputs.add_text((dir_ / "a.txt").string(), "new a");
    outputs.add_text((dir_ / "c.txt").string(), "new c");
  }  // an error between add() and commit() unwinds here
  EXPECT_EQ(read_text(dir_ / "a.txt"), "old a");
  EXPECT_EQ(entries(dir_), (std::vector<std::string>{"a.txt"}));
}

TEST_F(OutputSetTest, DirectoryDestinationFailsAndNothingIsReplaced) {
  write_text(dir_ / "loss.npy", "earlier run");
  fs::create_directories(dir_ / "grad.npy");
  {
    OutputSet outputs;
    outputs.add_text((dir_ / "loss.npy").string(), "this run");
    EXPECT_EQ(error_of([&] { outputs.add_text((dir_ / "grad.npy").string(), "x", "--out-dir"); }),
              "--out-dir " + (dir_ / "grad.npy").string() + ": is a directory");
  }  // the caller unwinds: the staged loss.npy goes with the set
  // A directory appearing between add() and commit() is caught before any rename.
  OutputSet racing;
  racing.add_text((dir_ / "loss.npy").string(), "this run");
  racing.add_text((dir_ / "late.npy").string(), "this run");
  fs::create_directories(dir_ / "late.npy");
  EXPECT_EQ(error_of([&] { racing.commit(); }), (dir_ / "late.npy").string() + ": is a directory");
  EXPECT_EQ(read_text(dir_ / "loss.npy"), "earlier run");
  EXPECT_EQ(entries(dir_), (std::vector<std::string>{"grad.npy", "late.npy", "loss.npy"}));
}

TEST_F(OutputSetTest, FullDeviceFailsAtCommit) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full on this machine";
  OutputSet outputs;
  outputs.add_text((dir_ / "a.txt").string(), "a");
  outputs.add_text("/dev/full", "bytes", "--out");
  EXPECT_EQ(error_of([&] { outputs.commit(); }),
            std::string("--out /dev/full: write failed: ") + std::strerror(ENOSPC));
  EXPECT_TRUE(entries(dir_).empty());  // the other output is not left behind
  EXPECT_TRUE(fs::exists("/dev/full"));
  EXPECT_FALSE(fs::is_regular_file("/dev/full"));  // never replaced by a rename
}

TEST_F(OutputSetTest, MissingFolderNamesThePath) {
  OutputSet outputs;
  const std::string path = (dir_ / "no" / "such" / "x.npy").string();
  EXPECT_EQ(error_of([&] { outputs.add_text(path, "x", "--out"); }),
            "--out " + path + ": creating a file in its folder failed: " + std::strerror(ENOENT));
}

// A 64 KiB tmpfs that fills: the write that does not fit fails, nothing is left on the
// filesystem, and an earlier file keeps its contents. Needs permission to mount (root in
// a container that allows it); skipped, saying why, otherwise.
TEST_F(OutputSetTest, FullFilesystemLeavesNothingHalfWritten) {
  const fs::path mount_point = dir_ / "small";
  fs::create_directories(mount_point);
  if (::mount("tmpfs", mount_point.c_str(), "tmpfs", 0, "size=64k") != 0) {
    GTEST_SKIP() << "cannot mount a small tmpfs here (" << std::strerror(errno)
                 << "): the full-filesystem case needs permission to mount";
  }
  struct Unmount {
    fs::path path;
    ~Unmount() { ::umount2(path.c_str(), MNT_DETACH); }
  } unmount{mount_point};
  write_text(mount_point / "model.txt", "earlier model");
  const std::string big(256 * 1024, 'x');
  {
    OutputSet outputs;
    outputs.add_text((mount_point / "small.txt").string(), "fits");
    const std::string message =
        error_of([&] { outputs.add_text((mount_point / "model.txt").string(), big, "--out"); });
    EXPECT_EQ(message, "--out " + (mount_point / "model.txt").string() +
                           ": write failed: " + std::strerror(ENOSPC));
    EXPECT_EQ(read_text(mount_point / "model.txt"), "earlier model");
  }  // the staged small file was only a temporary: dropping the set removes it
  EXPECT_EQ(entries(mount_point), (std::vector<std::string>{"model.txt"}));
}

}  // namespace
}  // namespace sparsecp
