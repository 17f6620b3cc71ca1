// The interleaved rotary embedding (sparsecp/kernels/rope.hpp) against its formula, written
// out per element; its layouts and its errors. Its equality with the model's own function,
// forward and backward, is tested from Python (python/tests/test_v4_rope.py).
#include "sparsecp/kernels/rope.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "sparsecp/error.hpp"

namespace sparsecp {
namespace {

constexpr unsigned kSeed = 20261206;

struct Case {
  int64_t batch, heads, rows, dim, rope_dim;
};

// out for x stored [batch, rows, heads, dim] (transposed = true) or [batch, heads, rows, dim].
std::vector<float> run(const Case& c, const std::vector<float>& x, const std::vector<float>& cos,
                       const std::vector<float>& sin, bool transposed, bool inverse, int threads) {
  std::vector<float> out(x.size(), std::nanf(""));
  InterleavedRopeArgs a;
  a.x = x.data();
  a.out = out.data();
  const int64_t strides_bhr[3] = {c.heads * c.rows * c.dim, c.rows * c.dim, c.dim};
  const int64_t strides_brh[3] = {c.rows * c.heads * c.dim, c.dim, c.heads * c.dim};
  for (int i = 0; i < 3; ++i)
    a.x_strides[i] = a.out_strides[i] = transposed ? strides_brh[i] : strides_bhr[i];
  a.cos = cos.data();
  a.sin = sin.data();
  a.table_strides[0] = c.rows * (c.rope_dim / 2);
  a.table_strides[1] = c.rope_dim / 2;
  a.batch = c.batch;
  a.heads = c.heads;
  a.rows = c.rows;
  a.dim = c.dim;
  a.rope_dim = c.rope_dim;
  a.inverse = inverse;
  a.threads = threads;
  interleaved_rope(a);
  return out;
}

TEST(InterleavedRope, MatchesItsFormulaInEveryLayoutAndThreadCount) {
  std::printf("rope_test seed %u\n", kSeed);
  std::mt19937 g(kSeed);
  std::normal_distribution<float> n(0.0f, 2.0f);
  for (const Case& c : {Case{1, 3, 5, 10, 6}, Case{2, 1, 7, 8, 8}, Case{1, 4, 1, 130, 64},
                        Case{2, 2, 3, 4, 0}, Case{1, 1, 1, 2, 2}}) {
    std::vector<float> x(static_cast<size_t>(c.batch * c.heads * c.rows * c.dim));
    std::vector<float> cos(static_cast<size_t>(c.batch * c.rows * c.rope_dim / 2));
    std::vector<float> sin(cos.size());
    for (float& v : x) v = n(g);
    for (float& v : cos) v = n(g);
    for (float& v : sin) v = n(g);
    x[0] = std::numeric_limits<float>::infinity();
    for (const bool inverse : {false, true}) {
      // The formula, element by element, on the [batch, heads, rows, dim] layout.
      std::vector<float> want(x.size());
      const int64_t nope = c.dim - c.rope_dim;
      for (int64_t b = 0; b < c.batch; ++b) {
        for (int64_t h = 0; h < c.heads; ++h) {
          for (int64_t r = 0; r < c.rows; ++r) {
            const size_t at = static_cast<size_t>(((b * c.heads + h) * c.rows + r) * c.dim);
            for (int64_t i = 0; i < nope; ++i) want[at + i] = x[at + i];
            for (int64_t i = 0; i < c.rope_dim / 2; ++i) {
              const size_t t = static_cast<size_t>((b * c.rows + r) * (c.rope_dim / 2) + i);
              const float e = x[at + nope + 2 * i], o = x[at + nope + 2 * i + 1];
              const volatile float ec = e * cos[t], os = o * sin[t], oc = o * cos[t],
                                   es = e * sin[t];
              want[at + nope + 2 * i] = inverse ? ec + os : ec - os;
              want[at + nope + 2 * i + 1] = inverse ? oc - es : oc + es;
            }
          }
        }
      }
      for (const int threads : {1, 3}) {
        const std::vector<float> got = run(c, x, cos, sin, false, inverse, threads);
        for (size_t i = 0; i < x.size(); ++i) {
          EXPECT_TRUE(got[i] == want[i] || (std::isnan(got[i]) && std::isnan(want[i])))
              << "element " << i << " inverse " << inverse << " dim " << c.dim;
        }
        // The same tensor stored [batch, rows, heads, dim]: the same values at the same (b, h, r).
        std::vector<float> xt(x.size());
        for (int64_t b = 0; b < c.batch; ++b) {
          for (int64_t h = 0; h < c.heads; ++h) {
            for (int64_t r = 0; r < c.rows; ++r) {
              for (int64_t d = 0; d < c.dim; ++d) {
                xt[static_cast<size_t>(((b * c.rows + r) * c.heads + h) * c.dim + d)] =
                    x[static_cast<size_t>(((b * c.heads + h) * c.rows + r) * c.dim + d)];
              }
            }
          }
        }
        const std::vector<float> gt = run(c, xt, cos, sin, true, inverse, threads);
        for (int64_t b = 0; b < c.batch; ++b) {
          for (int64_t h = 0; h < c.heads; ++h) {
            for (int64_t r = 0; r < c.rows; ++r) {
              for (int64_t d = 0; d < c.dim; ++d) {
                const float v =
                    gt[static_cast<size_t>(((b * c.rows + r) * c.heads + h) * c.dim + d)];
                const float w =
                    want[static_cast<size_t>(((b * c.heads + h) * c.rows + r) * c.dim + d)];
                EXPECT_TRUE(v == w || (std::isnan(v) && std::isnan(w)));
              }
            }
          }
        }
      }
    }
  }
}

TEST(InterleavedRope, ErrorsNameTheBadValue) {
  auto error_of = [](const InterleavedRopeArgs& a) {
    try {
      interleaved_rope(a);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  InterleavedRopeArgs a;
  a.batch = a.heads = a.rows = 1;
  a.dim = 4;
  a.rope_dim = 3;
  EXPECT_EQ(error_of(a), "interleaved rope rope_dim must be even and in [0, dim 4], got 3");
  a.rope_dim = 6;
  EXPECT_EQ(error_of(a), "interleaved rope rope_dim must be even and in [0, dim 4], got 6");
  a.rope_dim = 4;
  a.rows = -2;
  EXPECT_EQ(error_of(a),
            "interleaved rope extents must be non-negative, got batch 1, heads 1, rows -2, dim 4");
  a.rows = 1;
  EXPECT_EQ(error_of(a), "interleaved rope x or out is null");
  a.rows = 0;
  EXPECT_EQ(error_of(a), "");  // nothing to do: no pointer needed
  a.threads = kMaxRopeThreads + 1;
  EXPECT_EQ(error_of(a), "interleaved rope threads must be in [0, 4096], got 4097");
  a.threads = -1;
  EXPECT_EQ(error_of(a), "interleaved rope threads must be in [0, 4096], got -1");
}

}  // namespace
}  // namespace sparsecp
