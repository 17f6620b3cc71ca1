// Plans and routes do not change behind a refactor: every registered strategy's plan of a
// fixed set of sweep batches, and every rank's route under it, folded into one digest
// that was recorded from the planner before the one-Plan-type restructuring. A change of
// any task, padding count, unit work, note or route field changes the digest.
//
// When a planner changes on purpose, print the new digest (SPARSECP_PRINT_DIGEST=1) and
// record it here with the reason in the commit message.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string_view>
#include <vector>

#include "sparsecp/planning/route.hpp"
#include "sparsecp/planning/strategy.hpp"
#include "sparsecp/planning/workload.hpp"

namespace sparsecp {
namespace {

struct Digest {
  uint64_t state = 0x9E3779B97F4A7C15ull;
  void add(uint64_t value) {
    state ^= value + 0x9E3779B97F4A7C15ull + (state << 6) + (state >> 2);
    state *= 0xBF58476D1CE4E5B9ull;
  }
  void add(std::span<const int64_t> values) {
    add(values.size());
    for (const int64_t v : values) add(static_cast<uint64_t>(v));
  }
  void add(std::string_view text) {
    add(text.size());
    for (const char c : text) add(static_cast<unsigned char>(c));
  }
};

void add_route(Digest& digest, const IndexerRoute& route) {
  digest.add(route.segments.size());
  for (const Segment& s : route.segments) {
    for (const int64_t v : {s.q_begin, s.q_end, s.key_begin, s.key_end, s.residual}) {
      digest.add(static_cast<uint64_t>(v));
    }
  }
  digest.add(route.input_splits);
  digest.add(route.output_splits);
  digest.add(route.send_rows);
  digest.add(route.receive_rows);
  digest.add(route.local_sources);
  digest.add(route.local_targets);
  digest.add(static_cast<uint64_t>(route.query_count));
}

TEST(PlanIdentity, SweepBatchesPlanAndRouteAsRecorded) {
  Digest digest;
  int64_t plans = 0;
  for (const int64_t cp : {4, 16, 64}) {
    for (const char* distribution : {"lognormal", "pareto", "mixture"}) {
      for (const uint64_t seed : {1u, 2u}) {
        const std::vector<int64_t> lengths = generate_batch(WorkloadSpec{
            .distribution = distribution, .tokens = 1 << 18, .scale = 0, .cp = cp, .seed = seed});
        digest.add(lengths);
        for (const Strategy* strategy : all_strategies()) {
          digest.add(strategy->name());
          const auto plan = strategy->plan(lengths, cp, 4, StrategyParams{});
          const TaskPlan& tasks = plan.tasks();
          for (int64_t rank = 0; rank < cp; ++rank) {
            for (const Task& task : tasks.tasks(rank)) {
              digest.add(static_cast<uint64_t>(task.document));
              digest.add(static_cast<uint64_t>(task.start));
              digest.add(static_cast<uint64_t>(task.end));
            }
            digest.add(~uint64_t{0});
            add_route(digest, plan.route(rank));
            // The seed modes route through indexer_route (zigzag: its fast path that plans
            // only this rank), which must equal the plan's route; the other strategies'
            // route() is plan().route() by definition (and would re-plan per rank).
            if (strategy->listing_order() < 10 && rank % 7 == 0) {
              EXPECT_EQ(strategy->route(lengths, cp, rank, 4, StrategyParams{}), plan.route(rank))
                  << strategy->name() << " cp " << cp << " rank " << rank;
            }
          }
          digest.add(plan.padding_rows());
          digest.add(static_cast<uint64_t>(plan.largest_unit_work()));
          digest.add(plan.note());
          ++plans;
        }
      }
    }
  }
  if (std::getenv("SPARSECP_PRINT_DIGEST") != nullptr) {
    std::printf("plans %lld digest 0x%016llx\n", static_cast<long long>(plans),
                static_cast<unsigned long long>(digest.state));
  }
  EXPECT_EQ(plans, 18 * static_cast<int64_t>(all_strategies().size()));
  // Recorded from the planner of commit 0351c98 (before Strategy::plan returned a Plan).
  EXPECT_EQ(digest.state, 0xb64b108f3dac8834ull);
}

}  // namespace
}  // namespace sparsecp
