#include "sparsecp/io/cost_model_file.hpp"

#include <fstream>
#include <sstream>

#include "sparsecp/error.hpp"
#include "sparsecp/io/output_set.hpp"

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
  OutputSet output;  // whole or absent: a reader never sees half a model
  output.add_text(path, format_cost_model(model), "cost model file");
  output.commit();
}

}  // namespace sparsecp
