// Index-Q projection (BLAS + RoPE) vs its reference, tnd plans, and the worker
// convenience that chains projection and selection.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

// The worker's projection chunk size is private (src/kernels/select/): the test sizes
// its calls to cross chunk boundaries.
#include "../../src/kernels/select/select_internal.hpp"
#include "sparsecp/error.hpp"
#include "sparsecp/kernels/select.hpp"
#include "sparsecp/kernels/tnd_plan.hpp"
#include "support/select_test_support.hpp"

namespace sparsecp {
namespace {

using testing::random_matrix;

// wq_b [q_rank, width] transposed to [width, q_rank].
testing::Matrix transpose(const testing::Matrix& m) {
  testing::Matrix t{m.cols, m.rows, {}, {}};
  t.f32.resize(m.f32.size());
  t.b16.resize(m.b16.size());
  for (int64_t r = 0; r < m.rows; ++r) {
    for (int64_t c = 0; c < m.cols; ++c) {
      t.f32[static_cast<size_t>(c * m.rows + r)] = m.f32[static_cast<size_t>(r * m.cols + c)];
      t.b16[static_cast<size_t>(c * m.rows + r)] = m.b16[static_cast<size_t>(r * m.cols + c)];
    }
  }
  return t;
}

TEST(SelectProjection, MatchesReferenceExactlyOnSmallIntegers) {
  const uint64_t seed = testing::test_seed() + 21;
  SplitMix64 random(seed);
  struct Shape {
    int64_t rows, rank, heads, head_dim, rope_dim;
  };
  for (const Shape& s : {Shape{1, 1, 1, 16, 16}, Shape{7, 13, 3, 16, 8}, Shape{5, 64, 4, 128, 64},
                         Shape{3, 5, 2, 6, 0}, Shape{0, 4, 2, 8, 4}}) {
    SelectConfig config;
    config.heads = s.heads;
    config.head_dim = s.head_dim;
    config.rope_dim = s.rope_dim;
    const int64_t width = s.heads * s.head_dim;
    const auto qr = random_matrix(random, s.rows, s.rank, 2);
    const auto wq = random_matrix(random, s.rank, width, 1);
    const auto wq_t = transpose(wq);
    const auto cos = random_matrix(random, s.rows, s.rope_dim / 2, 1);
    const auto sin = random_matrix(random, s.rows, s.rope_dim / 2, 1);
    for (const DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      SCOPED_TRACE(::testing::Message()
                   << "seed " << seed << " rows " << s.rows << " rank " << s.rank << " heads "
                   << s.heads << " dtype " << dtype_name(dtype));
      std::vector<float> expected(static_cast<size_t>(s.rows * width), -7.0f);
      project_index_query_reference(qr.view(dtype), wq.view(dtype), cos.view(DType::kFloat32),
                                    sin.view(DType::kFloat32), config, expected);
      std::vector<float> got(expected.size(), 9.0f), got_t(expected.size(), 9.0f);
      project_index_query(qr.view(dtype), wq.view(dtype), cos.view(DType::kFloat32),
                          sin.view(DType::kFloat32), config, got);
      project_index_query(qr.view(dtype), wq_t.view(dtype), cos.view(DType::kBFloat16),
                          sin.view(DType::kBFloat16), config, got_t, WeightLayout::kOutIn);
      EXPECT_EQ(got, expected);
      EXPECT_EQ(got_t, expected);
    }
  }
}

// Prepared weights (converted once) give the same bits as the per-call overloads, on real
// values too, and keep working for many calls.
TEST(SelectProjection, PreparedWeightsMatchPerCallConversion) {
  const uint64_t seed = testing::test_seed() + 29;
  SplitMix64 random(seed);
  SelectConfig config;
  config.heads = 3;
  config.head_dim = 10;
  config.rope_dim = 4;
  const int64_t width = config.heads * config.head_dim;
  const auto wq = random_matrix(random, 11, width, 50);
  const auto wq_t = transpose(wq);
  for (const DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    const ProjectionWeights prepared(wq.view(dtype));
    const ProjectionWeights prepared_t(wq_t.view(dtype), WeightLayout::kOutIn);
    EXPECT_EQ(prepared.view().data, wq.view(dtype).data);
    for (const int64_t rows : {1, 7, 0}) {
      SCOPED_TRACE(::testing::Message()
                   << "seed " << seed << " rows " << rows << " dtype " << dtype_name(dtype));
      const auto qr = random_matrix(random, rows, 11, 50);
      const auto cos = random_matrix(random, rows, 2, 50);
      const auto sin = random_matrix(random, rows, 2, 50);
      std::vector<float> expected(static_cast<size_t>(rows * width));
      std::vector<float> got(expected.size(), 3.0f), got_t(expected.size(), 4.0f);
      project_index_query(qr.view(dtype), wq.view(dtype), cos.view(DType::kFloat32),
                          sin.view(DType::kFloat32), config, expected);
      project_index_query(qr.view(dtype), prepared, cos.view(DType::kFloat32),
                          sin.view(DType::kFloat32), config, got);
      project_index_query(qr.view(dtype), prepared_t, cos.view(DType::kFloat32),
                          sin.view(DType::kFloat32), config, got_t);
      EXPECT_EQ(got, expected);
      EXPECT_EQ(got_t, expected);
    }
  }
  // Mismatched dtypes are still caught through the prepared weights.
  const auto qr = random_matrix(random, 2, 11, 50);
  std::vector<float> out(static_cast<size_t>(2 * width));
  const auto rope = random_matrix(random, 2, 2, 50);
  EXPECT_THROW(
      project_index_query(qr.view(DType::kFloat32), ProjectionWeights(wq.view(DType::kBFloat16)),
                          rope.view(DType::kFloat32), rope.view(DType::kFloat32), config, out),
      Error);
}

TEST(SelectProjection, RopeRotatesTrailingInterleavedPairs) {
  // One head of 6 channels, rope_dim 4: channels 0,1 pass; pairs (2,3) and (4,5) rotate.
  SelectConfig config;
  config.heads = 1;
  config.head_dim = 6;
  config.rope_dim = 4;
  const float qr[1] = {1.0f};
  const float wq[6] = {1, 2, 3, 4, 5, 6};
  const float cos[2] = {0.5f, 0.0f};
  const float sin[2] = {0.25f, 1.0f};
  std::vector<float> q(6);
  project_index_query(MatrixView::f32(qr, 1, 1), MatrixView::f32(wq, 1, 6),
                      MatrixView::f32(cos, 1, 2), MatrixView::f32(sin, 1, 2), config, q);
  const std::vector<float> expected{1, 2, 3 * 0.5f - 4 * 0.25f, 4 * 0.5f + 3 * 0.25f, -6, 5};
  EXPECT_EQ(q, expected);
}

TEST(SelectProjection, RealValuedCloseToReference) {
  const uint64_t seed = testing::test_seed() + 22;
  SplitMix64 random(seed);
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  SelectConfig config;
  config.heads = 4;
  config.head_dim = 32;
  config.rope_dim = 16;
  const auto qr = random_matrix(random, 9, 48, 0, false);
  const auto wq = random_matrix(random, 48, 128, 0, false);
  const auto cos = random_matrix(random, 9, 8, 0, false);
  const auto sin = random_matrix(random, 9, 8, 0, false);
  std::vector<float> expected(9 * 128), got(9 * 128);
  project_index_query_reference(qr.view(DType::kFloat32), wq.view(DType::kFloat32),
                                cos.view(DType::kFloat32), sin.view(DType::kFloat32), config,
                                expected);
  project_index_query(qr.view(DType::kFloat32), wq.view(DType::kFloat32), cos.view(DType::kFloat32),
                      sin.view(DType::kFloat32), config, got);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], expected[i], 1e-4) << i;
}

TEST(SelectProjection, ErrorsUseTheSeedText) {
  SelectConfig config;
  config.heads = 2;
  config.head_dim = 4;
  config.rope_dim = 2;
  std::vector<float> qr(3 * 2), wq(2 * 7), cs(3), out(3 * 7);
  try {
    project_index_query(MatrixView::f32(qr.data(), 3, 2), MatrixView::f32(wq.data(), 2, 7),
                        MatrixView::f32(cs.data(), 3, 1), MatrixView::f32(cs.data(), 3, 1), config,
                        out);
    ADD_FAILURE() << "accepted width 7";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "Indexer query width 7 is not divisible by head_dim 4");
  }
  std::vector<float> wq8(2 * 8), out8(3 * 8);
  EXPECT_NO_THROW(project_index_query(
      MatrixView::f32(qr.data(), 3, 2), MatrixView::f32(wq8.data(), 2, 8),
      MatrixView::f32(cs.data(), 3, 1), MatrixView::f32(cs.data(), 3, 1), config, out8));
  config.heads = 3;  // 8 / 4 = 2 heads, not 3
  EXPECT_THROW(
      project_index_query(MatrixView::f32(qr.data(), 3, 2), MatrixView::f32(wq8.data(), 2, 8),
                          MatrixView::f32(cs.data(), 3, 1), MatrixView::f32(cs.data(), 3, 1),
                          config, out8),
      Error);
  config.heads = 2;
  config.rope_dim = 3;
  EXPECT_THROW(
      project_index_query(MatrixView::f32(qr.data(), 3, 2), MatrixView::f32(wq8.data(), 2, 8),
                          MatrixView::f32(cs.data(), 3, 1), MatrixView::f32(cs.data(), 3, 1),
                          config, out8),
      Error);
  config.rope_dim = 2;
  std::vector<uint16_t> wq16(2 * 8);
  EXPECT_THROW(
      project_index_query(MatrixView::f32(qr.data(), 3, 2), MatrixView::bf16(wq16.data(), 2, 8),
                          MatrixView::f32(cs.data(), 3, 1), MatrixView::f32(cs.data(), 3, 1),
                          config, out8),
      Error);  // mixed dtypes
}

TEST(SelectWorker, ProjectsThenSelectsLikeTheReference) {
  const uint64_t seed = testing::test_seed() + 23;
  SplitMix64 random(seed);
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  SelectConfig config;
  config.heads = 3;
  config.head_dim = 16;
  config.rope_dim = 8;
  config.topk = 6;
  config.ratio = 4;
  const auto worker = testing::random_worker(random, 4, 5, 200, 12, true);
  const auto qr = random_matrix(random, worker.rows, 5, 1);
  const auto wq = random_matrix(random, 5, 48, 1);
  const auto cos = random_matrix(random, worker.rows, 4, 1);
  const auto sin = random_matrix(random, worker.rows, 4, 1);
  const auto weights = random_matrix(random, worker.rows, 3, 2);
  const auto keys = random_matrix(random, worker.bank, 16, 2);
  for (const DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    std::vector<int32_t> expected(static_cast<size_t>(worker.rows * 6)), got(expected.size());
    select_worker_rows_reference(qr.view(dtype), weights.view(DType::kFloat32),
                                 cos.view(DType::kFloat32), sin.view(DType::kFloat32),
                                 wq.view(dtype), keys.view(dtype), worker.segments, config,
                                 expected);
    select_worker_rows(qr.view(dtype), weights.view(DType::kBFloat16), cos.view(DType::kFloat32),
                       sin.view(DType::kFloat32), wq.view(dtype), keys.view(dtype), worker.segments,
                       config, got);
    EXPECT_EQ(got, expected) << dtype_name(dtype);
  }
}

// select_worker_rows projects and selects a chunk of rows at a time: calls of several
// chunks, whose documents straddle chunk boundaries (and rows no segment covers), give the
// reference's ids, on one thread and on three (a larger chunk).
TEST(SelectWorker, ChunksOfRowsGiveTheReferenceIds) {
  const uint64_t seed = testing::test_seed() + 29;
  SplitMix64 random(seed);
  SelectConfig config;
  config.heads = 64;
  config.head_dim = 256;  // 64 KiB of fp32 q a row: chunks of a few hundred rows
  config.rope_dim = 16;
  config.topk = 5;
  config.ratio = 4;
  for (const int threads : {1, 3}) {
    config.threads = threads;
    const int64_t chunk = select_detail::projection_chunk_rows(config, threads);
    const auto straddles = [chunk](const testing::WorkerCase& w) {
      return std::any_of(w.segments.begin(), w.segments.end(), [chunk](const Segment& s) {
        return s.q_end - s.q_begin > 4 && s.q_begin / chunk != (s.q_end - 1) / chunk;
      });
    };
    auto worker = testing::random_worker(random, 4, 9, 240, chunk / 2, true);
    for (int tries = 0; tries < 100 && !straddles(worker); ++tries) {
      worker = testing::random_worker(random, 4, 9, 240, chunk / 2, true);
    }
    ASSERT_TRUE(straddles(worker)) << "no random worker had a document across a chunk boundary";
    ASSERT_LT(chunk, 1024);
    auto qr = random_matrix(random, worker.rows, 3, 1);
    // A NaN and an infinity in the residuals of two rows of a document that crosses a chunk
    // boundary (their scores go NaN / infinite).
    const Segment across =
        *std::find_if(worker.segments.begin(), worker.segments.end(), [chunk](const Segment& s) {
          return s.q_end - s.q_begin > 4 && s.q_begin / chunk != (s.q_end - 1) / chunk;
        });
    for (const auto& [row, bits] :
         {std::pair<int64_t, uint16_t>{(across.q_begin + across.q_end) / 2, 0x7fc0},
          std::pair<int64_t, uint16_t>{across.q_end - 1, 0x7f80}}) {
      qr.b16[static_cast<size_t>(row * 3 + 1)] = bits;
      qr.f32[static_cast<size_t>(row * 3 + 1)] = std::bit_cast<float>(uint32_t{bits} << 16);
    }
    const auto wq = random_matrix(random, 3, config.heads * config.head_dim, 1);
    const auto cos = random_matrix(random, worker.rows, 8, 1);
    const auto sin = random_matrix(random, worker.rows, 8, 1);
    const auto weights = random_matrix(random, worker.rows, config.heads, 2);
    const auto keys = random_matrix(random, worker.bank, config.head_dim, 2);
    for (const DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      std::vector<int32_t> expected(static_cast<size_t>(worker.rows * config.topk));
      select_worker_rows_reference(qr.view(dtype), weights.view(DType::kFloat32),
                                   cos.view(DType::kFloat32), sin.view(DType::kFloat32),
                                   wq.view(dtype), keys.view(dtype), worker.segments, config,
                                   expected);
      for (const KernelIsa isa : {KernelIsa::kPortable, KernelIsa::kAvx2, KernelIsa::kAvx512}) {
        if (!kernel_isa_supported(isa)) continue;
        config.isa = isa;
        SCOPED_TRACE(::testing::Message()
                     << "seed " << seed << " threads " << threads << " chunk " << chunk << " rows "
                     << worker.rows << " isa " << kernel_isa_name(isa) << " " << dtype_name(dtype));
        std::vector<int32_t> got(expected.size(), 7);
        select_worker_rows(qr.view(dtype), weights.view(DType::kFloat32), cos.view(DType::kFloat32),
                           sin.view(DType::kFloat32), wq.view(dtype), keys.view(dtype),
                           worker.segments, config, got);
        EXPECT_EQ(got, expected);
      }
      config.isa = KernelIsa::kAuto;
    }
  }
}

TEST(TndPlan, KeepsRowsThatSeeAKeyAndRestoresThem) {
  // Segment 0: document end 10 (2 keys + residual 2), rows at positions 5..9.
  // Segment 1: rows at positions 0..2 of a document, ratio 4: nobody sees a key.
  // Segment 2: document end 6, rows at positions 1..5: positions 3..5 see a key.
  const std::vector<Segment> segments{{0, 5, 0, 2, 2}, {5, 8, 2, 2, 3}, {8, 13, 2, 3, 2}};
  const auto plan = csa_tnd_plan(segments, 4);
  ASSERT_TRUE(plan.has_value());
  EXPECT_EQ(plan->packed_rows(), 8);
  EXPECT_EQ(plan->sequences().size(), 2u);
  EXPECT_EQ(plan->sequences()[1], (TndSequence{10, 13, 5, 3, 2, 3}));
  EXPECT_EQ(plan->query_offsets(), (std::vector<int64_t>{0, 5, 8}));
  EXPECT_EQ(plan->key_offsets(), (std::vector<int64_t>{0, 2, 3}));
  EXPECT_EQ(plan->packed_row_ids(), (std::vector<int64_t>{0, 1, 2, 3, 4, 10, 11, 12}));
  EXPECT_FALSE(plan->covers_queries(13));
  std::vector<int32_t> packed{0, 1, 2, 3, 4, 5, 6, 7}, result(13, -1);
  plan->restore(packed, result, 1);
  EXPECT_EQ(result, (std::vector<int32_t>{0, 1, 2, 3, 4, -1, -1, -1, -1, -1, 5, 6, 7}));
  EXPECT_THROW(plan->restore(packed, result, 2), Error);

  const std::vector<Segment> all{{0, 4, 0, 2, 0}};  // positions 4..7 all see keys
  EXPECT_TRUE(csa_tnd_plan(all, 4)->covers_queries(4));
  EXPECT_FALSE(csa_tnd_plan(all, 4)->covers_queries(5));
  const std::vector<Segment> none{{0, 3, 0, 0, 3}};
  EXPECT_FALSE(csa_tnd_plan(none, 4).has_value());
  EXPECT_FALSE(csa_tnd_plan({}, 4).has_value());
  const std::vector<Segment> bad{{0, 3, 0, 0, 4}};
  EXPECT_THROW(csa_tnd_plan(bad, 4), Error);
  EXPECT_THROW(csa_tnd_plan(all, 0), Error);
}

}  // namespace
}  // namespace sparsecp
