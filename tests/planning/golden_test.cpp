// Golden parity with the seed (indexer_balance.py): replays the cases of
// tests/data/golden_cases.json, produced by running the seed's own planner and routes
// (tools/golden/make_golden.py), through plan_tasks, make_route (every rank) and
// indexer_route (every rank; zigzag takes its fast path there), and requires the
// same plans, the same route fields and the same error texts.
//
// One test per case family; a mismatch names the case id and the first differing
// field. Row lists are stored in the file as runs [first, count] of consecutive rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <exception>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "sparsecp/error.hpp"
#include "sparsecp/planning/plan.hpp"
#include "sparsecp/planning/route.hpp"

namespace sparsecp {
namespace {

using nlohmann::json;

const char* const kGoldenPath = SPARSECP_TEST_DATA_DIR "/golden_cases.json";

// The parsed golden file, or a null document when it cannot be read (the test
// DataIsComplete then reports why; listing tests must not throw).
const json& golden() {
  static const json document = [] {
    std::ifstream in(kGoldenPath);
    if (!in) return json();
    return json::parse(in, nullptr, /*allow_exceptions=*/false);
  }();
  return document;
}

std::vector<std::string> families() {
  std::vector<std::string> names;
  const json& document = golden();
  if (!document.is_object() || !document.contains("cases")) return {"unreadable"};
  for (const json& entry : document["cases"]) {
    const std::string family = entry.value("family", "");
    if (std::find(names.begin(), names.end(), family) == names.end()) names.push_back(family);
  }
  return names;
}

// Inputs of one case, as the C++ API takes them. The mode stays a string: parsing
// it is part of what is compared (bad modes fail in parse_mode).
struct Inputs {
  std::vector<int64_t> lengths;
  int64_t cp = 0;
  int64_t ratio = 0;
  std::string mode;
  std::optional<int64_t> block_size;
  std::optional<int64_t> zigzag_min_length;

  PlanOptions options() const {
    PlanOptions result;
    result.mode = parse_mode(mode);
    result.block_size = block_size;
    result.zigzag_min_length = zigzag_min_length;
    return result;
  }
};

std::optional<int64_t> optional_int(const json& value) {
  if (value.is_null()) return std::nullopt;
  return value.get<int64_t>();
}

Inputs inputs_of(const json& entry) {
  Inputs in;
  in.lengths = entry.at("lengths").get<std::vector<int64_t>>();
  in.cp = entry.at("cp").get<int64_t>();
  in.ratio = entry.at("ratio").get<int64_t>();
  in.mode = entry.at("mode").get<std::string>();
  in.block_size = optional_int(entry.at("block_size"));
  in.zigzag_min_length = optional_int(entry.at("zigzag_min_length"));
  return in;
}

std::vector<int64_t> expand_runs(const json& runs) {
  std::vector<int64_t> rows;
  for (const json& run : runs) {
    const int64_t first = run.at(0).get<int64_t>();
    const int64_t count = run.at(1).get<int64_t>();
    for (int64_t i = 0; i < count; ++i) rows.push_back(first + i);
  }
  return rows;
}

template <typename T>
std::string show(const std::vector<T>& values) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < values.size() && i < 12; ++i) out << (i ? ", " : "") << values[i];
  if (values.size() > 12) out << ", ... (" << values.size() << " values)";
  out << "]";
  return out.str();
}

// First difference between two integer lists, or nullopt when equal.
std::optional<std::string> diff_list(const std::string& field, const std::vector<int64_t>& actual,
                                     const std::vector<int64_t>& expected) {
  const size_t common = std::min(actual.size(), expected.size());
  for (size_t i = 0; i < common; ++i) {
    if (actual[i] != expected[i]) {
      std::ostringstream out;
      out << field << "[" << i << "]: got " << actual[i] << ", seed " << expected[i];
      return out.str();
    }
  }
  if (actual.size() != expected.size()) {
    std::ostringstream out;
    out << field << ": got " << actual.size() << " values, seed " << expected.size()
        << " (first extra at index " << common << ")";
    return out.str();
  }
  return std::nullopt;
}

std::optional<std::string> diff_route(const IndexerRoute& route, const json& expected) {
  std::vector<int64_t> segments, seed_segments;
  for (const Segment& s : route.segments) {
    segments.insert(segments.end(), {s.q_begin, s.q_end, s.key_begin, s.key_end, s.residual});
  }
  for (const json& s : expected.at("segments")) {
    for (const json& value : s) seed_segments.push_back(value.get<int64_t>());
  }
  if (auto d = diff_list("segments (flattened, 5 per segment)", segments, seed_segments)) return d;
  const std::pair<const char*, const std::vector<int64_t>*> splits[] = {
      {"input_splits", &route.input_splits}, {"output_splits", &route.output_splits}};
  for (const auto& [name, values] : splits) {
    if (auto d = diff_list(name, *values, expected.at(name).get<std::vector<int64_t>>())) return d;
  }
  const std::pair<const char*, const std::vector<int64_t>*> rows[] = {
      {"send_rows", &route.send_rows},
      {"receive_rows", &route.receive_rows},
      {"local_sources", &route.local_sources},
      {"local_targets", &route.local_targets}};
  for (const auto& [name, values] : rows) {
    if (auto d = diff_list(name, *values, expand_runs(expected.at(name)))) return d;
  }
  const int64_t seed_count = expected.at("query_count").get<int64_t>();
  if (route.query_count != seed_count) {
    return "query_count: got " + std::to_string(route.query_count) + ", seed " +
           std::to_string(seed_count);
  }
  return std::nullopt;
}

std::optional<std::string> diff_plan(const TaskPlan& plan, const json& expected) {
  if (plan.cp() != static_cast<int64_t>(expected.size())) {
    return "plan: got " + std::to_string(plan.cp()) + " ranks, seed " +
           std::to_string(expected.size());
  }
  for (int64_t rank = 0; rank < plan.cp(); ++rank) {
    std::vector<int64_t> tasks, seed_tasks;
    for (const Task& t : plan.tasks(rank)) tasks.insert(tasks.end(), {t.document, t.start, t.end});
    for (const json& t : expected.at(rank)) {
      for (const json& value : t) seed_tasks.push_back(value.get<int64_t>());
    }
    const std::string field = "plan[rank " + std::to_string(rank) + "] (flattened [d, s, e])";
    if (auto d = diff_list(field, tasks, seed_tasks)) return d;
  }
  return std::nullopt;
}

// Runs `call` and compares its failure with the seed's error text.
std::optional<std::string> expect_error(const std::string& what, const std::function<void()>& call,
                                        const std::string& seed_text) {
  try {
    call();
  } catch (const Error& error) {
    if (std::string(error.what()).find(seed_text) != std::string::npos) return std::nullopt;
    return what + ": error text '" + error.what() + "' lacks the seed's '" + seed_text + "'";
  } catch (const std::exception& error) {
    return what + ": threw a non-sparsecp exception '" + error.what() + "', seed: '" + seed_text +
           "'";
  }
  return what + ": no error, seed: '" + seed_text + "'";
}

// Mode 'none' (a sparsecp extension the seed rejects): every rank keeps exactly
// its own contiguous rows, in order, and its route moves nothing.
std::optional<std::string> check_none_plan(const Inputs& in) {
  const TaskPlan plan = plan_tasks(in.lengths, in.cp, in.ratio, in.options());
  std::vector<int64_t> boundaries{0};
  for (int64_t n : in.lengths) boundaries.push_back(boundaries.back() + n);
  const int64_t local = boundaries.back() / in.cp;
  for (int64_t rank = 0; rank < in.cp; ++rank) {
    std::vector<int64_t> rows, own;
    for (const Task& t : plan.tasks(rank)) {
      for (int64_t p = t.start; p < t.end; ++p) rows.push_back(boundaries[t.document] + p);
    }
    for (int64_t row = rank * local; row < (rank + 1) * local; ++row) own.push_back(row);
    if (auto d = diff_list("none plan rows of rank " + std::to_string(rank), rows, own)) return d;
  }
  return std::nullopt;
}

std::optional<std::string> check_none_route(const Inputs& in, int64_t rank) {
  const IndexerRoute route = indexer_route(in.lengths, in.cp, rank, in.ratio, in.options());
  int64_t total = 0;
  for (int64_t n : in.lengths) total += n;
  const int64_t local = total / in.cp;
  std::vector<int64_t> own(static_cast<size_t>(local));
  for (int64_t i = 0; i < local; ++i) own[static_cast<size_t>(i)] = i;
  const std::vector<int64_t> zeros(static_cast<size_t>(in.cp), 0);
  if (auto d = diff_list("none input_splits", route.input_splits, zeros)) return d;
  if (auto d = diff_list("none output_splits", route.output_splits, zeros)) return d;
  if (auto d = diff_list("none send_rows", route.send_rows, {})) return d;
  if (auto d = diff_list("none receive_rows", route.receive_rows, {})) return d;
  if (auto d = diff_list("none local_sources", route.local_sources, own)) return d;
  if (auto d = diff_list("none local_targets", route.local_targets, own)) return d;
  if (route.query_count != local) return "none query_count " + std::to_string(route.query_count);
  return std::nullopt;
}

std::optional<std::string> check_success(const Inputs& in, const json& entry) {
  const TaskPlan plan = plan_tasks(in.lengths, in.cp, in.ratio, in.options());
  if (auto d = diff_plan(plan, entry.at("plan"))) return d;
  const json& routes = entry.at("routes");
  for (int64_t rank = 0; rank < in.cp; ++rank) {
    const json& expected = routes.at(static_cast<size_t>(rank));
    const std::string where = "rank " + std::to_string(rank) + ": ";
    if (auto d = diff_route(make_route(plan, in.lengths, rank, in.ratio), expected)) {
      return "make_route " + where + *d;
    }
    if (auto d =
            diff_route(indexer_route(in.lengths, in.cp, rank, in.ratio, in.options()), expected)) {
      return "indexer_route " + where + *d;
    }
  }
  return std::nullopt;
}

std::optional<std::string> check_failure(const Inputs& in, const json& entry) {
  const int64_t rank = entry.at("route_rank").get<int64_t>();
  if (!entry.value("plan_comparable", true)) {
    if (auto d = check_none_plan(in)) return d;
  } else if (entry.at("plan_error").is_null()) {
    (void)plan_tasks(in.lengths, in.cp, in.ratio, in.options());  // must not throw
  } else {
    const auto plan = [&] { (void)plan_tasks(in.lengths, in.cp, in.ratio, in.options()); };
    if (auto d = expect_error("plan_tasks", plan, entry.at("plan_error").get<std::string>())) {
      return d;
    }
  }
  if (!entry.value("route_comparable", true)) return check_none_route(in, rank);
  const auto route = [&] { (void)indexer_route(in.lengths, in.cp, rank, in.ratio, in.options()); };
  return expect_error("indexer_route(rank " + std::to_string(rank) + ")", route,
                      entry.at("route_error").get<std::string>());
}

// Compares one case; returns a description of the first mismatch.
std::optional<std::string> check_case(const json& entry) {
  const Inputs in = inputs_of(entry);
  try {
    if (entry.contains("plan")) return check_success(in, entry);
    return check_failure(in, entry);
  } catch (const std::exception& error) {
    return std::string("unexpected exception: ") + error.what();
  }
}

TEST(GoldenData, DataIsComplete) {
  const json& document = golden();
  ASSERT_TRUE(document.is_object() && document.contains("cases"))
      << "cannot read " << kGoldenPath << "; regenerate it with tools/golden/make_golden.py";
  const json& cases = document["cases"];
  int64_t planned = 0;
  for (const json& entry : cases) planned += entry.contains("plan") ? 1 : 0;
  EXPECT_GE(cases.size(), 300u);
  EXPECT_GE(planned, 300);
  for (const char* mode : {"zigzag", "greedy", "hybrid"}) {
    const auto count = std::count_if(cases.begin(), cases.end(), [&](const json& entry) {
      return entry.contains("plan") && entry["mode"] == mode;
    });
    EXPECT_GE(count, 50) << mode;
  }
}

class GoldenFamily : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenFamily, MatchesSeed) {
  const json& document = golden();
  ASSERT_TRUE(document.is_object() && document.contains("cases")) << "cannot read " << kGoldenPath;
  int checked = 0, failed = 0;
  for (const json& entry : document["cases"]) {
    if (entry.value("family", "") != GetParam()) continue;
    ++checked;
    if (auto mismatch = check_case(entry)) {
      if (++failed <= 20) ADD_FAILURE() << entry.value("id", "?") << ": " << *mismatch;
    }
  }
  EXPECT_EQ(failed, 0) << failed << " of " << checked << " cases differ from the seed";
  EXPECT_GT(checked, 0);
  RecordProperty("cases", checked);
}

// A family name as a test name: letters, digits and underscores only.
std::string family_test_name(const ::testing::TestParamInfo<std::string>& param) {
  std::string name = param.param;
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name.empty() ? std::string("unnamed") : name;
}

INSTANTIATE_TEST_SUITE_P(Seed, GoldenFamily, ::testing::ValuesIn(families()), family_test_name);

}  // namespace
}  // namespace sparsecp
