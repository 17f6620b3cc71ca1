#include "sparsecp/io/cost_model_file.hpp"

#include <fstream>
#include <sstream>

#include "sparsecp/error.hpp"

namespace sparsecp {

CostModel load_cost_model(const std::string& path) {
  std::ifstream file(path);
  SPARSECP_CHECK(file.good(), "cannot open cost model file '", path, "'");
  std::ostringstream text;
  text << file.rdbuf();
  return parse_cost_model(text.str(), path);
}

void save_cost_model(const std::string& path, const CostModel& model) {
  validate_cost_model(model);
  std::ofstream file(path);
  SPARSECP_CHECK(file.good(), "cannot write cost model file '", path, "'");
  file << format_cost_model(model);
  file.flush();
  SPARSECP_CHECK(file.good(), "cannot write cost model file '", path, "'");
}

}  // namespace sparsecp
