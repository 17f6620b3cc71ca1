#include "sparsecp/planning/cost_model.hpp"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "sparsecp/error.hpp"
#include "sparsecp/planning/cost.hpp"

namespace sparsecp {

double CostModel::row(int64_t visible) const {
  return a + b * static_cast<double>(visible) + c * static_cast<double>(std::min(topk, visible));
}

double CostModel::prefix(int64_t rows, int64_t ratio) const {
  const int64_t pairs = work_prefix(rows, ratio);
  if (is_causal()) return static_cast<double>(pairs);
  // sum_{p < rows} min(topk, vis(p)): rows before m = topk * ratio - 1 see fewer than
  // topk keys, every later row sees at least topk.
  const int64_t m = topk > (INT64_MAX - 1) / ratio ? INT64_MAX : topk * ratio - 1;
  const double capped = rows <= m ? static_cast<double>(pairs)
                                  : static_cast<double>(work_prefix(m, ratio)) +
                                        static_cast<double>(topk) * static_cast<double>(rows - m);
  return a * static_cast<double>(rows) + b * static_cast<double>(pairs) + c * capped;
}

void validate_cost_model(const CostModel& model) {
  for (const auto& [name, value] : {std::pair{"a", model.a}, {"b", model.b}, {"c", model.c}}) {
    SPARSECP_CHECK(std::isfinite(value) && value >= 0, "cost model coefficient ", name,
                   " must be finite and non-negative, got ", value);
  }
  SPARSECP_CHECK(model.a + model.b + model.c > 0,
                 "cost model needs a positive coefficient (a, b and c are all 0)");
  SPARSECP_CHECK(model.topk >= 1, "cost model topk must be positive, got ", model.topk);
}

namespace {

std::string exact(double value) {
  char text[40];
  std::snprintf(text, sizeof text, "%.17g", value);
  return text;
}

std::string_view trim(std::string_view text) {
  const size_t first = text.find_first_not_of(" \t\r");
  if (first == std::string_view::npos) return {};
  const size_t last = text.find_last_not_of(" \t\r");
  return text.substr(first, last - first + 1);
}

}  // namespace

std::string cost_model_id(const CostModel& model) {
  uint64_t hash = 0xcbf29ce484222325ULL;
  const auto mix_byte = [&](uint8_t byte) {
    hash ^= byte;
    hash *= 0x100000001b3ULL;
  };
  const auto mix_word = [&](uint64_t word) {
    for (int i = 0; i < 8; ++i) mix_byte(static_cast<uint8_t>(word >> (8 * i)));
  };
  const auto mix_text = [&](std::string_view text) {
    mix_word(text.size());
    for (const char ch : text) mix_byte(static_cast<uint8_t>(ch));
  };
  mix_word(std::bit_cast<uint64_t>(model.a));
  mix_word(std::bit_cast<uint64_t>(model.b));
  mix_word(std::bit_cast<uint64_t>(model.c));
  mix_word(static_cast<uint64_t>(model.topk));
  mix_text(model.unit);
  mix_text(model.note);
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(hash));
  return text;
}

std::string format_cost_model(const CostModel& model) {
  std::ostringstream out;
  out << "# sparsecp cost model: per-row cost a + b * vis + c * min(topk, vis)\n"
      << "a " << exact(model.a) << "\nb " << exact(model.b) << "\nc " << exact(model.c) << "\ntopk "
      << model.topk << "\nunit " << model.unit << '\n';
  if (!model.note.empty()) out << "note " << model.note << '\n';
  return out.str();
}

CostModel parse_cost_model(std::string_view text, std::string_view origin) {
  CostModel model;
  bool seen[4] = {false, false, false, false};  // a, b, c, topk
  int64_t number = 0;
  while (!text.empty()) {
    const size_t newline = text.find('\n');
    const std::string_view raw = text.substr(0, newline);
    text = newline == std::string_view::npos ? std::string_view{} : text.substr(newline + 1);
    ++number;
    const std::string_view line = trim(raw);
    if (line.empty() || line.front() == '#') continue;
    const size_t space = line.find_first_of(" \t");
    const std::string_view key = line.substr(0, space);
    const std::string_view value =
        space == std::string_view::npos ? std::string_view{} : trim(line.substr(space));
    if (key == "unit" || key == "note") {
      (key == "unit" ? model.unit : model.note) = std::string(value);
      continue;
    }
    const char* names[] = {"a", "b", "c", "topk"};
    const auto* found = std::find(std::begin(names), std::end(names), key);
    SPARSECP_CHECK(found != std::end(names), origin, " line ", number, ": unknown key '", key,
                   "' (expected a, b, c, topk, unit or note)");
    const size_t index = static_cast<size_t>(found - std::begin(names));
    SPARSECP_CHECK(!seen[index], origin, " line ", number, ": '", key, "' given twice");
    seen[index] = true;
    const char* begin = value.data();
    const char* end = value.data() + value.size();
    if (index == 3) {
      const auto [stop, status] = std::from_chars(begin, end, model.topk);
      SPARSECP_CHECK(!value.empty() && status == std::errc() && stop == end, origin, " line ",
                     number, ": topk '", value, "' is not an integer");
    } else {
      double parsed = 0;
      const auto [stop, status] = std::from_chars(begin, end, parsed);
      SPARSECP_CHECK(!value.empty() && status == std::errc() && stop == end, origin, " line ",
                     number, ": ", key, " '", value, "' is not a number");
      (index == 0 ? model.a : index == 1 ? model.b : model.c) = parsed;
    }
  }
  for (size_t i = 0; i < 4; ++i) {
    const char* names[] = {"a", "b", "c", "topk"};
    SPARSECP_CHECK(seen[i], origin, ": missing '", names[i], "'");
  }
  validate_cost_model(model);
  return model;
}

}  // namespace sparsecp
