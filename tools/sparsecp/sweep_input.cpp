#include "sweep_input.hpp"

#include "batch_input.hpp"
#include "command.hpp"
#include "sparsecp/error.hpp"

namespace sparsecp::cli {

void SweepOptions::add_to(CLI::App& command, std::string default_cps,
                          std::string default_distributions, std::string default_seeds) {
  cps = std::move(default_cps);
  distributions = std::move(default_distributions);
  seeds = std::move(default_seeds);
  auto* explicit_lengths = command.add_option(
      "--lengths", lengths, "One batch: document lengths in packed order, e.g. 5000,300,2699,1");
  auto* files = command.add_option("--lengths-file", lengths_files,
                                   "A batch from a lengths file; repeat for several batches");
  explicit_lengths->excludes(files);
  command.add_option("--cp", cps, "CP sizes (ranks), comma-separated")->capture_default_str();
  command
      .add_option("--dist", distributions,
                  "Generated workloads when no lengths are given, comma-separated: fixed, "
                  "uniform, lognormal, pareto, bimodal, mixture")
      ->capture_default_str();
  command
      .add_option(names("--seed", {"--seeds"}), seeds,
                  "Generator seeds: a list '1,2' and/or ranges '1-5' (at most 100000 batches)")
      ->capture_default_str();
  command.add_option("--tokens", tokens, "Tokens per generated batch (divisible by each CP)")
      ->capture_default_str();
  command
      .add_option("--scale", scale,
                  "Generated batches: typical document length; 0 = a quarter of the local shard")
      ->capture_default_str();
}

SweepSpec SweepOptions::spec() const {
  SweepSpec spec;
  spec.cps = parse_integer_list(cps, "--cp", false);
  for (const int64_t cp : spec.cps) {
    SPARSECP_CHECK(cp >= 1, "--cp: CP size must be positive, got ", cp);
  }
  if (given()) {
    if (!lengths.empty()) {
      spec.file_batches.push_back(parse_lengths(lengths, "--lengths"));
      spec.file_batch_names.push_back("--lengths");
    }
    for (const std::string& file : lengths_files) {
      spec.file_batches.push_back(read_lengths_file(file));
      spec.file_batch_names.push_back(file);
    }
  } else {
    spec.distributions = parse_name_list(distributions, "--dist");
    spec.seeds.clear();
    for (const int64_t seed : parse_integer_list(seeds, "--seed", true)) {
      SPARSECP_CHECK(seed >= 0, "--seed: seed must be non-negative, got ", seed);
      spec.seeds.push_back(static_cast<uint64_t>(seed));
    }
    spec.tokens = tokens;
    spec.doc_scale = scale;
  }
  SPARSECP_CHECK(sweep_batches(spec) <= kMaxSweepBatches, "the sweep has ", sweep_batches(spec),
                 " batches (--cp x --dist x --seed), more than the limit of ", kMaxSweepBatches);
  return spec;
}

}  // namespace sparsecp::cli
