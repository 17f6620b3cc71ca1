// libFuzzer target: `sparsecp select --segments FILE` end to end, in process.
//
// The input bytes are the segments JSON file; the other inputs are a small valid
// selection problem (8 keys of dim 16, 6 query rows of 2 heads, ratio 4, topk 3)
// written once. The real command (tools/sparsecp/cmd_select.cpp: JSON parsing,
// segment validation, the fused kernel) runs on it through CLI11 as the tool does.
// Invariants: only sparsecp::Error (or CLI11's own parse errors) may escape; when the
// command accepts the segments, the fused kernel and the plain reference write
// byte-identical outputs, and every id is -1 or a key of the bank.
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "command.hpp"
#include "fuzz_input.hpp"
#include "sparsecp/error.hpp"
#include "sparsecp/io/npy.hpp"

// The tool's main.cpp defines the registry; this target has its own main.
namespace sparsecp::cli {
std::vector<std::pair<const char*, RegisterCommand>>& command_registry() {
  static std::vector<std::pair<const char*, RegisterCommand>> registry;
  return registry;
}
}  // namespace sparsecp::cli

namespace {

std::string directory;

using sparsecp::fuzz::fail;

void write_tensor(const std::string& name, std::vector<int64_t> shape, uint64_t seed) {
  int64_t count = 1;
  for (const int64_t extent : shape) count *= extent;
  std::vector<float> values(static_cast<size_t>(count));
  for (float& value : values) {  // small integers: exact scores, ties broken by id
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    value = static_cast<float>(static_cast<int>(seed >> 61) - 3);
  }
  sparsecp::write_npy(directory + name, sparsecp::NpyDType::kFloat32, shape, values.data());
}

// Runs `sparsecp select ... --out OUT [--reference]`; true when it succeeded.
bool run_select(const std::string& out, bool reference) {
  CLI::App app{"fuzz"};
  for (auto& [name, add] : sparsecp::cli::command_registry()) add(app);
  std::string line = "select --keys " + directory + "k.npy --weights " + directory + "w.npy --q " +
                     directory + "q.npy --segments " + directory +
                     "segments.json --ratio 4 --topk 3 --threads 1 --out " + out;
  if (reference) line += " --reference";
  std::FILE* saved = stdout;  // the command reports what it wrote; keep the log clean
  stdout = std::fopen("/dev/null", "w");
  bool ok = true;
  try {
    app.parse(line, false);
  } catch (const sparsecp::Error&) {
    ok = false;
  } catch (const CLI::ParseError&) {
    ok = false;
  }
  std::fclose(stdout);
  stdout = saved;
  return ok;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  char pattern[] = "/tmp/sparsecp_fuzz_segments_XXXXXX";
  const char* made = mkdtemp(pattern);
  if (made == nullptr) fail("mkdtemp");
  directory = std::string(made) + "/";
  write_tensor("k.npy", {8, 16}, 1);
  write_tensor("w.npy", {6, 2}, 2);
  write_tensor("q.npy", {6, 2, 16}, 3);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  {
    std::ofstream file(directory + "segments.json", std::ios::binary | std::ios::trunc);
    file.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  const bool fused = run_select(directory + "fused.npy", false);
  const bool reference = run_select(directory + "reference.npy", true);
  if (fused != reference) fail("fused and reference disagree on accepting the segments");
  if (!fused) return 0;
  const sparsecp::NpyArray a = sparsecp::read_npy(directory + "fused.npy");
  const sparsecp::NpyArray b = sparsecp::read_npy(directory + "reference.npy");
  if (a.shape != std::vector<int64_t>{6, 3} || a.dtype != sparsecp::NpyDType::kInt32) {
    fail("output is not int32 [6, 3]");
  }
  if (!std::ranges::equal(a.bytes, b.bytes)) fail("fused and reference outputs differ");
  for (int64_t i = 0; i < a.elements(); ++i) {
    const int32_t id = a.as<int32_t>()[i];
    if (id < -1 || id >= 8) fail("selected id outside the bank");
  }
  return 0;
}
