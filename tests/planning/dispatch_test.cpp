// KV dispatch tests: hand-checked routes, brute-force models of every route and of the
// document compression plan, and the gathers run in-process with one thread per rank.
//
// The model (LevelDB-style): simulate every rank of the group over the whole global
// sequence in one process. What rank p sends to rank q must be what q expects from p,
// row for row; each rank's gathered block must equal the global slice
// [global_start, global_end); every row's needed keys must be inside it and the block
// must be no larger than the union of those needs; and all ranks must agree on
// "exchange needed".
#include "sparsecp/planning/dispatch.hpp"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <thread>

#include "sparsecp/error.hpp"
#include "sparsecp/planning/compression_plan.hpp"
#include "sparsecp/transport/sequence_gather.hpp"
#include "support/random_batch.hpp"
#include "support/tool_runner.hpp"

namespace sparsecp {
namespace {

using ::sparsecp::testing::test_seed;

int64_t pick(SplitMix64& random, int64_t lo, int64_t hi) {  // uniform in [lo, hi]
  return lo + static_cast<int64_t>(random.next() % static_cast<uint64_t>(hi - lo + 1));
}

// A random group: size ranks of `local` raw tokens, documents cut at random points with
// a random density (from one document to one per token).
struct RandomSequence {
  int64_t size = 1;
  int64_t local = 1;
  std::vector<int64_t> boundaries;
};

RandomSequence random_sequence(SplitMix64& random) {
  RandomSequence sequence;
  static constexpr int64_t kSizes[] = {1, 2, 3, 4, 5, 7, 8, 11};
  sequence.size = kSizes[pick(random, 0, 7)];
  sequence.local = pick(random, 0, 3) == 0 ? pick(random, 1, 3) : pick(random, 1, 37);
  const int64_t total = sequence.size * sequence.local;
  static constexpr int64_t kDensity[] = {0, 2, 10, 50, 100};  // percent of cut points
  const int64_t density = kDensity[pick(random, 0, 4)];
  sequence.boundaries.push_back(0);
  for (int64_t token = 1; token < total; ++token) {
    if (pick(random, 1, 100) <= density) sequence.boundaries.push_back(token);
  }
  sequence.boundaries.push_back(total);
  return sequence;
}

std::string describe(const RandomSequence& sequence) {
  std::string text = "size=" + std::to_string(sequence.size) +
                     " local=" + std::to_string(sequence.local) + " boundaries=";
  for (const int64_t b : sequence.boundaries) text += std::to_string(b) + ",";
  return text;
}

int64_t document_start(std::span<const int64_t> boundaries, int64_t token) {
  int64_t start = 0;
  for (const int64_t b : boundaries) {
    if (b <= token) start = b;
  }
  return start;
}

// Runs the routes' transport by hand: rank p's local rows are global rows
// [local_start_p, ...) of `bank`; returns each rank's gathered block. Checks that send
// and receive splits agree pairwise.
std::vector<std::vector<int64_t>> simulate_dispatch(
    const std::vector<SequenceDispatchRoute>& routes) {
  const auto size = static_cast<int64_t>(routes.size());
  std::vector<std::vector<int64_t>> blocks(size);
  for (int64_t q = 0; q < size; ++q) {
    const SequenceDispatchRoute& consumer = routes[q];
    EXPECT_EQ(consumer.send_splits[q], 0);
    EXPECT_EQ(consumer.receive_splits[q], 0);
    for (int64_t p = 0; p < size; ++p) {
      const SequenceDispatchRoute& owner = routes[p];
      EXPECT_EQ(owner.send_splits[q], consumer.receive_splits[p]) << "owner " << p << " to " << q;
      for (int64_t i = 0; i < owner.send_splits[q]; ++i) {
        const int64_t row = owner.send_begin[q] + i;
        EXPECT_LT(row, owner.local_length);
        blocks[q].push_back(owner.local_start + row);
      }
    }
    for (int64_t i = 0; i < consumer.local_length; ++i)
      blocks[q].push_back(consumer.local_start + i);
  }
  return blocks;
}

// The checks every route family shares. needs[q] is the union [start, end) of the bank
// rows rank q's queries need (start == end when they need none).
void check_routes(const std::vector<SequenceDispatchRoute>& routes,
                  const std::vector<std::pair<int64_t, int64_t>>& needs,
                  const std::vector<int64_t>& owners) {
  const auto size = static_cast<int64_t>(routes.size());
  const auto blocks = simulate_dispatch(routes);
  bool any_exchange = false;
  for (int64_t q = 0; q < size; ++q) {
    const SequenceDispatchRoute& route = routes[q];
    SCOPED_TRACE("rank " + std::to_string(q));
    EXPECT_EQ(route.exchange_needed, routes[0].exchange_needed);
    EXPECT_EQ(route.local_start, owners[q]);
    EXPECT_EQ(route.local_length, owners[q + 1] - owners[q]);
    EXPECT_EQ(route.global_end, owners[q + 1]);
    std::vector<int64_t> slice(route.block_rows());
    std::iota(slice.begin(), slice.end(), route.global_start);
    EXPECT_EQ(blocks[q], slice);
    EXPECT_EQ(route.received_rows(), std::accumulate(route.receive_splits.begin(),
                                                     route.receive_splits.end(), int64_t{0}));
    const auto [need_start, need_end] = needs[q];
    if (need_start < need_end) {
      // Every needed key present, and nothing beyond the needs.
      EXPECT_EQ(route.global_start, need_start);
      EXPECT_EQ(route.global_end, need_end);
    } else {
      EXPECT_EQ(route.block_rows(), 0);
    }
    any_exchange = any_exchange || route.received_rows() > 0;
  }
  EXPECT_EQ(routes[0].exchange_needed, any_exchange);
}

// ---------------------------------------------------------------------------
// Hand-checked cases.

TEST(SlidingWindowRoute, WorkedExample) {
  // Documents (5000, 300, 2699, 1) on 4 ranks of 2000 tokens, window 128.
  const std::vector<int64_t> boundaries =
      document_boundaries(std::vector<int64_t>{5000, 300, 2699, 1});
  ASSERT_EQ(boundaries, (std::vector<int64_t>{0, 5000, 5300, 7999, 8000}));
  const int64_t expected_start[] = {0, 1873, 3873, 5873};
  for (int64_t rank = 0; rank < 4; ++rank) {
    const SequenceDispatchRoute route = sliding_window_route(boundaries, 2000, 4, rank, 128);
    EXPECT_EQ(route.global_start, expected_start[rank]);
    EXPECT_EQ(route.global_end, (rank + 1) * 2000);
    EXPECT_EQ(route.local_length, 2000);
    EXPECT_TRUE(route.exchange_needed);
  }
  const SequenceDispatchRoute rank2 = sliding_window_route(boundaries, 2000, 4, 2, 128);
  EXPECT_EQ(rank2.receive_splits, (std::vector<int64_t>{0, 127, 0, 0}));
  EXPECT_EQ(rank2.send_begin, (std::vector<int64_t>{0, 0, 0, 1873}));
  EXPECT_EQ(rank2.send_splits, (std::vector<int64_t>{0, 0, 0, 127}));
  // A document starting exactly at the shard boundary stops the halo.
  const std::vector<int64_t> aligned = {0, 2000, 4000, 8000};
  EXPECT_EQ(sliding_window_route(aligned, 2000, 4, 1, 128).global_start, 2000);
  EXPECT_EQ(sliding_window_route(aligned, 2000, 4, 3, 128).global_start, 5873);
  // Only documents on shard boundaries: nobody exchanges.
  EXPECT_FALSE(
      sliding_window_route(std::vector<int64_t>{0, 2000, 4000}, 2000, 2, 0, 9).exchange_needed);
  // A window of 1 sees only the token itself.
  EXPECT_FALSE(sliding_window_route(boundaries, 2000, 4, 1, 1).exchange_needed);
  // A window wider than several shards reaches back to the document start.
  const SequenceDispatchRoute wide = sliding_window_route(std::vector<int64_t>{0, 10}, 2, 5, 4,
                                                          std::numeric_limits<int64_t>::max());
  EXPECT_EQ(wide.global_start, 0);
  EXPECT_EQ(wide.receive_splits, (std::vector<int64_t>{2, 2, 2, 2, 0}));
}

TEST(DocumentPrefixRoute, WorkedExample) {
  // Documents (5, 3, 7, 1) on 4 ranks of 4 tokens, ratio 2: blocks
  // doc0 [0,2) [2,4), doc1 [5,7), doc2 [8,10) [10,12) [12,14); doc1 and doc2 tails drop.
  const std::vector<int64_t> boundaries = {0, 5, 8, 15, 16};
  EXPECT_EQ(compressed_document_offsets(boundaries, 2), (std::vector<int64_t>{0, 2, 3, 6, 6}));
  // Owners by last token: 1->r0, 3->r0, 6->r1, 9->r2, 11->r2, 13->r3.
  EXPECT_EQ(compressed_owner_offsets(boundaries, 2, 4), (std::vector<int64_t>{0, 2, 3, 5, 6}));
  const int64_t expected_start[] = {0, 0, 3, 3};
  for (int64_t rank = 0; rank < 4; ++rank) {
    const SequenceDispatchRoute route = document_prefix_route(boundaries, 4, 4, rank, 2);
    EXPECT_EQ(route.global_start, expected_start[rank]) << rank;
  }
  const SequenceDispatchRoute rank3 = document_prefix_route(boundaries, 4, 4, 3, 2);
  EXPECT_EQ(rank3.local_start, 5);
  EXPECT_EQ(rank3.local_length, 1);
  EXPECT_EQ(rank3.receive_splits, (std::vector<int64_t>{0, 0, 2, 0}));
  EXPECT_EQ(document_prefix_route(boundaries, 4, 4, 0, 2).send_splits,
            (std::vector<int64_t>{0, 2, 0, 0}));
  // Ratio 1: the compressed bank is the raw sequence and the route runs back to the
  // document start.
  EXPECT_EQ(document_prefix_route(boundaries, 4, 4, 3, 1).global_start, 8);
}

TEST(DispatchRoutes, RejectInvalidInputsWithSeedTexts) {
  const std::vector<int64_t> good = {0, 3, 8};
  const auto expect_error = [](auto&& call, const std::string& text) {
    try {
      call();
      ADD_FAILURE() << "no error, expected: " << text;
    } catch (const Error& error) {
      EXPECT_EQ(std::string(error.what()), text);
    }
  };
  const std::string swa_dims = "SWA dispatch requires positive dimensions and a valid CP rank";
  const std::string swa_span = "SWA document boundaries must span the full contiguous CP sequence";
  expect_error([&] { sliding_window_route(good, 0, 2, 0, 4); }, swa_dims);
  expect_error([&] { sliding_window_route(good, 4, 0, 0, 4); }, swa_dims);
  expect_error([&] { sliding_window_route(good, 4, 2, 2, 4); }, swa_dims);
  expect_error([&] { sliding_window_route(good, 4, 2, -1, 4); }, swa_dims);
  expect_error([&] { sliding_window_route(good, 4, 2, 0, 0); }, swa_dims);
  expect_error([&] { sliding_window_route(good, 3, 2, 0, 4); }, swa_span);
  expect_error([&] { sliding_window_route(std::vector<int64_t>{}, 4, 2, 0, 4); }, swa_span);
  expect_error([&] { sliding_window_route(std::vector<int64_t>{8}, 4, 2, 0, 4); }, swa_span);
  expect_error([&] { sliding_window_route(std::vector<int64_t>{1, 8}, 4, 2, 0, 4); }, swa_span);
  expect_error(
      [&] {
        sliding_window_route(std::vector<int64_t>{0, 3, 3, 8}, 4, 2, 0, 4);
      },
      swa_span);
  expect_error(
      [&] {
        sliding_window_route(std::vector<int64_t>{0, 5, 3, 8}, 4, 2, 0, 4);
      },
      swa_span);
  // local * size overflows: cannot match any boundary.
  expect_error(
      [&] {
        sliding_window_route(std::vector<int64_t>{0, std::numeric_limits<int64_t>::max()},
                             std::numeric_limits<int64_t>::max() / 2 + 1, 2, 0, 4);
      },
      swa_span);

  const std::string main_dims =
      "Main KV dispatch requires a supported ratio and equal positive raw CP shards";
  const std::string main_span =
      "Main KV document boundaries must span the complete contiguous CP sequence";
  for (const int64_t ratio : {-1, 0, 3, 4, 128}) {
    expect_error([&] { document_prefix_route(good, 4, 2, 0, ratio); }, main_dims);
  }
  expect_error([&] { document_prefix_route(good, 0, 2, 0, 2); }, main_dims);
  expect_error([&] { document_prefix_route(good, 4, 2, 5, 2); }, main_dims);
  expect_error([&] { document_prefix_route(good, 5, 2, 0, 2); }, main_span);

  const std::string compression_dims =
      "Document compression requires a non-negative ratio, positive dimensions and a valid CP "
      "rank";
  expect_error([&] { document_compression_plan(good, -1, 4, 2, 0); }, compression_dims);
  expect_error([&] { document_compression_plan(good, 4, 4, 2, 2); }, compression_dims);
  expect_error([&] { document_compression_plan(good, 4, 3, 2, 0); },
               "Document compression boundaries must span the full contiguous CP sequence");

  EXPECT_THROW(compressed_document_offsets(good, 0), Error);
  EXPECT_THROW(compressed_document_offsets(std::vector<int64_t>{0}, 1), Error);
  EXPECT_THROW(compressed_owner_offsets(good, 2, 3), Error);
  EXPECT_THROW(compressed_owner_offsets(good, 2, 0), Error);
  EXPECT_THROW(document_boundaries(std::vector<int64_t>{3, 0}), Error);
  EXPECT_THROW(document_boundaries(std::vector<int64_t>{std::numeric_limits<int64_t>::max(), 1}),
               Error);
  // The generic builder names the bad value.
  EXPECT_THROW(
      dispatch_route_from_intervals(std::vector<int64_t>{0, 3}, std::vector<int64_t>{0, 2, 4}, 1),
      Error);
  EXPECT_THROW(
      dispatch_route_from_intervals(std::vector<int64_t>{0}, std::vector<int64_t>{0, 2}, 1), Error);
  EXPECT_THROW(dispatch_route_from_intervals(std::vector<int64_t>{}, std::vector<int64_t>{0}, 0),
               Error);
}

// ---------------------------------------------------------------------------
// Brute-force models on random sequences.

TEST(SlidingWindowRoute, MatchesBruteForceModel) {
  SplitMix64 random(test_seed() ^ 0x5A5A);
  for (int trial = 0; trial < 400; ++trial) {
    const RandomSequence sequence = random_sequence(random);
    const int64_t window = pick(random, 0, 9) == 0 ? std::numeric_limits<int64_t>::max()
                                                   : pick(random, 1, 2 * sequence.local + 5);
    SCOPED_TRACE(describe(sequence) + " window=" + std::to_string(window) +
                 " trial=" + std::to_string(trial));
    std::vector<SequenceDispatchRoute> routes;
    std::vector<std::pair<int64_t, int64_t>> needs;
    std::vector<int64_t> owners;
    for (int64_t q = 0; q < sequence.size; ++q) {
      routes.push_back(
          sliding_window_route(sequence.boundaries, sequence.local, sequence.size, q, window));
      // Query p sees raw keys [max(doc start, p - window + 1), p].
      int64_t start = std::numeric_limits<int64_t>::max();
      for (int64_t p = q * sequence.local; p < (q + 1) * sequence.local; ++p) {
        const int64_t first = p - std::min(window - 1, p);
        start = std::min(start, std::max(document_start(sequence.boundaries, p), first));
      }
      needs.emplace_back(start, (q + 1) * sequence.local);
      owners.push_back(q * sequence.local);
    }
    owners.push_back(sequence.size * sequence.local);
    check_routes(routes, needs, owners);
    if (::testing::Test::HasFailure()) return;
  }
}

// The compressed bank by brute force: every complete block of every document, with the
// raw token range it compresses and its owner (the rank holding its last token).
struct Block {
  int64_t document = 0;
  int64_t raw_start = 0;
  int64_t owner = 0;
};

std::vector<Block> brute_force_blocks(std::span<const int64_t> boundaries, int64_t ratio,
                                      int64_t local) {
  std::vector<Block> blocks;
  for (size_t d = 0; d + 1 < boundaries.size(); ++d) {
    for (int64_t start = boundaries[d]; start + ratio <= boundaries[d + 1]; start += ratio) {
      blocks.push_back({static_cast<int64_t>(d), start, (start + ratio - 1) / local});
    }
  }
  return blocks;
}

TEST(DocumentPrefixRoute, MatchesBruteForceModel) {
  SplitMix64 random(test_seed() ^ 0xA5A5);
  for (int trial = 0; trial < 400; ++trial) {
    const RandomSequence sequence = random_sequence(random);
    const int64_t ratio = pick(random, 1, 2);
    SCOPED_TRACE(describe(sequence) + " ratio=" + std::to_string(ratio) +
                 " trial=" + std::to_string(trial));
    const std::vector<Block> blocks =
        brute_force_blocks(sequence.boundaries, ratio, sequence.local);
    // Owners own consecutive blocks in rank order.
    std::vector<int64_t> owners(sequence.size + 1, 0);
    for (size_t k = 0; k < blocks.size(); ++k) {
      if (k > 0) {
        ASSERT_LE(blocks[k - 1].owner, blocks[k].owner);
      }
      for (int64_t r = blocks[k].owner + 1; r <= sequence.size; ++r) {
        owners[r] = static_cast<int64_t>(k) + 1;
      }
    }
    ASSERT_EQ(compressed_owner_offsets(sequence.boundaries, ratio, sequence.local), owners);
    const std::vector<int64_t> keys = compressed_document_offsets(sequence.boundaries, ratio);
    std::vector<SequenceDispatchRoute> routes;
    std::vector<std::pair<int64_t, int64_t>> needs;
    for (int64_t q = 0; q < sequence.size; ++q) {
      routes.push_back(
          document_prefix_route(sequence.boundaries, sequence.local, sequence.size, q, ratio));
      // Query p of document d at position j sees [keys[d], keys[d] + (j + 1) / ratio).
      int64_t start = std::numeric_limits<int64_t>::max();
      int64_t end = std::numeric_limits<int64_t>::min();
      for (int64_t p = q * sequence.local; p < (q + 1) * sequence.local; ++p) {
        const auto d = static_cast<size_t>(
            std::upper_bound(sequence.boundaries.begin(), sequence.boundaries.end(), p) -
            sequence.boundaries.begin() - 1);
        const int64_t seen = (p - sequence.boundaries[d] + 1) / ratio;
        if (seen == 0) continue;
        start = std::min(start, keys[d]);
        end = std::max(end, keys[d] + seen);
      }
      needs.emplace_back(start < end ? start : 0, start < end ? end : 0);
    }
    check_routes(routes, needs, owners);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(DocumentCompressionPlan, MatchesBruteForceModel) {
  SplitMix64 random(test_seed() ^ 0xC0C0);
  int64_t plans = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const RandomSequence sequence = random_sequence(random);
    const int64_t ratio =
        pick(random, 0, 3) == 0 ? pick(random, 0, 1) : pick(random, 2, 2 * sequence.local + 3);
    SCOPED_TRACE(describe(sequence) + " ratio=" + std::to_string(ratio) +
                 " trial=" + std::to_string(trial));
    const bool aligned =
        ratio <= 1 || (sequence.local % ratio == 0 &&
                       std::all_of(sequence.boundaries.begin(), sequence.boundaries.end(),
                                   [&](int64_t b) { return b % ratio == 0; }));
    const std::vector<Block> blocks =
        ratio >= 1 ? brute_force_blocks(sequence.boundaries, ratio, sequence.local)
                   : std::vector<Block>{};
    bool straddles = false;
    for (const Block& block : blocks)
      straddles = straddles || block.raw_start < block.owner * sequence.local;
    if (aligned) {
      EXPECT_FALSE(straddles);
    }
    EXPECT_EQ(compression_aligned(sequence.boundaries, ratio, sequence.local), aligned);
    std::vector<SequenceDispatchRoute> halos;
    std::vector<std::pair<int64_t, int64_t>> needs;
    std::vector<int64_t> raw_owners;
    for (int64_t q = 0; q < sequence.size; ++q) {
      const auto plan =
          document_compression_plan(sequence.boundaries, ratio, sequence.local, sequence.size, q);
      ASSERT_EQ(plan.has_value(), !aligned);
      if (!plan) continue;
      ++plans;
      EXPECT_EQ(plan->ratio, ratio);
      // The runs name exactly this rank's blocks, in order, with their raw rows inside
      // the gathered block.
      std::vector<std::pair<int64_t, int64_t>> planned;  // (key, raw start)
      for (const CompressedRun& run : plan->runs) {
        EXPECT_GT(run.count, 0);
        for (int64_t i = 0; i < run.count; ++i) {
          const int64_t raw = run.raw_begin + i * ratio;
          EXPECT_GE(raw, 0);
          EXPECT_LE(raw + ratio, plan->halo.block_rows());
          planned.emplace_back(run.key_begin + i, plan->halo.global_start + raw);
          EXPECT_EQ(blocks[static_cast<size_t>(run.key_begin + i)].document, run.document);
        }
      }
      std::vector<std::pair<int64_t, int64_t>> expected;
      int64_t first_raw = (q + 1) * sequence.local;
      for (size_t k = 0; k < blocks.size(); ++k) {
        if (blocks[k].owner != q) continue;
        expected.emplace_back(static_cast<int64_t>(k), blocks[k].raw_start);
        first_raw = std::min(first_raw, blocks[k].raw_start);
      }
      EXPECT_EQ(planned, expected);
      EXPECT_EQ(plan->key_end - plan->key_begin, static_cast<int64_t>(expected.size()));
      halos.push_back(plan->halo);
      needs.emplace_back(std::min(first_raw, q * sequence.local), (q + 1) * sequence.local);
      raw_owners.push_back(q * sequence.local);
    }
    if (aligned) continue;
    raw_owners.push_back(sequence.size * sequence.local);
    check_routes(halos, needs, raw_owners);
    EXPECT_EQ(halos[0].exchange_needed, straddles);
    if (::testing::Test::HasFailure()) return;
  }
  EXPECT_GT(plans, 50);  // the generator does exercise unaligned layouts
}

// ---------------------------------------------------------------------------
// The gathers, in process: one thread per rank over an in-memory Communicator whose
// collectives complete when the last rank arrives (like MPI's semantics, without MPI).

class ThreadGroup {
 public:
  explicit ThreadGroup(int64_t size) : size_(size) {}

  struct Post {
    int kind = 0;  // 0 all-to-all, 1 all-reduce, 2 counts
    const std::byte* send = nullptr;
    std::vector<int64_t> send_counts;
    std::byte* receive = nullptr;
    std::vector<int64_t> receive_counts;
    int64_t row_bytes = 0;
    std::vector<int64_t> values;
    ReduceOp op = ReduceOp::kSum;
  };

  // Contributes rank's part of collective `index`; the last arrival completes it.
  void post(int64_t index, int64_t rank, Post post) {
    std::lock_guard lock(mutex_);
    Op& op = ops_[index];
    if (op.posts.empty()) op.posts.resize(size_);
    op.posts[rank] = std::move(post);
    if (++op.arrived == size_) {
      complete(op);
      op.done = true;
      changed_.notify_all();
    }
  }
  bool done(int64_t index) {
    std::lock_guard lock(mutex_);
    return ops_[index].done;
  }
  // Blocks until collective `index` completed; returns rank's result values.
  std::vector<int64_t> wait(int64_t index, int64_t rank) {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return ops_[index].done; });
    Op& op = ops_[index];
    std::vector<int64_t> result = std::move(op.posts[rank].values);
    const std::string error = op.error;
    if (++op.released == size_) ops_.erase(index);
    if (!error.empty()) throw Error(error);
    return result;
  }

 private:
  struct Op {
    std::vector<Post> posts;
    int64_t arrived = 0;
    int64_t released = 0;
    bool done = false;
    std::string error;
  };

  void complete(Op& op) {
    for (const Post& post : op.posts) {
      if (post.kind != op.posts[0].kind) op.error = "ranks called different collectives";
    }
    if (!op.error.empty()) return;
    if (op.posts[0].kind == 0) {
      for (int64_t r = 0; r < size_; ++r) {
        int64_t out = 0;
        for (int64_t p = 0; p < size_; ++p) {
          const Post& from = op.posts[p];
          const int64_t count = from.send_counts[r];
          if (count != op.posts[r].receive_counts[p]) {
            op.error = "all-to-all counts disagree";
            return;
          }
          const int64_t in =
              std::accumulate(from.send_counts.begin(), from.send_counts.begin() + r, int64_t{0});
          if (count > 0) {
            std::memcpy(op.posts[r].receive + out * from.row_bytes, from.send + in * from.row_bytes,
                        static_cast<size_t>(count * from.row_bytes));
          }
          out += count;
        }
      }
    } else if (op.posts[0].kind == 1) {
      std::vector<int64_t> result = op.posts[0].values;
      for (int64_t p = 1; p < size_; ++p) {
        for (size_t i = 0; i < result.size(); ++i) {
          const int64_t v = op.posts[p].values[i];
          result[i] = op.posts[0].op == ReduceOp::kSum   ? result[i] + v
                      : op.posts[0].op == ReduceOp::kMax ? std::max(result[i], v)
                                                         : std::min(result[i], v);
        }
      }
      for (Post& post : op.posts) post.values = result;
    } else {
      std::vector<std::vector<int64_t>> result(size_, std::vector<int64_t>(size_));
      for (int64_t p = 0; p < size_; ++p) {
        for (int64_t r = 0; r < size_; ++r) result[r][p] = op.posts[p].values[r];
      }
      for (int64_t r = 0; r < size_; ++r) op.posts[r].values = result[r];
    }
  }

  int64_t size_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<int64_t, Op> ops_;
};

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<ThreadGroup> group, int64_t rank, int64_t size)
      : group_(std::move(group)), rank_(rank), size_(size) {}
  int64_t rank() const override { return rank_; }
  int64_t size() const override { return size_; }

  Work all_to_all_rows(std::span<const std::byte> send, std::span<const int64_t> send_counts,
                       std::span<std::byte> receive, std::span<const int64_t> receive_counts,
                       int64_t row_bytes) override {
    const auto total = [](std::span<const int64_t> counts) {
      return std::accumulate(counts.begin(), counts.end(), int64_t{0});
    };
    SPARSECP_CHECK(static_cast<int64_t>(send.size()) == total(send_counts) * row_bytes &&
                       static_cast<int64_t>(receive.size()) == total(receive_counts) * row_bytes,
                   "test communicator: buffer sizes do not match the counts");
    record_exchange((total(send_counts) - send_counts[rank_]) * row_bytes,
                    (total(receive_counts) - receive_counts[rank_]) * row_bytes);
    ThreadGroup::Post post;
    post.send = send.data();
    post.send_counts.assign(send_counts.begin(), send_counts.end());
    post.receive = receive.data();
    post.receive_counts.assign(receive_counts.begin(), receive_counts.end());
    post.row_bytes = row_bytes;
    const int64_t index = next_++;
    group_->post(index, rank_, std::move(post));
    return Work(std::make_unique<Pending>(group_, index, rank_));
  }
  void all_reduce(std::span<int64_t> values, ReduceOp op) override {
    ThreadGroup::Post post;
    post.kind = 1;
    post.values.assign(values.begin(), values.end());
    post.op = op;
    const int64_t index = next_++;
    group_->post(index, rank_, std::move(post));
    const std::vector<int64_t> result = group_->wait(index, rank_);
    std::copy(result.begin(), result.end(), values.begin());
  }
  std::vector<int64_t> all_to_all_counts(std::span<const int64_t> counts) override {
    ThreadGroup::Post post;
    post.kind = 2;
    post.values.assign(counts.begin(), counts.end());
    const int64_t index = next_++;
    group_->post(index, rank_, std::move(post));
    return group_->wait(index, rank_);
  }

 private:
  class Pending final : public Work::Pending {
   public:
    Pending(std::shared_ptr<ThreadGroup> group, int64_t index, int64_t rank)
        : group_(std::move(group)), index_(index), rank_(rank) {}
    void wait() override { group_->wait(index_, rank_); }
    bool test() override { return group_->done(index_); }

   private:
    std::shared_ptr<ThreadGroup> group_;
    int64_t index_;
    int64_t rank_;
  };

  std::shared_ptr<ThreadGroup> group_;
  int64_t rank_;
  int64_t size_;
  int64_t next_ = 0;
};

// Runs body(comm) on `size` threads; returns each rank's error text ("" when none).
template <typename Body>
std::vector<std::string> run_ranks(int64_t size, Body body) {
  auto group = std::make_shared<ThreadGroup>(size);
  std::vector<std::string> errors(size);
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      ThreadCommunicator comm(group, r, size);
      try {
        body(comm);
      } catch (const std::exception& error) {
        errors[r] = error.what();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  return errors;
}

// Self-verifying payload: value of global bank row g, column c.
double payload(int64_t g, int64_t c) { return static_cast<double>(g * 1000 + c) + 0.25; }
// A consumer's gradient of bank row g, column c: distinct per consumer, exact in binary.
double gradient(int64_t consumer, int64_t g, int64_t c) {
  return static_cast<double>((consumer + 1) * 7 + g * 3 + c) * 0.5;
}

void check_dispatch_in_process(const std::vector<SequenceDispatchRoute>& routes, int64_t width) {
  const auto size = static_cast<int64_t>(routes.size());
  std::vector<std::vector<double>> forward(size), backward(size);
  std::vector<CommStats> stats(size);
  const auto errors = run_ranks(size, [&](Communicator& comm) {
    const SequenceDispatchRoute& route = routes[comm.rank()];
    std::vector<double> local;
    for (int64_t i = 0; i < route.local_length; ++i) {
      for (int64_t c = 0; c < width; ++c) local.push_back(payload(route.local_start + i, c));
    }
    forward[comm.rank()] = sequence_dispatch<double>(local, width, route, comm);
    std::vector<double> grad;
    for (int64_t g = route.global_start; g < route.global_end; ++g) {
      for (int64_t c = 0; c < width; ++c) grad.push_back(gradient(comm.rank(), g, c));
    }
    backward[comm.rank()] = sequence_dispatch_backward<double>(grad, width, route, comm);
    stats[comm.rank()] = comm.stats();
  });
  for (int64_t q = 0; q < size; ++q) {
    ASSERT_EQ(errors[q], "") << "rank " << q;
    const SequenceDispatchRoute& route = routes[q];
    std::vector<double> expected;
    for (int64_t g = route.global_start; g < route.global_end; ++g) {
      for (int64_t c = 0; c < width; ++c) expected.push_back(payload(g, c));
    }
    EXPECT_EQ(forward[q], expected) << "rank " << q;
    // Brute-force gradient: every consumer whose block holds the row, ascending rank.
    std::vector<double> grad;
    for (int64_t g = route.local_start; g < route.global_end; ++g) {
      for (int64_t c = 0; c < width; ++c) {
        double sum = 0;
        bool first = true;
        for (int64_t consumer = 0; consumer < size; ++consumer) {
          if (routes[consumer].global_start <= g && g < routes[consumer].global_end) {
            sum = first ? gradient(consumer, g, c) : sum + gradient(consumer, g, c);
            first = false;
          }
        }
        grad.push_back(sum);
      }
    }
    EXPECT_EQ(backward[q], grad) << "rank " << q;
    // Forward and backward each moved exactly the halo rows, nothing else.
    const auto row_bytes = static_cast<int64_t>(width * sizeof(double));
    EXPECT_EQ(stats[q].bytes_received, (route.received_rows() + route.sent_rows()) * row_bytes);
    EXPECT_EQ(stats[q].bytes_sent, (route.received_rows() + route.sent_rows()) * row_bytes);
    EXPECT_EQ(stats[q].exchanges, route.exchange_needed ? 2 : 0);
  }
}

TEST(SequenceDispatch, InProcessForwardAndBackwardMatchBruteForce) {
  SplitMix64 random(test_seed() ^ 0x1234);
  for (int trial = 0; trial < 60; ++trial) {
    const RandomSequence sequence = random_sequence(random);
    const int64_t width = pick(random, 1, 3);
    const bool swa = pick(random, 0, 1) == 0;
    const int64_t parameter = swa ? pick(random, 1, 2 * sequence.local + 2) : pick(random, 1, 2);
    SCOPED_TRACE(describe(sequence) + (swa ? " window=" : " ratio=") + std::to_string(parameter) +
                 " width=" + std::to_string(width) + " trial=" + std::to_string(trial));
    std::vector<SequenceDispatchRoute> routes;
    for (int64_t q = 0; q < sequence.size; ++q) {
      routes.push_back(swa ? sliding_window_route(sequence.boundaries, sequence.local,
                                                  sequence.size, q, parameter)
                           : document_prefix_route(sequence.boundaries, sequence.local,
                                                   sequence.size, q, parameter));
    }
    check_dispatch_in_process(routes, width);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(AllGatherSequence, InProcessForwardAndSumBackwardMatchBruteForce) {
  SplitMix64 random(test_seed() ^ 0x4321);
  for (int trial = 0; trial < 40; ++trial) {
    const int64_t size = pick(random, 1, 6);
    const int64_t width = pick(random, 1, 4);
    // Equal shards, or a ragged layout (some shards empty), like a compressed bank.
    std::vector<int64_t> offsets(size + 1, 0);
    const bool ragged = pick(random, 0, 1) == 1;
    const int64_t local = pick(random, 0, 5);
    for (int64_t r = 0; r < size; ++r)
      offsets[r + 1] = offsets[r] + (ragged ? pick(random, 0, 5) : local);
    SCOPED_TRACE("size=" + std::to_string(size) + " width=" + std::to_string(width) +
                 " ragged=" + std::to_string(ragged) + " trial=" + std::to_string(trial));
    std::vector<std::vector<float>> forward(size), backward(size);
    const auto errors = run_ranks(size, [&](Communicator& comm) {
      const int64_t r = comm.rank();
      std::vector<float> shard;
      for (int64_t g = offsets[r]; g < offsets[r + 1]; ++g) {
        for (int64_t c = 0; c < width; ++c) shard.push_back(static_cast<float>(payload(g, c)));
      }
      forward[r] = all_gather_sequence<float>(shard, width, offsets, comm);
      std::vector<float> grad;
      for (int64_t g = 0; g < offsets[size]; ++g) {
        for (int64_t c = 0; c < width; ++c) grad.push_back(static_cast<float>(gradient(r, g, c)));
      }
      backward[r] = all_gather_sequence_backward<float>(grad, width, offsets, comm);
    });
    for (int64_t r = 0; r < size; ++r) {
      ASSERT_EQ(errors[r], "") << "rank " << r;
      std::vector<float> bank;
      for (int64_t g = 0; g < offsets[size]; ++g) {
        for (int64_t c = 0; c < width; ++c) bank.push_back(static_cast<float>(payload(g, c)));
      }
      EXPECT_EQ(forward[r], bank);
      std::vector<float> grad;
      for (int64_t g = offsets[r]; g < offsets[r + 1]; ++g) {
        for (int64_t c = 0; c < width; ++c) {
          float sum = static_cast<float>(gradient(0, g, c));
          for (int64_t p = 1; p < size; ++p) sum += static_cast<float>(gradient(p, g, c));
          grad.push_back(sum);
        }
      }
      EXPECT_EQ(backward[r], grad) << "rank " << r;
    }
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(SequenceGatherHandle, IsSingleUseAndDeferredLaunchStartsOnce) {
  const std::vector<int64_t> boundaries = {0, 12};
  const auto errors = run_ranks(3, [&](Communicator& comm) {
    const SequenceDispatchRoute route = sliding_window_route(boundaries, 4, 3, comm.rank(), 3);
    std::vector<float> local(8, static_cast<float>(comm.rank()));
    int launches = 0;
    DeferredGatherLaunch<float> deferred([&, local]() mutable {
      ++launches;
      return launch_sequence_dispatch<float>(local, 2, route, comm);
    });
    EXPECT_TRUE(deferred.holds_launcher());
    EXPECT_FALSE(deferred.started());
    SequenceGatherHandle<float>& handle = deferred.start();
    EXPECT_FALSE(deferred.holds_launcher());  // captured inputs released at launch
    EXPECT_EQ(&deferred.start(), &handle);    // the same handle, launched once
    EXPECT_EQ(handle.rows(), route.block_rows());
    const std::vector<float> block = deferred.wait();
    EXPECT_EQ(launches, 1);
    ASSERT_EQ(static_cast<int64_t>(block.size()), route.block_rows() * 2);
    if (comm.rank() > 0) {
      EXPECT_EQ(block.front(), static_cast<float>(comm.rank() - 1));
    }
    EXPECT_EQ(block.back(), static_cast<float>(comm.rank()));
    EXPECT_TRUE(handle.consumed());
    try {
      deferred.wait();
      ADD_FAILURE() << "second wait did not throw";
    } catch (const Error& error) {
      EXPECT_STREQ(error.what(), "Sequence gather handle cannot be consumed twice");
    }
    // A moved-from handle is spent; a default one holds nothing.
    SequenceGatherHandle<float> launched = launch_sequence_dispatch<float>(local, 2, route, comm);
    SequenceGatherHandle<float> moved = std::move(launched);
    EXPECT_THROW(launched.wait(), Error);
    EXPECT_EQ(moved.wait().size(), block.size());
    EXPECT_THROW(SequenceGatherHandle<float>().wait(), Error);
    // A handle dropped without wait completes its transfer first (no hang, no leak).
    {
      SequenceGatherHandle<float> dropped = launch_sequence_dispatch<float>(local, 2, route, comm);
    }
  });
  for (const std::string& error : errors) EXPECT_EQ(error, "");
}

TEST(SequenceDispatch, InputErrorOnOneRankRaisesOnEveryRank) {
  const std::vector<int64_t> boundaries = {0, 3, 12};
  const auto errors = run_ranks(3, [&](Communicator& comm) {
    const SequenceDispatchRoute route = sliding_window_route(boundaries, 4, 3, comm.rank(), 8);
    std::vector<double> local(comm.rank() == 1 ? 3 : 4, 1.0);  // rank 1 has the wrong extent
    sequence_dispatch<double>(local, 1, route, comm);
  });
  EXPECT_EQ(errors[1], "sequence dispatch owner length does not match the bank's physical layout");
  EXPECT_EQ(errors[0], "sequence gather input was rejected on another rank");
  EXPECT_EQ(errors[2], "sequence gather input was rejected on another rank");
  // Without an exchange no data moves, but the ranks still agree: every rank raises.
  const std::vector<int64_t> aligned = {0, 4, 8, 12};
  const auto alone = run_ranks(3, [&](Communicator& comm) {
    const SequenceDispatchRoute route = sliding_window_route(aligned, 4, 3, comm.rank(), 8);
    ASSERT_FALSE(route.exchange_needed);
    std::vector<double> local(comm.rank() == 2 ? 5 : 4, 1.0);
    EXPECT_EQ(sequence_dispatch<double>(local, 1, route, comm).size(), 4u);
  });
  EXPECT_EQ(alone[0], "sequence gather input was rejected on another rank");
  EXPECT_EQ(alone[2], "sequence dispatch owner length does not match the bank's physical layout");
  // A route for the wrong rank, a wrong width, a wrong gradient extent.
  const auto wrong = run_ranks(2, [&](Communicator& comm) {
    const SequenceDispatchRoute other =
        sliding_window_route(std::vector<int64_t>{0, 8}, 4, 2, 1 - comm.rank(), 8);
    std::vector<float> local(4, 1.0f);
    sequence_dispatch<float>(local, 1, other, comm);
  });
  EXPECT_NE(wrong[0].find("route was made for rank 1 of 2"), std::string::npos) << wrong[0];
  const auto widths = run_ranks(2, [&](Communicator& comm) {
    const SequenceDispatchRoute route =
        sliding_window_route(std::vector<int64_t>{0, 8}, 4, 2, comm.rank(), 8);
    std::vector<float> grad(static_cast<size_t>(route.block_rows()) + 1, 1.0f);
    sequence_dispatch_backward<float>(grad, 1, route, comm);
  });
  EXPECT_NE(widths[1].find("sequence dispatch gradient holds 9 values, expected 8 rows x 1"),
            std::string::npos)
      << widths[1];
  const auto gathers = run_ranks(2, [&](Communicator& comm) {
    std::vector<float> local(2, 1.0f);
    all_gather_sequence<float>(local, comm.rank() == 0 ? 2 : 0, equal_shard_offsets(1, 2), comm);
  });
  EXPECT_EQ(gathers[1], "all-gather row width must be positive, got 0");
  EXPECT_EQ(gathers[0], "sequence gather input was rejected on another rank");
}

TEST(SequenceLayout, MoveSequenceDimRoundTrips) {
  // A [2, 3, 2] tensor with the sequence on dim 1 (and -2).
  std::vector<int64_t> values(12);
  std::iota(values.begin(), values.end(), 0);
  const std::vector<int64_t> shape = {2, 3, 2};
  for (const int64_t dim : {1, -2}) {
    const std::vector<int64_t> rows = move_sequence_dim_to_front<int64_t>(values, shape, dim);
    EXPECT_EQ(rows, (std::vector<int64_t>{0, 1, 6, 7, 2, 3, 8, 9, 4, 5, 10, 11}));
    EXPECT_EQ(move_sequence_dim_from_front<int64_t>(rows, shape, dim), values);
  }
  // A gathered block of a different extent comes back with that extent.
  const std::vector<int64_t> block = {0, 1, 2, 3};  // 1 row of width 4
  EXPECT_EQ(move_sequence_dim_from_front<int64_t>(block, shape, 1),
            (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(move_sequence_dim_to_front<int64_t>(values, shape, 0), values);
  for (const int64_t dim : {3, -4}) {
    try {
      move_sequence_dim_to_front<int64_t>(values, shape, dim);
      ADD_FAILURE() << "dim " << dim << " accepted";
    } catch (const Error& error) {
      EXPECT_STREQ(error.what(),
                   "sequence dispatch dimension is outside the input tensor dimensions");
    }
  }
  EXPECT_THROW(move_sequence_dim_to_front<int64_t>(values, std::vector<int64_t>{5, 2}, 0), Error);
  EXPECT_THROW(move_sequence_dim_from_front<int64_t>(block, std::vector<int64_t>{3, 3}, 0), Error);
  EXPECT_TRUE(move_sequence_dim_to_front<int64_t>({}, std::vector<int64_t>{0, 4}, 1).empty());
}

// ---------------------------------------------------------------------------
// The `sparsecp dispatch` command as a user and a script see it.

using Outcome = testing::ToolRun;
using testing::run_tool;

TEST(DispatchCommand, ReportsIntervalsAndAllGatherRows) {
  const Outcome text =
      run_tool("dispatch --kind swa --lengths 5000,300,2699,1 --cp 4 --window 128");
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_NE(text.out.find("[1873, 4000)"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("381 rows in total"), std::string::npos) << text.out;

  const Outcome json = run_tool("dispatch --kind prefix --lengths 5,3,7,1 --cp 4 --ratio 2 --json");
  ASSERT_EQ(json.status, 0) << json.err;
  const auto out = nlohmann::json::parse(json.out);
  EXPECT_EQ(out["bank_rows"], 6);
  EXPECT_EQ(out["exchange_needed"], true);
  ASSERT_EQ(out["ranks"].size(), 4u);
  EXPECT_EQ(out["ranks"][3]["global_start"], 3);
  EXPECT_EQ(out["ranks"][3]["local_length"], 1);
  EXPECT_EQ(out["ranks"][3]["received_rows"], 2);
  EXPECT_EQ(out["ranks"][3]["all_gather_rows"], 5);
  EXPECT_EQ(out["received_rows_total"], 4);

  const Outcome one =
      run_tool("dispatch --kind prefix --lengths 5,3,7,1 --cp 4 --ratio 2 --rank 1 --json");
  ASSERT_EQ(one.status, 0) << one.err;
  EXPECT_EQ(nlohmann::json::parse(one.out)["ranks"].size(), 1u);

  const Outcome sweep = run_tool("dispatch --kind swa --tokens 4096 --cp 2,4 --batches 2 --json");
  ASSERT_EQ(sweep.status, 0) << sweep.err;
  const auto rows = nlohmann::json::parse(sweep.out)["sweep"];
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[1]["cp"], 4);
  EXPECT_LE(rows[1]["received_rows_max"].get<int64_t>(), 127);
}

TEST(DispatchCommand, RejectsBadInputWithExitStatusTwo) {
  for (const std::string arguments : {"dispatch --kind prefix --lengths 5,3,7,1 --cp 4 --window 3",
                                      "dispatch --kind swa --lengths 5,3,7,1 --cp 4 --ratio 2",
                                      "dispatch --kind ring --lengths 5,3,7,1 --cp 4",
                                      "dispatch --kind swa --lengths 5,3,7,1 --cp 3",
                                      "dispatch --kind swa --lengths 5,3,7,1 --cp 4 --rank 4",
                                      "dispatch --kind prefix --lengths 5,3,7,1 --cp 4 --ratio 4",
                                      "dispatch --kind swa --lengths 5,3,7,1 --cp 4 --window 0",
                                      "dispatch --kind swa --lengths 5,3,7,1 --cp 4,8 --rank 1",
                                      "dispatch --kind swa --lengths 5,3,7,1 --cp 4 --sweep 4"}) {
    const Outcome outcome = run_tool(arguments);
    EXPECT_EQ(outcome.status, 2) << arguments;
    EXPECT_EQ(outcome.err.rfind("error: ", 0), 0u) << arguments << ": " << outcome.err;
    EXPECT_TRUE(outcome.out.empty()) << arguments << ": " << outcome.out;
  }
}

}  // namespace
}  // namespace sparsecp
