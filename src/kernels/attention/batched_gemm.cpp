// Batched products for the attention kernel (batched_gemm.hpp): oneDNN's matmul primitive,
// cached per shape, or the BLAS one batch entry at a time.
#include "batched_gemm.hpp"

#include <cblas.h>

#include <array>
#include <climits>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "sparsecp/error.hpp"

#ifdef SPARSECP_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace sparsecp::attention_detail {

namespace {

void check_blas_sizes(const BatchedGemm& g) {
  SPARSECP_CHECK(g.m <= INT_MAX && g.n <= INT_MAX && g.k <= INT_MAX && g.a.ld <= INT_MAX &&
                     g.b.ld <= INT_MAX && g.ldc <= INT_MAX,
                 "sparse attention product [", g.m, ", ", g.k, "] x [", g.k, ", ", g.n,
                 "] exceeds the BLAS's int sizes");
}

void run_blas(const BatchedGemm& g) {
  check_blas_sizes(g);
  const auto ta = g.a.transposed ? CblasTrans : CblasNoTrans;
  const auto tb = g.b.transposed ? CblasTrans : CblasNoTrans;
  const int m = static_cast<int>(g.m), n = static_cast<int>(g.n), k = static_cast<int>(g.k);
  const int lda = static_cast<int>(g.a.ld), ldb = static_cast<int>(g.b.ld),
            ldc = static_cast<int>(g.ldc);
  for (int64_t i = 0; i < g.batch; ++i) {
    if (g.in == Element::kFloat64) {
      cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, 1.0,
                  static_cast<const double*>(g.a.data) + i * g.a.batch_stride, lda,
                  static_cast<const double*>(g.b.data) + i * g.b.batch_stride, ldb,
                  g.accumulate ? 1.0 : 0.0, static_cast<double*>(g.c) + i * g.c_batch_stride, ldc);
    } else {
      SPARSECP_CHECK(g.in == Element::kFloat32,
                     "internal: bf16 products need oneDNN (the BLAS path widens)");
      cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, 1.0f,
                  static_cast<const float*>(g.a.data) + i * g.a.batch_stride, lda,
                  static_cast<const float*>(g.b.data) + i * g.b.batch_stride, ldb,
                  g.accumulate ? 1.0f : 0.0f, static_cast<float*>(g.c) + i * g.c_batch_stride, ldc);
    }
  }
}

#ifdef SPARSECP_HAVE_ONEDNN
using Key = std::array<int64_t, 14>;

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// A batch stride of 0 (one batch entry) is given as the dense stride: oneDNN reads a zero
// stride as a broadcast layout and falls back to its reference implementation (ref:any,
// about 1,000 times slower).
int64_t dense_stride(int64_t stride, int64_t rows, int64_t ld) {
  return stride != 0 ? stride : rows * ld;
}

dnnl::memory::desc operand_desc(const Operand& o, int64_t batch, int64_t rows, int64_t cols,
                                dnnl::memory::data_type type) {
  const int64_t stored_rows = o.transposed ? cols : rows;
  const int64_t bs = dense_stride(o.batch_stride, stored_rows, o.ld);
  const dnnl::memory::dims strides =
      o.transposed ? dnnl::memory::dims{bs, 1, o.ld} : dnnl::memory::dims{bs, o.ld, 1};
  return dnnl::memory::desc({batch, rows, cols}, type, strides);
}

dnnl::memory::desc result_desc(const BatchedGemm& g) {
  return dnnl::memory::desc(
      {g.batch, g.m, g.n}, dnnl::memory::data_type::f32,
      dnnl::memory::dims{dense_stride(g.c_batch_stride, g.m, g.ldc), g.ldc, 1});
}

struct Primitive {
  dnnl::matmul matmul;
  dnnl::memory::desc scratchpad;
};

// Primitives are created once per shape and kept for the process (a handful per model
// shape). Each is executed by several threads at once, each with its own scratchpad
// (scratchpad_mode::user): a library-owned scratchpad belongs to the primitive and would
// be shared by the threads executing it.
const Primitive& primitive(const BatchedGemm& g) {
  static std::mutex mutex;
  static std::map<Key, Primitive> cache;
  const Key key{static_cast<int64_t>(g.in),
                g.batch,
                g.m,
                g.n,
                g.k,
                g.a.batch_stride,
                g.a.ld,
                g.a.transposed,
                g.b.batch_stride,
                g.b.ld,
                g.b.transposed,
                g.c_batch_stride,
                g.ldc,
                g.accumulate};
  const std::lock_guard<std::mutex> lock(mutex);
  auto found = cache.find(key);
  if (found != cache.end()) return found->second;
  using dt = dnnl::memory::data_type;
  const dt in = g.in == Element::kBFloat16 ? dt::bf16 : dt::f32;
  const auto a = operand_desc(g.a, g.batch, g.m, g.k, in);
  const auto b = operand_desc(g.b, g.batch, g.k, g.n, in);
  const dnnl::memory::desc c = result_desc(g);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (g.accumulate) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);
    attr.set_post_ops(ops);
  }
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), attr, cpu_engine());
  return cache.emplace(key, Primitive{dnnl::matmul(pd), pd.scratchpad_desc()}).first->second;
}

void run_onednn(const BatchedGemm& g) {
  try {
    const Primitive& p = primitive(g);
    dnnl::engine& engine = cpu_engine();
    thread_local std::vector<unsigned char> scratch;
    if (scratch.size() < p.scratchpad.get_size()) scratch.resize(p.scratchpad.get_size());
    using dt = dnnl::memory::data_type;
    const dt in = g.in == Element::kBFloat16 ? dt::bf16 : dt::f32;
    dnnl::memory a(operand_desc(g.a, g.batch, g.m, g.k, in), engine, const_cast<void*>(g.a.data));
    dnnl::memory b(operand_desc(g.b, g.batch, g.k, g.n, in), engine, const_cast<void*>(g.b.data));
    dnnl::memory c(result_desc(g), engine, g.c);
    dnnl::stream stream(engine);
    dnnl::memory scratchpad(p.scratchpad, engine, scratch.data());
    p.matmul.execute(stream, {{DNNL_ARG_SRC, a},
                              {DNNL_ARG_WEIGHTS, b},
                              {DNNL_ARG_DST, c},
                              {DNNL_ARG_SCRATCHPAD, scratchpad}});
    stream.wait();
  } catch (const dnnl::error& error) {
    throw Error(std::string("sparse attention: oneDNN matmul [") + std::to_string(g.m) + ", " +
                std::to_string(g.k) + "] x [" + std::to_string(g.k) + ", " + std::to_string(g.n) +
                "] failed: " + error.what());
  }
}
#endif

}  // namespace

namespace {

// What oneDNN has for `in`'s products on this CPU, probed once per element type on one shape:
// nothing (no primitive: bf16 on CPUs without AVX-512 in oneDNN 2.6), its reference loops, an
// optimised implementation, or one on the CPU's matrix units (AMX: "brg:avx512_core_amx_bf16").
enum class OneDnnSupport { kNone, kReference, kFast, kFastAmx };

OneDnnSupport onednn_support(Element in) {
#ifdef SPARSECP_HAVE_ONEDNN
  if (in == Element::kFloat64) return OneDnnSupport::kNone;
  auto probe = [](Element element) {
    try {
      using dt = dnnl::memory::data_type;
      const dt type = element == Element::kBFloat16 ? dt::bf16 : dt::f32;
      const dnnl::memory::desc a({1, 64, 128}, type, dnnl::memory::dims{int64_t{64} * 128, 128, 1});
      const dnnl::memory::desc b({1, 128, 64}, type, dnnl::memory::dims{int64_t{64} * 128, 1, 128});
      const dnnl::memory::desc c({1, 64, 64}, dt::f32, dnnl::memory::dims{int64_t{64} * 64, 64, 1});
      const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), cpu_engine());
      const std::string_view impl = pd.impl_info_str();
      if (impl.rfind("ref", 0) == 0) return OneDnnSupport::kReference;
      return impl.find("amx") != std::string_view::npos ? OneDnnSupport::kFastAmx
                                                        : OneDnnSupport::kFast;
    } catch (const dnnl::error&) {
      return OneDnnSupport::kNone;
    }
  };
  static const OneDnnSupport f32 = probe(Element::kFloat32);
  static const OneDnnSupport bf16 = probe(Element::kBFloat16);
  return in == Element::kBFloat16 ? bf16 : f32;
#else
  (void)in;
  return OneDnnSupport::kNone;
#endif
}

}  // namespace

bool onednn_runs(Element in) { return onednn_support(in) != OneDnnSupport::kNone; }

bool onednn_fast(Element in) {
  const OneDnnSupport support = onednn_support(in);
  return support == OneDnnSupport::kFast || support == OneDnnSupport::kFastAmx;
}

bool onednn_uses_amx(Element in) { return onednn_support(in) == OneDnnSupport::kFastAmx; }

bool onednn_built() {
#ifdef SPARSECP_HAVE_ONEDNN
  return true;
#else
  return false;
#endif
}

const char* gemm_library_name(bool onednn) {
#ifdef SPARSECP_HAVE_ONEDNN
  if (onednn) {
    static const std::string name = [] {
      const dnnl_version_t* v = dnnl_version();
      return "onednn " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
             std::to_string(v->patch);
    }();
    return name.c_str();
  }
#else
  (void)onednn;
#endif
  return "blas";
}

void run_gemm(const BatchedGemm& g, bool onednn) {
  if (g.batch == 0 || g.m == 0 || g.n == 0) return;
#ifdef SPARSECP_HAVE_ONEDNN
  if (onednn && g.k > 0) {
    run_onednn(g);
    return;
  }
#else
  (void)onednn;
#endif
  if (g.k == 0) {  // an empty product: zeros (or C unchanged)
    if (g.accumulate) return;
    for (int64_t i = 0; i < g.batch; ++i) {
      for (int64_t r = 0; r < g.m; ++r) {
        for (int64_t c = 0; c < g.n; ++c) {
          if (g.in == Element::kFloat64) {
            static_cast<double*>(g.c)[i * g.c_batch_stride + r * g.ldc + c] = 0.0;
          } else {
            static_cast<float*>(g.c)[i * g.c_batch_stride + r * g.ldc + c] = 0.0f;
          }
        }
      }
    }
    return;
  }
  run_blas(g);
}

}  // namespace sparsecp::attention_detail
