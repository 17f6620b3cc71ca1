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

namespace {

// ln(n!) for n >= 0: a direct sum below 16, else Stirling's series to its n^-5 term
// (truncation error below 1 / (1680 n^7) < 1e-11). No std::lgamma: glibc's writes the
// global signgam, a data race for planners called from several threads.
double log_factorial(int64_t n) {
  if (n < 16) {
    double sum = 0;
    for (int64_t i = 2; i <= n; ++i) sum += std::log(static_cast<double>(i));
    return sum;
  }
  const double x = static_cast<double>(n);
  const double inv = 1.0 / x, inv2 = inv * inv;
  constexpr double kHalfLogTwoPi = 0.91893853320467274178;
  return x * std::log(x) - x + 0.5 * std::log(x) + kHalfLogTwoPi +
         inv * (1.0 / 12 - inv2 * (1.0 / 360 - inv2 / 1260));
}

}  // namespace

double CostModel::heap(int64_t visible) const {
  const int64_t scored = candidates > 0 ? std::min(visible, candidates) : visible;
  if (scored <= topk) return 0;
  return static_cast<double>(topk) *
         std::log(static_cast<double>(scored) / static_cast<double>(topk));
}

double CostModel::heap_prefix(int64_t rows, int64_t ratio) const {
  const int64_t last = rows / ratio;  // keys of the last row, vis(rows - 1)
  if (last <= topk) return 0;         // no row scores more than topk keys
  const int64_t cap = candidates > 0 ? candidates : INT64_MAX;
  if (cap <= topk) return 0;
  const double k = static_cast<double>(topk);
  const double log_k = std::log(k);
  // H(w) = sum_{v = 1}^{w} heap(v) / topk = sum_{v = topk + 1}^{min(w, cap)} ln(v / topk)
  //        + (w - cap) * ln(cap / topk) for the rows beyond the cap.
  const auto sum_to = [&](int64_t w) {
    const int64_t scored = std::min(w, cap);
    if (scored <= topk) return 0.0;
    double sum =
        log_factorial(scored) - log_factorial(topk) - static_cast<double>(scored - topk) * log_k;
    if (w > cap) sum += static_cast<double>(w - cap) * (std::log(static_cast<double>(cap)) - log_k);
    return sum;
  };
  // Each key count v < last is seen by `ratio` positions; `last` by the final
  // rows - last * ratio + 1 (positions p with floor((p + 1) / ratio) = last).
  return static_cast<double>(ratio) * k * sum_to(last - 1) +
         static_cast<double>(rows - last * ratio + 1) * heap(last);
}

int64_t CostModel::width(int64_t visible) const {
  const int64_t keys = candidates > 0 ? std::min(visible, candidates) : visible;
  return (keys + quantum - 1) / quantum * quantum;
}

double CostModel::row(int64_t visible) const {
  return a + b * static_cast<double>(width(visible)) +
         c * static_cast<double>(std::min(topk, visible)) + (d == 0 ? 0.0 : d * heap(visible));
}

int64_t CostModel::width_prefix(int64_t rows, int64_t ratio) const {
  if (exact_widths()) return work_prefix(rows, ratio);
  // width(k) = Q * #{j >= 0 : j * Q < min(k, C)}, so the sum over rows is Q times, for
  // each threshold j < J = ceil(C / Q), the rows that see more than j * Q keys. A row at
  // position p sees at least t keys when p >= t * ratio - 1, so threshold j counts
  // rows + 1 - (j * Q + 1) * ratio rows, for the n thresholds with j * Q + 1 <= rows / ratio.
  const int64_t most = rows / ratio;  // keys of the last row, vis(rows - 1)
  if (most == 0) return 0;
  int64_t n = (most - 1) / quantum + 1;
  if (candidates > 0) n = std::min(n, (candidates + quantum - 1) / quantum);
  // sum_{j < n} (rows + 1 - ratio - j * Q * ratio); n * (n - 1) is even, and Q * (n - 1)
  // stays below `most`, so no intermediate exceeds the result's magnitude by much.
  return quantum * n * (rows + 1 - ratio) - ratio * quantum * quantum * (n * (n - 1) / 2);
}

double CostModel::prefix(int64_t rows, int64_t ratio) const {
  const int64_t pairs = work_prefix(rows, ratio);
  if (is_causal()) return static_cast<double>(pairs);
  const int64_t keys = exact_widths() ? pairs : width_prefix(rows, ratio);
  // sum_{p < rows} min(topk, vis(p)): rows before m = topk * ratio - 1 see fewer than
  // topk keys, every later row sees at least topk.
  const int64_t m = topk > (INT64_MAX - 1) / ratio ? INT64_MAX : topk * ratio - 1;
  const double capped = rows <= m ? static_cast<double>(pairs)
                                  : static_cast<double>(work_prefix(m, ratio)) +
                                        static_cast<double>(topk) * static_cast<double>(rows - m);
  return a * static_cast<double>(rows) + b * static_cast<double>(keys) + c * capped +
         (d == 0 ? 0.0 : d * heap_prefix(rows, ratio));
}

void validate_cost_model(const CostModel& model) {
  for (const auto& [name, value] :
       {std::pair{"a", model.a}, {"b", model.b}, {"c", model.c}, {"d", model.d}}) {
    SPARSECP_CHECK(std::isfinite(value) && value >= 0, "cost model coefficient ", name,
                   " must be finite and non-negative, got ", value);
    SPARSECP_CHECK(value <= kMaxCostModelCoefficient, "cost model coefficient ", name,
                   " must be at most ", kMaxCostModelCoefficient,
                   " (so that no batch's cost overflows), got ", value);
  }
  SPARSECP_CHECK(model.a + model.b + model.c + model.d > 0,
                 "cost model needs a positive coefficient (a, b, c and d are all 0)");
  SPARSECP_CHECK(model.topk >= 1, "cost model topk must be positive, got ", model.topk);
  SPARSECP_CHECK(model.candidates >= 0,
                 "cost model candidates must be non-negative (0 = no cap), got ", model.candidates);
  SPARSECP_CHECK(model.quantum >= 1 && model.quantum <= kMaxCostModelQuantum,
                 "cost model quantum must be in [1, ", kMaxCostModelQuantum, "], got ",
                 model.quantum);
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
  if (model.d != 0) mix_word(std::bit_cast<uint64_t>(model.d));  // 3-term models keep their ids
  if (!model.exact_widths()) {  // older models (no such terms) keep their ids
    mix_word(static_cast<uint64_t>(model.candidates));
    mix_word(static_cast<uint64_t>(model.quantum));
  }
  mix_text(model.unit);
  mix_text(model.note);
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(hash));
  return text;
}

std::string format_cost_model(const CostModel& model) {
  std::ostringstream out;
  out << "# sparsecp cost model: per-row cost a + b * vis + c * min(topk, vis)"
      << (model.d == 0 ? "" : " + d * topk * ln(max(vis, topk) / topk)")
      << (model.exact_widths() ? "" : ", vis priced as roundup(min(vis, candidates), quantum)")
      << "\n"
      << "a " << exact(model.a) << "\nb " << exact(model.b) << "\nc " << exact(model.c) << '\n';
  if (model.d != 0) out << "d " << exact(model.d) << '\n';
  out << "topk " << model.topk << '\n';
  if (model.candidates != 0) out << "candidates " << model.candidates << '\n';
  if (model.quantum != 1) out << "quantum " << model.quantum << '\n';
  out << "unit " << model.unit << '\n';
  if (!model.note.empty()) out << "note " << model.note << '\n';
  return out.str();
}

CostModel parse_cost_model(std::string_view text, std::string_view origin) {
  CostModel model;
  // a, b, c and topk are required; d, candidates and quantum keep their defaults.
  constexpr const char* names[] = {"a", "b", "c", "topk", "d", "candidates", "quantum"};
  constexpr size_t required = 4;
  bool seen[std::size(names)] = {};
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
    const auto* found = std::find(std::begin(names), std::end(names), key);
    SPARSECP_CHECK(found != std::end(names), origin, " line ", number, ": unknown key '", key,
                   "' (expected a, b, c, d, topk, candidates, quantum, unit or note)");
    const size_t index = static_cast<size_t>(found - std::begin(names));
    SPARSECP_CHECK(!seen[index], origin, " line ", number, ": '", key, "' given twice");
    seen[index] = true;
    const char* begin = value.data();
    const char* end = value.data() + value.size();
    if (index == 3 || index >= 5) {
      int64_t& target = index == 3 ? model.topk : index == 5 ? model.candidates : model.quantum;
      const auto [stop, status] = std::from_chars(begin, end, target);
      SPARSECP_CHECK(!value.empty() && status == std::errc() && stop == end, origin, " line ",
                     number, ": ", key, " '", value, "' is not an integer");
    } else {
      double parsed = 0;
      const auto [stop, status] = std::from_chars(begin, end, parsed);
      SPARSECP_CHECK(!value.empty() && status == std::errc() && stop == end, origin, " line ",
                     number, ": ", key, " '", value, "' is not a number");
      (index == 0 ? model.a : index == 1 ? model.b : index == 2 ? model.c : model.d) = parsed;
    }
  }
  for (size_t i = 0; i < required; ++i) {
    SPARSECP_CHECK(seen[i], origin, ": missing '", names[i], "'");
  }
  validate_cost_model(model);
  return model;
}

}  // namespace sparsecp
