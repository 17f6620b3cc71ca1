#include "sparsecp/io/cost_model_file.hpp"

#include <fstream>
#include <sstream>

#include "sparsecp/error.hpp"
#include "sparsecp/io/output_set.hpp"

namespace sparsecp {

namespace {

std::string read_whole(const std::string& path) {
  std::ifstream file(path);
  SPARSECP_CHECK(file.good(), "cannot open cost model file '", path, "'");
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

}  // namespace

CostModel load_cost_model(const std::string& path) {
  return parse_cost_model(read_whole(path), path);
}

CostModelSet load_cost_model_set(const std::string& path) {
  return parse_cost_model_set(read_whole(path), path);
}

void save_cost_model_set(const std::string& path, const CostModelSet& set) {
  const std::string text = format_cost_model_set(set);  // validates every model
  OutputSet output;
  output.add_text(path, text, "cost model file");
  output.commit();
}

void save_cost_model(const std::string& path, const CostModel& model) {
  validate_cost_model(model);
  OutputSet output;  // whole or absent: a reader never sees half a model
  output.add_text(path, format_cost_model(model), "cost model file");
  output.commit();
}

}  // namespace sparsecp
