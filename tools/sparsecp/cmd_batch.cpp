// `sparsecp batch`: print a generated packed batch's document lengths.
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "batch_input.hpp"
#include "command.hpp"

namespace sparsecp::cli {
namespace {

struct BatchCommand {
  BatchOptions batch;
  int64_t cp = 8;
  bool json = false;
};

const Registration registration("batch", [](CLI::App& app) {
  auto command = std::make_shared<BatchCommand>();
  CLI::App* sub = app.add_subcommand(
      "batch",
      "Print the document lengths of a generated (seeded, deterministic) packed batch,\n"
      "comma-separated on one line");
  command->batch.add_to(*sub);
  sub->add_option("--cp", command->cp, "CP size the default length scale is derived from")
      ->capture_default_str();
  sub->add_flag("--json", command->json, "Print {\"lengths\": [...]} instead");
  sub->footer(
      "Example:\n  sparsecp batch --dist lognormal --tokens 1048576 --cp 8 --seed 1 > batch.txt");
  sub->callback([command] {
    const std::vector<int64_t> lengths = command->batch.load(command->cp);
    if (command->json) {
      nlohmann::json out;
      out["lengths"] = lengths;
      std::cout << out.dump() << "\n";
      return;
    }
    std::string line;
    for (size_t i = 0; i < lengths.size(); ++i) {
      if (i) line += ',';
      line += std::to_string(lengths[i]);
    }
    std::puts(line.c_str());
  });
});

}  // namespace
}  // namespace sparsecp::cli
