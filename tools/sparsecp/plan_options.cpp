#include "plan_options.hpp"

namespace sparsecp::cli {

void PlanFlags::add_to(CLI::App& command, const std::string& mode_help) {
  batch.add_to(command);
  command.add_option("--cp", cp, "CP group size (ranks); the batch's tokens must divide by it")
      ->capture_default_str();
  command.add_option("--ratio", ratio, "Key compression ratio of the indexer layer")
      ->capture_default_str();
  command.add_option("--mode", mode, mode_help);
  command.add_option("--block", block_size,
                     "Greedy/hybrid: rows per pooled block before merging (default 2048; at most "
                     "the local row count)");
  command.add_option("--zigzag-min-length", zigzag_min_length,
                     "Hybrid: documents of at least this many tokens keep their zigzag chunks "
                     "(required for --mode hybrid; no default is chosen for you)");
}

PlanOptions PlanFlags::options(Mode selected) const {
  PlanOptions result;
  result.mode = selected;
  result.block_size = block_size;
  result.zigzag_min_length = zigzag_min_length;
  return result;
}

}  // namespace sparsecp::cli
