#include "sparsecp/planning/cost_model_set.hpp"

#include <algorithm>
#include <charconv>
#include <sstream>

#include "sparsecp/error.hpp"

namespace sparsecp {

namespace {

std::string_view trim(std::string_view text) {
  const size_t first = text.find_first_not_of(" \t\r");
  if (first == std::string_view::npos) return {};
  const size_t last = text.find_last_not_of(" \t\r");
  return text.substr(first, last - first + 1);
}

bool valid_kind(std::string_view kind) {
  return !kind.empty() && std::all_of(kind.begin(), kind.end(), [](char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '-' || ch == '_';
  });
}

std::string kinds_of(const CostModelSet& set) {
  std::string names;
  for (const LayerCostModel& layer : set.layers) {
    if (!names.empty()) names += ", ";
    names += layer.kind.empty() ? std::string("(unnamed)") : layer.kind;
    if (layer.ratio) names += " (ratio " + std::to_string(*layer.ratio) + ")";
  }
  return names;
}

// One section being read: its model's lines (earlier lines blanked, so the model parser's
// line numbers are the file's) and its ratio.
struct Section {
  LayerCostModel layer;
  std::string text;
};

void finish(Section& section, std::string_view origin, CostModelSet& set) {
  const std::string where = std::string(origin) + " [" + section.layer.kind + "]";
  section.layer.model = parse_cost_model(section.text, where);
  set.layers.push_back(std::move(section.layer));
}

}  // namespace

const CostModel& CostModelSet::select(int64_t ratio, std::string_view kind) const {
  SPARSECP_CHECK(!layers.empty(), "cost model set is empty");
  if (!kind.empty()) {
    const auto found = std::find_if(layers.begin(), layers.end(),
                                    [&](const LayerCostModel& l) { return l.kind == kind; });
    SPARSECP_CHECK(found != layers.end(), "no cost model for layer kind '", kind,
                   "' (the file has: ", kinds_of(*this), ")");
    SPARSECP_CHECK(!found->ratio || *found->ratio == ratio, "cost model for layer kind '", kind,
                   "' is for ratio ", found->ratio.value_or(0), ", not ratio ", ratio);
    return found->model;
  }
  const LayerCostModel* chosen = nullptr;
  for (const LayerCostModel& layer : layers) {
    if (layer.ratio && *layer.ratio != ratio) continue;
    SPARSECP_CHECK(chosen == nullptr, "several cost models fit ratio ", ratio, " ('",
                   chosen ? chosen->kind : "", "' and '", layer.kind,
                   "'): name one with the layer kind (the file has: ", kinds_of(*this), ")");
    chosen = &layer;
  }
  SPARSECP_CHECK(chosen != nullptr, "no cost model for ratio ", ratio,
                 " (the file has: ", kinds_of(*this), ")");
  return chosen->model;
}

CostModelSet parse_cost_model_set(std::string_view text, std::string_view origin) {
  CostModelSet set;
  std::optional<Section> section;
  std::string blanks;  // one '\n' per line read so far
  int64_t number = 0;
  bool sections = false;
  int64_t loose = 0;  // first line with a key before any section
  for (std::string_view rest = text; !rest.empty();) {
    const size_t newline = rest.find('\n');
    const std::string_view raw = rest.substr(0, newline);
    rest = newline == std::string_view::npos ? std::string_view{} : rest.substr(newline + 1);
    ++number;
    const std::string_view line = trim(raw);
    if (!line.empty() && line.front() == '[') {
      SPARSECP_CHECK(line.back() == ']', origin, " line ", number, ": section '", line,
                     "' must end with ']'");
      const std::string_view kind = trim(line.substr(1, line.size() - 2));
      SPARSECP_CHECK(valid_kind(kind), origin, " line ", number, ": layer kind '", kind,
                     "' must be letters, digits, '-' or '_'");
      for (const LayerCostModel& layer : set.layers) {
        SPARSECP_CHECK(layer.kind != kind, origin, " line ", number, ": layer kind '", kind,
                       "' given twice");
      }
      SPARSECP_CHECK(!section || section->layer.kind != kind, origin, " line ", number,
                     ": layer kind '", kind, "' given twice");
      if (section) finish(*section, origin, set);
      section.emplace();
      section->layer.kind = std::string(kind);
      section->text = blanks + '\n';  // the header's own line
      sections = true;
    } else if (section && line.substr(0, line.find_first_of(" \t")) == "ratio") {
      const std::string_view value = trim(line.substr(5));
      SPARSECP_CHECK(!section->layer.ratio, origin, " line ", number, ": 'ratio' given twice");
      int64_t ratio = 0;
      const auto [stop, status] = std::from_chars(value.data(), value.data() + value.size(), ratio);
      SPARSECP_CHECK(!value.empty() && status == std::errc() &&
                         stop == value.data() + value.size() && ratio >= 1,
                     origin, " line ", number, ": ratio '", value, "' is not a positive integer");
      section->layer.ratio = ratio;
      section->text += '\n';
    } else if (section) {
      section->text.append(raw).append("\n");
    } else if (loose == 0 && !line.empty() && line.front() != '#') {
      loose = number;
    }
    blanks += '\n';
  }
  if (section) finish(*section, origin, set);
  SPARSECP_CHECK(!sections || loose == 0, origin, " line ", loose,
                 ": a key before the first [layer kind] section (a file with sections holds "
                 "every model in one)");
  if (!sections)
    set.layers.push_back({std::string(), std::nullopt, parse_cost_model(text, origin)});
  return set;
}

std::string format_cost_model_set(const CostModelSet& set) {
  SPARSECP_CHECK(!set.layers.empty(), "cost model set is empty");
  if (set.layers.size() == 1 && set.layers[0].kind.empty() && !set.layers[0].ratio) {
    return format_cost_model(set.layers[0].model);
  }
  std::ostringstream out;
  out << "# sparsecp cost models, one per layer kind\n";
  for (const LayerCostModel& layer : set.layers) {
    SPARSECP_CHECK(valid_kind(layer.kind), "layer kind '", layer.kind,
                   "' must be letters, digits, '-' or '_'");
    out << '[' << layer.kind << "]\n";
    if (layer.ratio) out << "ratio " << *layer.ratio << '\n';
    validate_cost_model(layer.model);
    out << format_cost_model(layer.model);
  }
  return out.str();
}

}  // namespace sparsecp
