// OpenBLAS inside sparsecp's kernels (kernels/blas_core.hpp): BlasSingleThreaded keeps each
// kernel worker's products on its own thread and leaves OpenBLAS's thread count as it found it.
#include "sparsecp/kernels/blas_core.hpp"

#include <cblas.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <optional>
#include <vector>

#include "sparsecp/kernels/sparse_attention.hpp"

namespace sparsecp {
namespace {

// Sets OpenBLAS's thread count for one test and puts the old one back.
class OpenBlasThreads {
 public:
  explicit OpenBlasThreads(int threads) : saved_(openblas_get_num_threads()) {
    openblas_set_num_threads(threads);
  }
  ~OpenBlasThreads() { openblas_set_num_threads(saved_); }
  OpenBlasThreads(const OpenBlasThreads&) = delete;
  OpenBlasThreads& operator=(const OpenBlasThreads&) = delete;

 private:
  int saved_;
};

// A pthread-threaded OpenBLAS (Debian's default) is held to one thread; an OpenMP-threaded or
// serial one is left alone (its calls stay on a parallel region's thread by themselves).
TEST(BlasSingleThreaded, OneThreadWhileAnyGuardLivesThenTheCountAsFound) {
  const OpenBlasThreads threads(3);
  const int before = openblas_get_num_threads();
  const int inside = openblas_get_parallel() == 1 ? 1 : before;
  std::printf("OpenBLAS parallel mode %d, %d threads\n", openblas_get_parallel(), before);
  {
    std::optional<BlasSingleThreaded> outer(std::in_place);
    EXPECT_EQ(openblas_get_num_threads(), inside);
    {
      const BlasSingleThreaded inner;
      EXPECT_EQ(openblas_get_num_threads(), inside);
    }
    EXPECT_EQ(openblas_get_num_threads(), inside);  // the outer guard still lives
    outer.reset();
    EXPECT_EQ(openblas_get_num_threads(), before);
  }
}

// An attention call on the BLAS products runs them on its workers and restores the count.
TEST(BlasSingleThreaded, AnAttentionCallOnTheBlasLeavesOpenBlasAsFound) {
  const OpenBlasThreads threads(2);
  const int64_t rows = 3, heads = 3, dim = 5, keys = 4, columns = 2;
  std::vector<float> q(rows * heads * dim, 0.5f), kv(keys * dim, 0.25f);
  std::vector<int32_t> ids = {0, 1, 2, -1, 3, 3};
  std::vector<float> out(rows * heads * dim), lse(rows * heads), grad_q(q.size()),
      grad_kv(kv.size());
  SparseAttentionInputs in;
  in.dtype = AttentionDType::kFloat32;
  in.rows = rows;
  in.heads = heads;
  in.qk_dim = in.value_dim = dim;
  in.keys = keys;
  in.columns = columns;
  in.q = q.data();
  in.kv = kv.data();
  in.indices = ids.data();
  in.scale = 0.5;
  SparseAttentionConfig config;
  config.gemm = AttentionGemm::kBlas;
  config.threads = 2;
  sparse_attention_forward(in, config, out.data(), lse.data());
  EXPECT_EQ(openblas_get_num_threads(), 2);
  sparse_attention_backward(in, config, out.data(), lse.data(), out.data(), grad_q.data(),
                            grad_kv.data(), nullptr);
  EXPECT_EQ(openblas_get_num_threads(), 2);
  EXPECT_NEAR(out[0], 0.25f, 1e-6f);  // every key equal: the mean of equal rows
}

}  // namespace
}  // namespace sparsecp
