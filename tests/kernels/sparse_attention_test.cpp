// The sparse attention kernel against its float64 reference: awkward shapes (empty, one,
// primes, every id -1, repeated ids, no key at all), the three dtypes, every ISA this CPU
// runs and both product libraries, forward and every gradient; the key gradient's
// determinism across thread counts and block sizes; NaN staying in its row; the errors.
#include "sparsecp/kernels/sparse_attention.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "sparsecp/error.hpp"
#include "sparsecp/kernels/bf16.hpp"

namespace sparsecp {
namespace {

struct Shape {
  int64_t rows, heads, qk_dim, value_dim, keys, columns;
  bool sinks;
};

// Inputs in float64; each dtype's run stores them rounded to its type (bf16 values are
// exactly representable in float32 and float64, so the reference sees what the kernel sees).
struct Case {
  Shape shape;
  std::vector<double> q, kv, sinks, grad_out;
  std::vector<int32_t> indices;
  double scale = 0.0;
};

uint32_t test_seed() {
  static const uint32_t seed = [] {
    const char* env = std::getenv("SPARSECP_TEST_SEED");
    const uint32_t value =
        env != nullptr ? static_cast<uint32_t>(std::strtoul(env, nullptr, 10)) : 20261130u;
    std::printf("sparse_attention_test seed %u (SPARSECP_TEST_SEED=%u reruns it)\n", value, value);
    return value;
  }();
  return seed;
}

double round_to(AttentionDType dtype, double v) {
  if (dtype == AttentionDType::kFloat32) return static_cast<float>(v);
  if (dtype == AttentionDType::kBFloat16) return round_to_bf16(static_cast<float>(v));
  return v;
}

Case random_case(const Shape& s, AttentionDType dtype, uint32_t salt) {
  std::mt19937 gen(test_seed() + salt);
  std::normal_distribution<double> normal(0.0, 1.0);
  Case c;
  c.shape = s;
  c.scale = 1.0 / std::sqrt(static_cast<double>(s.qk_dim));
  auto fill = [&](std::vector<double>& v, int64_t n, double spread) {
    v.resize(static_cast<std::size_t>(n));
    for (double& x : v) x = round_to(dtype, spread * normal(gen));
  };
  fill(c.q, s.rows * s.heads * s.qk_dim, 1.0);
  fill(c.kv, s.keys * s.qk_dim, 1.0);
  fill(c.grad_out, s.rows * s.heads * s.value_dim, 1.0);
  if (s.sinks) fill(c.sinks, s.heads, 1.0);
  std::uniform_int_distribution<int32_t> id(-1, static_cast<int32_t>(s.keys) - 1);
  c.indices.resize(static_cast<std::size_t>(s.rows * s.columns));
  for (auto& x : c.indices) x = s.keys == 0 ? -1 : id(gen);
  if (s.rows > 1 && s.columns > 0) {  // one row sees nothing; one lists a key twice
    for (int64_t j = 0; j < s.columns; ++j) c.indices[static_cast<std::size_t>(j)] = -1;
    if (s.columns > 1 && s.keys > 0) {
      c.indices[static_cast<std::size_t>(s.columns)] = 0;
      c.indices[static_cast<std::size_t>(s.columns + 1)] = 0;
    }
  }
  return c;
}

// The case's arrays stored as `dtype` (and sinks in the accumulation type).
struct Stored {
  std::vector<unsigned char> q, kv, grad_out, sinks;
};

std::vector<unsigned char> store(const std::vector<double>& v, AttentionDType dtype,
                                 bool accumulate = false) {
  const std::size_t n = v.size();
  std::vector<unsigned char> bytes;
  if (dtype == AttentionDType::kFloat64) {
    bytes.resize(n * 8);
    if (n > 0) std::memcpy(bytes.data(), v.data(), n * 8);
  } else if (dtype == AttentionDType::kFloat32 || accumulate) {
    bytes.resize(n * 4);
    for (std::size_t i = 0; i < n; ++i)
      reinterpret_cast<float*>(bytes.data())[i] = static_cast<float>(v[i]);
  } else {
    bytes.resize(n * 2);
    for (std::size_t i = 0; i < n; ++i) {
      reinterpret_cast<uint16_t*>(bytes.data())[i] = float_to_bf16(static_cast<float>(v[i]));
    }
  }
  return bytes;
}

std::vector<double> load(const void* data, AttentionDType dtype, int64_t n,
                         bool accumulate = false) {
  std::vector<double> v(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    if (dtype == AttentionDType::kFloat64) {
      v[static_cast<std::size_t>(i)] = static_cast<const double*>(data)[i];
    } else if (dtype == AttentionDType::kFloat32 || accumulate) {
      v[static_cast<std::size_t>(i)] = static_cast<const float*>(data)[i];
    } else {
      v[static_cast<std::size_t>(i)] = bf16_to_float(static_cast<const uint16_t*>(data)[i]);
    }
  }
  return v;
}

std::size_t bytes_of(AttentionDType dtype, bool accumulate) {
  if (dtype == AttentionDType::kFloat64) return 8;
  return accumulate || dtype == AttentionDType::kFloat32 ? 4 : 2;
}

SparseAttentionInputs inputs_of(const Case& c, const Stored& st, AttentionDType dtype) {
  SparseAttentionInputs in;
  in.dtype = dtype;
  in.rows = c.shape.rows;
  in.heads = c.shape.heads;
  in.qk_dim = c.shape.qk_dim;
  in.value_dim = c.shape.value_dim;
  in.keys = c.shape.keys;
  in.columns = c.shape.columns;
  in.q = st.q.data();
  in.kv = st.kv.data();
  in.indices = c.indices.data();
  in.sinks = c.shape.sinks ? st.sinks.data() : nullptr;
  in.scale = c.scale;
  return in;
}

struct Outputs {
  std::vector<double> out, lse, grad_q, grad_kv, grad_sinks;
};

Outputs run(const Case& c, AttentionDType dtype, const SparseAttentionConfig& config) {
  Stored st{store(c.q, dtype), store(c.kv, dtype), store(c.grad_out, dtype),
            store(c.sinks, dtype, true)};
  const SparseAttentionInputs in = inputs_of(c, st, dtype);
  const Shape& s = c.shape;
  std::vector<unsigned char> out(static_cast<std::size_t>(s.rows * s.heads * s.value_dim) *
                                 bytes_of(dtype, false));
  std::vector<unsigned char> lse(static_cast<std::size_t>(s.rows * s.heads) *
                                 bytes_of(dtype, true));
  sparse_attention_forward(in, config, out.data(), lse.data());
  std::vector<unsigned char> gq(static_cast<std::size_t>(s.rows * s.heads * s.qk_dim) *
                                bytes_of(dtype, false));
  std::vector<unsigned char> gkv(static_cast<std::size_t>(s.keys * s.qk_dim) *
                                 bytes_of(dtype, true));
  std::vector<unsigned char> gs(static_cast<std::size_t>(s.heads) * bytes_of(dtype, true));
  sparse_attention_backward(in, config, out.data(), lse.data(), st.grad_out.data(), gq.data(),
                            gkv.data(), gs.data());
  Outputs o;
  o.out = load(out.data(), dtype, s.rows * s.heads * s.value_dim);
  o.lse = load(lse.data(), dtype, s.rows * s.heads, true);
  o.grad_q = load(gq.data(), dtype, s.rows * s.heads * s.qk_dim);
  o.grad_kv = load(gkv.data(), dtype, s.keys * s.qk_dim, true);
  if (s.sinks) o.grad_sinks = load(gs.data(), dtype, s.heads, true);
  return o;
}

Outputs reference(const Case& c, AttentionDType dtype) {
  Stored st{store(c.q, dtype), store(c.kv, dtype), store(c.grad_out, dtype),
            store(c.sinks, dtype, true)};
  const SparseAttentionInputs in = inputs_of(c, st, dtype);
  const Shape& s = c.shape;
  Outputs o;
  o.out.resize(static_cast<std::size_t>(s.rows * s.heads * s.value_dim));
  o.lse.resize(static_cast<std::size_t>(s.rows * s.heads));
  o.grad_q.resize(static_cast<std::size_t>(s.rows * s.heads * s.qk_dim));
  o.grad_kv.resize(static_cast<std::size_t>(s.keys * s.qk_dim));
  if (s.sinks) o.grad_sinks.resize(static_cast<std::size_t>(s.heads));
  sparse_attention_reference(in, o.out.data(), o.lse.data());
  sparse_attention_reference_backward(in, st.grad_out.data(), o.grad_q.data(), o.grad_kv.data(),
                                      s.sinks ? o.grad_sinks.data() : nullptr);
  return o;
}

// ||a - b|| / max(||b||, tiny); -inf entries must match exactly.
double relative_error(const std::vector<double>& a, const std::vector<double>& b) {
  double diff = 0.0, norm = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isinf(b[i])) {
      if (a[i] != b[i]) return std::numeric_limits<double>::infinity();
      continue;
    }
    diff += (a[i] - b[i]) * (a[i] - b[i]);
    norm += b[i] * b[i];
  }
  return std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
}

// Observed against the float64 reference: float32 <= 1e-6, bf16 <= 8e-3 (the probabilities
// and the logit gradient enter the products as bf16), float64 <= 1e-14.
double tolerance(AttentionDType dtype) {
  if (dtype == AttentionDType::kFloat64) return 1e-12;
  if (dtype == AttentionDType::kFloat32) return 2e-5;
  return 3e-2;
}

std::vector<Shape> shapes() {
  return {
      {0, 1, 1, 1, 0, 0, false},
      {1, 1, 1, 1, 1, 1, false},
      {1, 2, 5, 5, 0, 3, true},
      {7, 3, 13, 5, 11, 4, false},
      {17, 4, 33, 33, 29, 7, true},
      {5, 64, 8, 8, 19, 3, true},
      {23, 2, 16, 12, 64, 31, true},
      {3, 1, 7, 7, 5, 0, true},
      // Fewer than 16 heads that divide 16: the softmax passes walk whole 16-lane groups of
      // columns, then a tail of columns (37 = 4 * 9 + 1 at 4 heads, 2 * 18 + 1 at 8).
      {9, 4, 64, 64, 50, 37, true},
      {6, 8, 16, 16, 40, 37, false},
      {4, 4, 8, 8, 20, 4, false},
      // The direct products' slices (1 head: 4 vectors of 16 a slice, then 1; 8 heads: 2,
      // then 1) and their tails past the last whole vector of qk_dim and value_dim.
      {5, 1, 130, 98, 40, 21, true},
      {4, 8, 48, 40, 30, 19, false},
  };
}

std::vector<KernelIsa> isas() {
  std::vector<KernelIsa> v;
  for (const KernelIsa isa : {KernelIsa::kPortable, KernelIsa::kAvx2, KernelIsa::kAvx512}) {
    if (kernel_isa_supported(isa)) v.push_back(isa);
  }
  return v;
}

// The products a call of this dtype and head count can take: each library, and the direct
// loops where they apply (float32 with 1, 2, 4 or 8 heads).
std::vector<AttentionGemm> gemms(AttentionDType dtype, int64_t heads) {
  std::vector<AttentionGemm> v{AttentionGemm::kBlas};
  if (sparse_attention_has_onednn(dtype)) v.push_back(AttentionGemm::kOneDnn);
  if (dtype == AttentionDType::kFloat32 && (heads == 1 || heads == 2 || heads == 4 || heads == 8)) {
    v.push_back(AttentionGemm::kDirect);
  }
  return v;
}

TEST(SparseAttention, MatchesTheReferenceOnEveryDtypeIsaAndLibrary) {
  uint32_t salt = 0;
  for (const Shape& s : shapes()) {
    for (const AttentionDType dtype :
         {AttentionDType::kFloat32, AttentionDType::kBFloat16, AttentionDType::kFloat64}) {
      const Case c = random_case(s, dtype, ++salt);
      const Outputs want = reference(c, dtype);
      for (const KernelIsa isa : isas()) {
        for (const AttentionGemm gemm : gemms(dtype, s.heads)) {
          SparseAttentionConfig config;
          config.isa = isa;
          config.gemm = gemm;
          config.scratch_bytes = 1 << 14;  // small blocks: several per call
          const Outputs got = run(c, dtype, config);
          const std::string where =
              std::string(attention_dtype_name(dtype)) + " " + kernel_isa_name(isa) + " " +
              sparse_attention_gemm_name(dtype, gemm, s.heads) + " rows " + std::to_string(s.rows) +
              " heads " + std::to_string(s.heads) + " columns " + std::to_string(s.columns);
          const double tol = tolerance(dtype);
          EXPECT_LE(relative_error(got.out, want.out), tol) << "out, " << where;
          EXPECT_LE(relative_error(got.lse, want.lse),
                    dtype == AttentionDType::kFloat64 ? 1e-12 : 1e-5)
              << "lse, " << where;
          EXPECT_LE(relative_error(got.grad_q, want.grad_q), tol) << "grad q, " << where;
          EXPECT_LE(relative_error(got.grad_kv, want.grad_kv), tol) << "grad kv, " << where;
          EXPECT_LE(relative_error(got.grad_sinks, want.grad_sinks), tol)
              << "grad sinks, " << where;
        }
      }
    }
  }
}

TEST(SparseAttention, RowsWithNoKeyGiveZerosAndMinusInfinity) {
  Case c = random_case({4, 3, 8, 8, 6, 5, true}, AttentionDType::kFloat32, 101);
  for (auto& id : c.indices) id = -1;
  const Outputs got = run(c, AttentionDType::kFloat32, {});
  for (const double v : got.out) EXPECT_EQ(v, 0.0);
  for (const double v : got.lse) EXPECT_EQ(v, -std::numeric_limits<double>::infinity());
  for (const double v : got.grad_q) EXPECT_EQ(v, 0.0);
  for (const double v : got.grad_kv) EXPECT_EQ(v, 0.0);
  for (const double v : got.grad_sinks) EXPECT_EQ(v, 0.0);
}

// A NaN key reaches the rows that list it and no other, on every ISA's softmax passes (with
// 4 heads the passes walk 16-lane groups of columns, with 64 heads by column).
TEST(SparseAttention, NaNInAListedKeyReachesOnlyTheRowsListingIt) {
  for (const int64_t heads : {4, 64}) {
    Case c = random_case({6, heads, 8, 8, 10, 5, true}, AttentionDType::kFloat32, 505);
    for (int64_t d = 0; d < 8; ++d) c.kv[static_cast<std::size_t>(3 * 8 + d)] = std::nan("");
    for (int64_t r = 0; r < 6; ++r) {
      for (int64_t k = 0; k < 5; ++k) {  // row 0 lists key 3 once; no other row lists it
        c.indices[static_cast<std::size_t>(r * 5 + k)] =
            r == 0 && k == 2 ? 3 : static_cast<int32_t>((r + k) % 3 == 0 ? -1 : 4 + (r + k) % 6);
      }
    }
    for (const KernelIsa isa : isas()) {
      SparseAttentionConfig config;
      config.isa = isa;
      const Outputs got = run(c, AttentionDType::kFloat32, config);
      SCOPED_TRACE(::testing::Message() << kernel_isa_name(isa) << " heads " << heads);
      for (int64_t r = 0; r < 6; ++r) {
        for (int64_t i = 0; i < heads * 8; ++i) {
          const double out = got.out[static_cast<std::size_t>(r * heads * 8 + i)];
          const double dq = got.grad_q[static_cast<std::size_t>(r * heads * 8 + i)];
          EXPECT_EQ(std::isnan(out), r == 0) << "out, row " << r;
          EXPECT_EQ(std::isnan(dq), r == 0) << "grad q, row " << r;
        }
        for (int64_t h = 0; h < heads; ++h) {
          EXPECT_EQ(std::isnan(got.lse[static_cast<std::size_t>(r * heads + h)]), r == 0);
        }
      }
    }
  }
}

TEST(SparseAttention, KeyGradientIsBitIdenticalAcrossThreadsAndBlocks) {
  for (const AttentionDType dtype : {AttentionDType::kFloat32, AttentionDType::kBFloat16}) {
    const Case c =
        random_case({37, 8, 24, 16, 13, 9, true}, dtype, 202);  // few keys, many listings
    SparseAttentionConfig base;
    base.threads = 1;
    const Outputs first = run(c, dtype, base);
    for (const int threads : {1, 2, 3, 5}) {
      for (const std::size_t scratch :
           {std::size_t{1}, std::size_t{1} << 16, std::size_t{64} << 20}) {
        SparseAttentionConfig config;
        config.threads = threads;
        config.scratch_bytes = scratch;
        const Outputs again = run(c, dtype, config);
        EXPECT_EQ(again.out, first.out) << "threads " << threads << " scratch " << scratch;
        EXPECT_EQ(again.grad_q, first.grad_q) << "threads " << threads << " scratch " << scratch;
        EXPECT_EQ(again.grad_kv, first.grad_kv) << "threads " << threads << " scratch " << scratch;
        EXPECT_EQ(again.grad_sinks, first.grad_sinks)
            << "threads " << threads << " scratch " << scratch;
      }
    }
  }
}

TEST(SparseAttention, NanStaysInItsRow) {
  for (const AttentionDType dtype :
       {AttentionDType::kFloat32, AttentionDType::kBFloat16, AttentionDType::kFloat64}) {
    const Shape s{6, 2, 8, 8, 40, 5, true};
    Case c = random_case(s, dtype, 303);
    for (int64_t r = 0; r < s.rows; ++r) {  // distinct keys per row: rows share no key
      for (int64_t j = 0; j < s.columns; ++j)
        c.indices[static_cast<std::size_t>(r * s.columns + j)] =
            static_cast<int32_t>(r * s.columns + j);
    }
    const Outputs clean = run(c, dtype, {});
    c.q[static_cast<std::size_t>(3 * s.heads * s.qk_dim + 1)] =
        std::numeric_limits<double>::quiet_NaN();
    c.kv[static_cast<std::size_t>(4 * s.columns * s.qk_dim)] =
        std::numeric_limits<double>::infinity();
    const Outputs dirty = run(c, dtype, {});
    for (int64_t r = 0; r < s.rows; ++r) {
      for (int64_t i = 0; i < s.heads * s.value_dim; ++i) {
        const auto at = static_cast<std::size_t>(r * s.heads * s.value_dim + i);
        if (r == 3 && i < s.value_dim) {
          EXPECT_TRUE(std::isnan(dirty.out[at])) << attention_dtype_name(dtype) << " row 3, " << i;
        } else if (r != 3 && r != 4) {
          EXPECT_EQ(dirty.out[at], clean.out[at]) << attention_dtype_name(dtype) << " row " << r;
        }
      }
    }
  }
}

std::string error_of(const SparseAttentionInputs& in, const SparseAttentionConfig& config = {}) {
  try {
    validate_sparse_attention(in, config);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(SparseAttention, ErrorsNameTheBadValue) {
  const Case c = random_case({2, 2, 4, 4, 3, 2, false}, AttentionDType::kFloat32, 404);
  Stored st{store(c.q, AttentionDType::kFloat32), store(c.kv, AttentionDType::kFloat32), {}, {}};
  SparseAttentionInputs in = inputs_of(c, st, AttentionDType::kFloat32);
  std::vector<int32_t> bad = c.indices;
  bad[3] = 3;
  in.indices = bad.data();
  EXPECT_EQ(error_of(in),
            "sparse attention index 3 at row 1, column 1 is out of range [-1, 3) (kv has 3 rows)");
  bad[3] = -2;
  EXPECT_NE(error_of(in).find("index -2 at row 1, column 1"), std::string::npos);
  in.indices = c.indices.data();
  in.value_dim = 5;
  EXPECT_EQ(error_of(in), "sparse attention value_dim must be in [1, qk_dim 4], got 5");
  in.value_dim = 4;
  in.scale = std::numeric_limits<double>::infinity();
  EXPECT_EQ(error_of(in), "sparse attention scale must be finite, got inf");
  in.scale = 1.0;
  in.heads = 0;
  EXPECT_EQ(error_of(in), "sparse attention heads must be positive, got 0");
  in.heads = 2;
  SparseAttentionConfig config;
  config.threads = -1;
  EXPECT_NE(error_of(in, config).find("threads must be in [0, 4096], got -1"), std::string::npos);
  config.threads = 0;
  config.gemm = AttentionGemm::kDirect;
  in.heads = 3;
  EXPECT_EQ(
      error_of(in, config),
      "sparse attention gemm 'direct' takes float32 with 1, 2, 4 or 8 heads, got float32 with "
      "3 heads");
}

// The choice of products and its name: direct for float32 with 1, 2, 4 or 8 heads (kAuto), a
// library otherwise or when one is named.
TEST(SparseAttention, NamesTheProductsACallTakes) {
  // kAuto takes the direct loops on avx512 and avx2, not on the portable ISA.
  const KernelIsa isa = resolve_kernel_isa(KernelIsa::kAuto);
  EXPECT_EQ(std::string(sparse_attention_gemm_name(AttentionDType::kFloat32, AttentionGemm::kAuto,
                                                   4)) == "direct",
            isa == KernelIsa::kAvx512 || isa == KernelIsa::kAvx2);
  EXPECT_STREQ(sparse_attention_gemm_name(AttentionDType::kFloat32, AttentionGemm::kDirect),
               "direct");
  EXPECT_STREQ(sparse_attention_gemm_name(AttentionDType::kFloat32, AttentionGemm::kBlas, 4),
               "blas");
  EXPECT_STRNE(sparse_attention_gemm_name(AttentionDType::kFloat32, AttentionGemm::kAuto, 3),
               "direct");
  EXPECT_STRNE(sparse_attention_gemm_name(AttentionDType::kBFloat16, AttentionGemm::kAuto, 4),
               "direct");
  EXPECT_STRNE(sparse_attention_gemm_name(AttentionDType::kFloat32, AttentionGemm::kAuto, 64),
               "direct");
  // The direct loops by name where a call could not take them: the call's error, not a name.
  EXPECT_THROW(sparse_attention_gemm_name(AttentionDType::kBFloat16, AttentionGemm::kDirect, 4),
               InvalidInputError);
  EXPECT_THROW(sparse_attention_gemm_name(AttentionDType::kFloat32, AttentionGemm::kDirect, 3),
               InvalidInputError);
  SparseAttentionInputs in;
  in.heads = 3;
  SparseAttentionConfig config;
  config.gemm = AttentionGemm::kDirect;
  EXPECT_THROW(sparse_attention_block_rows(in, config), InvalidInputError);
  // SPARSECP_ATTENTION_GEMM=direct: the loops wherever they apply, on any ISA.
  setenv("SPARSECP_ATTENTION_GEMM", "direct", 1);
  EXPECT_STREQ(sparse_attention_gemm_name(AttentionDType::kFloat32, AttentionGemm::kAuto, 4),
               "direct");
  EXPECT_STRNE(sparse_attention_gemm_name(AttentionDType::kFloat32, AttentionGemm::kAuto, 3),
               "direct");
  EXPECT_STRNE(sparse_attention_gemm_name(AttentionDType::kBFloat16, AttentionGemm::kAuto, 4),
               "direct");
  unsetenv("SPARSECP_ATTENTION_GEMM");
  // oneDNN by name: its name where it multiplies the dtype on this CPU, the call's error where
  // it has no such products (bf16 in oneDNN 2.6 without AVX-512).
  for (const AttentionDType dtype : {AttentionDType::kFloat32, AttentionDType::kBFloat16}) {
    if (sparse_attention_has_onednn(dtype)) {
      EXPECT_EQ(std::string(sparse_attention_gemm_name(dtype, AttentionGemm::kOneDnn))
                    .rfind("onednn ", 0),
                0u);
    } else {
      EXPECT_THROW(sparse_attention_gemm_name(dtype, AttentionGemm::kOneDnn), InvalidInputError);
    }
  }
  EXPECT_FALSE(sparse_attention_has_onednn(AttentionDType::kFloat64));
  EXPECT_STREQ(sparse_attention_gemm_name(AttentionDType::kFloat64, AttentionGemm::kOneDnn),
               "blas");
}

}  // namespace
}  // namespace sparsecp
