// The sparse attention kernel (sparse_attention.hpp): rows in blocks, each block's listed kv
// rows gathered once, the four products of the FlashAttention recipe through run_gemm, the
// softmax passes through the ISA's RowOps, and the key gradient scattered in a fixed order.
#include "sparsecp/kernels/sparse_attention.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string_view>
#include <type_traits>
#include <vector>

#include "../parallel_blocks.hpp"
#include "batched_gemm.hpp"
#include "row_ops.hpp"
#include "sparsecp/error.hpp"
#include "sparsecp/kernels/bf16.hpp"
#include "sparsecp/kernels/blas_core.hpp"

namespace sparsecp {

namespace ad = attention_detail;
namespace kd = kernel_detail;

const char* attention_dtype_name(AttentionDType dtype) {
  switch (dtype) {
    case AttentionDType::kFloat32:
      return "float32";
    case AttentionDType::kBFloat16:
      return "bfloat16";
    case AttentionDType::kFloat64:
      return "float64";
  }
  return "unknown";
}

namespace {

// SPARSECP_ATTENTION_GEMM, read at each call: "blas" or "onednn" puts that library where kAuto
// would take another library or the direct loops, "direct" the direct loops wherever they apply
// (float32 with 1, 2, 4 or 8 heads) on any ISA (benchmarks compare them side by side).
std::string_view gemm_from_environment() {
  const char* env = std::getenv("SPARSECP_ATTENTION_GEMM");
  return env == nullptr ? std::string_view() : std::string_view(env);
}

ad::Element element_of(AttentionDType dtype) {
  switch (dtype) {
    case AttentionDType::kFloat32:
      return ad::Element::kFloat32;
    case AttentionDType::kBFloat16:
      return ad::Element::kBFloat16;
    case AttentionDType::kFloat64:
      return ad::Element::kFloat64;
  }
  return ad::Element::kFloat32;
}

bool use_onednn(AttentionDType dtype, AttentionGemm gemm) {
  if (dtype == AttentionDType::kFloat64) return false;  // oneDNN has no float64 products
  if (gemm == AttentionGemm::kBlas) return false;
  if (gemm == AttentionGemm::kOneDnn) return true;
  const ad::Element element = element_of(dtype);
  if (gemm_from_environment() == "onednn" && ad::onednn_runs(element)) return true;
  if (!ad::onednn_fast(element)) return false;  // not built, or only its reference loops here
  return gemm_from_environment() != "blas";
}

// Whether a call takes the direct products (row_ops.hpp's DirectRow) instead of a library's:
// float32 with 1, 2, 4 or 8 heads, where a row's products are matrix-vector shapes, unless a
// library is asked for by name.
// kAuto takes them on the avx512 and avx2 ISAs, where they ran at 1.9-2.4x (AMX Xeon) and
// 1.0-2.1x (AMD EPYC Zen 3, 8-float vectors) oneDNN's products; not on the portable one
// (unmeasured) (python/benchmarks/attention_speed.py --shapes small,head512 --gemm direct,onednn).
bool use_direct(AttentionDType dtype, int64_t heads, AttentionGemm gemm, KernelIsa isa) {
  if (gemm == AttentionGemm::kDirect) return true;
  if (gemm != AttentionGemm::kAuto || dtype != AttentionDType::kFloat32 ||
      !ad::direct_heads(heads)) {
    return false;
  }
  const std::string_view env = gemm_from_environment();
  if (env == "direct") return true;
  const KernelIsa resolved = resolve_kernel_isa(isa);
  return env != "blas" && env != "onednn" &&
         (resolved == KernelIsa::kAvx512 || resolved == KernelIsa::kAvx2);
}

// A library or the direct loops asked for by name: one this build has that multiplies `dtype`
// here (float64 takes the BLAS whatever is asked: oneDNN has no float64 products anywhere);
// kDirect float32 with 1, 2, 4 or 8 heads (heads 0: not known yet).
void check_gemm(AttentionDType dtype, int64_t heads, AttentionGemm gemm) {
  if (gemm == AttentionGemm::kOneDnn && dtype == AttentionDType::kFloat64) return;
  SPARSECP_CHECK(gemm != AttentionGemm::kOneDnn || ad::onednn_built(),
                 "sparse attention gemm 'onednn' was asked for, but this build has no oneDNN");
  SPARSECP_CHECK(gemm != AttentionGemm::kOneDnn || ad::onednn_runs(element_of(dtype)),
                 "sparse attention gemm 'onednn' has no ", attention_dtype_name(dtype),
                 " products on this CPU (", ad::gemm_library_name(true),
                 "); take 'auto' or 'blas'");
  SPARSECP_CHECK(gemm != AttentionGemm::kDirect ||
                     (dtype == AttentionDType::kFloat32 && (heads == 0 || ad::direct_heads(heads))),
                 "sparse attention gemm 'direct' takes float32 with 1, 2, 4 or 8 heads, got ",
                 attention_dtype_name(dtype), " with ", heads, " heads");
}

bool use_direct(const SparseAttentionInputs& in, const SparseAttentionConfig& config) {
  return use_direct(in.dtype, in.heads, config.gemm, config.isa);
}

int resolve_threads(int threads) {
  return threads > 0 ? threads : std::max(1, omp_get_max_threads());
}

ad::RowOps row_ops(KernelIsa isa) {
  switch (resolve_kernel_isa(isa)) {
#if defined(__x86_64__) || defined(_M_X64)
    case KernelIsa::kAvx512:
      return ad::row_ops_avx512();
    case KernelIsa::kAvx2:
      return ad::row_ops_avx2();
#endif
    default:
      return ad::row_ops_portable();
  }
}

// Element types of one call: T stored (q, kv, out, d out, d q), W the products' operands,
// A accumulation (logits, probabilities, lse, sinks, d kv).
template <class T, class W, class A>
struct Types {
  using Stored = T;
  using Operand = W;
  using Accumulate = A;
};

template <class To, class From>
To convert(From value) {
  if constexpr (std::is_same_v<To, From>) {
    return value;
  } else if constexpr (std::is_same_v<From, uint16_t>) {
    return static_cast<To>(bf16_to_float(value));
  } else if constexpr (std::is_same_v<To, uint16_t>) {
    return float_to_bf16(static_cast<float>(value));
  } else {
    return static_cast<To>(value);
  }
}

template <class To, class From>
void convert_span(const From* from, int64_t count, To* to) {
  for (int64_t i = 0; i < count; ++i) to[i] = convert<To>(from[i]);
}

template <class W>
constexpr ad::Element element_of() {
  if constexpr (std::is_same_v<W, double>) return ad::Element::kFloat64;
  if constexpr (std::is_same_v<W, uint16_t>) return ad::Element::kBFloat16;
  return ad::Element::kFloat32;
}

// Bytes of one block row's scratch for element sizes (W, A).
std::size_t row_bytes(const SparseAttentionInputs& in, std::size_t w, std::size_t a) {
  const auto H = static_cast<std::size_t>(in.heads), C = static_cast<std::size_t>(in.columns);
  const auto D = static_cast<std::size_t>(in.qk_dim), V = static_cast<std::size_t>(in.value_dim);
  return C * D * (w + a)          // gathered kv rows, their gradient
         + H * C * (4 * a + w)    // logits, probabilities, their gradients (and a W copy)
         + H * (D + V) * (w + a)  // q, d out as operands; out / d q before rounding
         + 2 * H * (C + D) * w    // [grad | probs] and [q ; d out]
         + H * 4 * a;             // per-head lse, delta, sink terms
}

// The direct products' scratch: a block row's kv-row gradients (the slot of a wave, with more
// than one thread) per block row, and one row's [columns, heads] passes, d out padded to
// qk_dim and the per-head terms per thread.
std::size_t direct_block_row_bytes(const SparseAttentionInputs& in) {
  return static_cast<std::size_t>(in.columns * in.qk_dim) * sizeof(float);
}

std::size_t direct_fixed_bytes(const SparseAttentionInputs& in) {
  return static_cast<std::size_t>(4 * in.heads * in.columns + in.heads * in.qk_dim + 4 * in.heads) *
         sizeof(float);
}

std::pair<std::size_t, std::size_t> element_sizes(AttentionDType dtype, bool onednn) {
  if (dtype == AttentionDType::kFloat64) return {8, 8};
  if (dtype == AttentionDType::kBFloat16 && onednn) return {2, 4};
  return {4, 4};
}

// Generic softmax passes for float64 (the ISA's RowOps are float32), in the same
// [columns, heads] layout (row_ops.hpp).
template <class A>
void softmax_generic(const A* logits, int64_t heads, int64_t columns, const int32_t* ids, A scale,
                     const A* sinks, A* probs, A* lse, A* work) {
  constexpr A kInf = std::numeric_limits<A>::infinity();
  A* shift = work;
  A* keys = work + heads;
  for (int64_t h = 0; h < heads; ++h) {
    A top = -kInf;
    for (int64_t c = 0; c < columns; ++c) {
      if (ids[c] >= 0) top = std::max(top, logits[c * heads + h] * scale);
    }
    top = std::max(top, sinks != nullptr ? sinks[h] : -kInf);
    shift[h] = top > -kInf ? top : A(0);
    keys[h] = 0;
  }
  for (int64_t c = 0; c < columns; ++c) {
    for (int64_t h = 0; h < heads; ++h) {
      const A e = ids[c] >= 0 ? std::exp(logits[c * heads + h] * scale - shift[h]) : A(0);
      probs[c * heads + h] = e;
      keys[h] += e;
    }
  }
  for (int64_t h = 0; h < heads; ++h) {
    const A total = keys[h] + (sinks != nullptr ? std::exp(sinks[h] - shift[h]) : A(0));
    lse[h] = keys[h] > 0 ? shift[h] + std::log(keys[h]) : (keys[h] == keys[h] ? -kInf : keys[h]);
    keys[h] = total > 0 ? A(1) / total : (total == total ? A(0) : total);
  }
  for (int64_t c = 0; c < columns; ++c) {
    for (int64_t h = 0; h < heads; ++h) probs[c * heads + h] *= keys[h];
  }
}

template <class A>
void logit_gradient_generic(const A* logits, int64_t heads, int64_t columns, const int32_t* ids,
                            A scale, const A* full, const A* dprobs, const A* delta, A* probs,
                            A* grad) {
  constexpr A kInf = std::numeric_limits<A>::infinity();
  for (int64_t c = 0; c < columns; ++c) {
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t i = c * heads + h;
      const bool live = full[h] > -kInf || full[h] != full[h];
      probs[i] = (ids[c] >= 0 && live) ? std::exp(logits[i] * scale - full[h]) : A(0);
      grad[i] = probs[i] * (dprobs[i] - delta[h]) * scale;
    }
  }
}

template <class A>
A log_add_exp(A a, A b) {
  constexpr A kInf = std::numeric_limits<A>::infinity();
  if (a == -kInf) return b;
  if (b == -kInf) return a;
  const A top = std::max(a, b);
  return top + std::log(std::exp(a - top) + std::exp(b - top));
}

constexpr const char* kContext = "sparse attention";  // names the kernel in errors

template <class Ty>
class Kernel {
 public:
  using T = typename Ty::Stored;
  using W = typename Ty::Operand;
  using A = typename Ty::Accumulate;

  Kernel(const SparseAttentionInputs& in, const SparseAttentionConfig& config, bool onednn)
      : in_(in),
        onednn_(onednn),
        direct_(use_direct(in, config)),
        ops_(row_ops(config.isa)),
        threads_(resolve_threads(config.threads)),
        block_(sparse_attention_block_rows(in, config)),
        blocks_(in.rows == 0 ? 0 : (in.rows + block_ - 1) / block_),
        H_(in.heads),
        C_(in.columns),
        D_(in.qk_dim),
        V_(in.value_dim) {}

  void forward(T* out, A* lse) const {
    const int threads = static_cast<int>(std::min<int64_t>(threads_, blocks_));
    std::vector<std::unique_ptr<Scratch>> scratch(static_cast<std::size_t>(threads));
    kd::parallel_blocks(blocks_, threads, kContext, [&](int64_t b, int thread) {
      auto& mine = scratch[static_cast<std::size_t>(thread)];
      if (!mine) mine = std::make_unique<Scratch>(*this);
      if (direct_) {
        forward_block_direct(b, *mine, out, lse);
      } else {
        forward_block(b, *mine, out, lse);
      }
    });
  }

  void backward(const T* out, const A* lse, const T* grad_out, T* grad_q, A* grad_kv,
                A* grad_sinks) const {
    std::fill(grad_kv, grad_kv + in_.keys * D_, A(0));
    std::vector<A> sink_rows(in_.sinks != nullptr ? static_cast<std::size_t>(in_.rows * H_) : 0);
    // Waves of one block per thread: every thread computes its block's kv-row gradients into
    // its slot, then every thread adds a slice of the qk_dim columns of every slot's rows, in
    // block, row, column order: the sum's order is the same whatever the thread count.
    const int threads =
        static_cast<int>(std::min<int64_t>(threads_, std::max<int64_t>(blocks_, 1)));
    // One thread with the direct products adds each row's kv-row gradients into grad_kv as it
    // goes: the same sums in the same order as a slot added afterwards.
    const bool in_place = direct_ && threads == 1;
    const std::size_t slot_size = in_place ? 0 : static_cast<std::size_t>(block_ * C_ * D_);
    std::vector<std::vector<A>> slots(static_cast<std::size_t>(threads));
    kd::WorkerError error;
#pragma omp parallel num_threads(threads)
    {
      const int t = omp_get_thread_num();
      const int nt = omp_get_num_threads();
      omp_set_num_threads(1);  // the libraries single-threaded inside (parallel_blocks.hpp)
      // Scratch is allocated inside the region, so its failure must be caught here (an exception
      // leaving an OpenMP region terminates the program); every thread still meets every barrier.
      std::unique_ptr<Scratch> s;
      std::vector<A>& slot = slots[static_cast<std::size_t>(t)];
      try {
        s = std::make_unique<Scratch>(*this);
        slot.resize(slot_size);
      } catch (...) {
        error.record();
      }
#pragma omp barrier
      for (int64_t wave = 0; wave < blocks_; wave += nt) {
        const int64_t b = wave + t;
        if (b < blocks_ && !error.failed()) {
          try {
            if (direct_) {
              backward_block_direct(b, *s, out, lse, grad_out, grad_q, sink_rows.data(),
                                    in_place ? grad_kv : slot.data(), in_place);
            } else {
              backward_block(b, *s, out, lse, grad_out, grad_q, sink_rows.data(), slot.data());
            }
          } catch (...) {
            error.record();
          }
        }
#pragma omp barrier
        if (!error.failed() && !in_place) {
          const int64_t lo = D_ * t / nt, hi = D_ * (t + 1) / nt;
          for (int64_t done = 0; done < nt && wave + done < blocks_; ++done) {
            scatter(wave + done, slots[static_cast<std::size_t>(done)].data(), lo, hi, grad_kv);
          }
        }
#pragma omp barrier
      }
    }
    error.rethrow(kContext);
    if (grad_sinks != nullptr) {
      std::fill(grad_sinks, grad_sinks + H_, A(0));
      for (int64_t r = 0; r < in_.rows; ++r) {
        for (int64_t h = 0; h < H_; ++h)
          grad_sinks[h] += sink_rows[static_cast<std::size_t>(r * H_ + h)];
      }
    }
  }

 private:
  // Uninitialised storage: every element is written before it is read.
  template <class E>
  class Buffer {
   public:
    void resize(std::size_t n) { data_ = std::make_unique_for_overwrite<E[]>(n); }
    E* data() { return data_.get(); }
    E& operator[](std::size_t i) { return data_[i]; }

   private:
    std::unique_ptr<E[]> data_;
  };

  struct Scratch {
    explicit Scratch(const Kernel& k) {
      const auto R = static_cast<std::size_t>(k.block_), H = static_cast<std::size_t>(k.H_);
      const auto C = static_cast<std::size_t>(k.C_), D = static_cast<std::size_t>(k.D_);
      const auto V = static_cast<std::size_t>(k.V_);
      rows.resize(H * 4);
      if (k.direct_) {  // one row at a time (direct_fixed_bytes)
        logits.resize(H * C);
        probs.resize(H * C);
        dprobs.resize(H * C);
        grad.resize(H * C);
        stack.resize(H * D);  // d out padded to qk_dim
        return;
      }
      gathered.resize(R * C * D);
      logits.resize(R * H * C);
      probs.resize(R * H * C);
      dprobs.resize(R * H * C);
      grad.resize(R * H * C);
      if constexpr (!std::is_same_v<W, A>) {
        probs_w.resize(R * H * C);
      }
      if constexpr (!std::is_same_v<T, W>) {
        q_w.resize(R * H * D);
        dout_w.resize(R * H * V);
      }
      pair.resize(R * C * 2 * H);  // [grad | probs] per column and [q ; d out] per row
      stack.resize(R * 2 * H * D);
      result.resize(R * H * std::max(D, V));
    }
    Buffer<W> gathered, probs_w, q_w, dout_w, pair, stack;
    Buffer<A> logits, probs, dprobs, grad, result, rows;
  };

  const int32_t* ids(int64_t row) const { return in_.indices + row * C_; }
  A sink(int64_t h) const {
    return in_.sinks == nullptr ? A(0) : static_cast<const A*>(in_.sinks)[h];
  }

  void gather(int64_t r0, int64_t n, W* dst) const {
    const T* kv = static_cast<const T*>(in_.kv);
    if constexpr (std::is_same_v<T, W>) {  // rows as they are (zero bytes are 0 in W)
      const auto row_bytes = static_cast<int64_t>(sizeof(W)) * D_;
      for (int64_t r = 0; r < n; ++r) {
        ops_.gather_bytes(reinterpret_cast<const unsigned char*>(kv), ids(r0 + r), C_, row_bytes,
                          reinterpret_cast<unsigned char*>(dst + r * C_ * D_));
      }
    } else {  // bf16 rows widened for the BLAS
      for (int64_t r = 0; r < n; ++r) {
        const int32_t* row = ids(r0 + r);
        for (int64_t c = 0; c < C_; ++c) {
          W* to = dst + (r * C_ + c) * D_;
          if (row[c] < 0) {
            std::fill(to, to + D_, W(0));
          } else {
            convert(kv + static_cast<int64_t>(row[c]) * D_, D_, to);
          }
        }
      }
    }
  }

  // A block's operand rows of a [rows, heads, dim] tensor: the tensor itself when T is W.
  // from -> to, through the ISA's loops where one side is bf16 and the other float32.
  template <class To, class From>
  void convert(const From* from, int64_t count, To* to) const {
    if constexpr (std::is_same_v<From, uint16_t> && std::is_same_v<To, float>) {
      ops_.widen(from, count, to);
    } else if constexpr (std::is_same_v<From, float> && std::is_same_v<To, uint16_t>) {
      ops_.narrow(from, count, to);
    } else {
      ::sparsecp::convert_span(from, count, to);
    }
  }

  const W* operand(const T* tensor, int64_t r0, int64_t n, int64_t dim, Buffer<W>& buffer) const {
    if constexpr (std::is_same_v<T, W>) {
      (void)n;
      (void)buffer;
      return tensor + r0 * H_ * dim;
    } else {
      convert(tensor + r0 * H_ * dim, n * H_ * dim, buffer.data());
      return buffer.data();
    }
  }

  const W* as_operand(Buffer<A>& values, Buffer<W>& buffer, int64_t count) const {
    if constexpr (std::is_same_v<W, A>) {
      (void)buffer;
      (void)count;
      return values.data();
    } else {
      convert(values.data(), count, buffer.data());
      return buffer.data();
    }
  }

  void gemm(int64_t batch, int64_t m, int64_t n, int64_t k, ad::Operand a, ad::Operand b, A* c,
            int64_t c_batch, int64_t ldc, bool accumulate = false) const {
    ad::BatchedGemm g;
    g.in = element_of<W>();
    g.batch = batch;
    g.m = m;
    g.n = n;
    g.k = k;
    g.a = a;
    g.b = b;
    g.c = c;
    g.c_batch_stride = c_batch;
    g.ldc = ldc;
    g.accumulate = accumulate;
    ad::run_gemm(g, onednn_);
  }

  // logits[r] (C x H) = gathered[r] (C x D) . q[r]^T (D x H): the gathered rows are the
  // products' row-major left operand (no repacking of the large block).
  void scores(int64_t n, const W* q, Scratch& s) const {
    gemm(n, C_, H_, D_, {s.gathered.data(), C_ * D_, D_, false}, {q, H_ * D_, D_, true},
         s.logits.data(), C_ * H_, H_);
  }

  void softmax_rows(int64_t r0, int64_t n, Scratch& s, A* lse) const {
    for (int64_t r = 0; r < n; ++r) {
      A* logits = s.logits.data() + r * H_ * C_;
      A* probs = s.probs.data() + r * H_ * C_;
      if constexpr (std::is_same_v<A, float>) {
        ops_.softmax({logits, H_, C_, ids(r0 + r), static_cast<float>(in_.scale)},
                     static_cast<const float*>(in_.sinks), probs, lse + (r0 + r) * H_,
                     s.rows.data());
      } else {
        softmax_generic<A>(logits, H_, C_, ids(r0 + r), static_cast<A>(in_.scale),
                           static_cast<const A*>(in_.sinks), probs, lse + (r0 + r) * H_,
                           s.rows.data());
      }
    }
  }

  void forward_block(int64_t b, Scratch& s, T* out, A* lse) const {
    const int64_t r0 = b * block_, n = std::min(block_, in_.rows - r0);
    gather(r0, n, s.gathered.data());
    scores(n, operand(static_cast<const T*>(in_.q), r0, n, D_, s.q_w), s);
    softmax_rows(r0, n, s, lse);
    const W* probs = as_operand(s.probs, s.probs_w, n * H_ * C_);
    // out[r] (H x V) = probs[r]^T (H x C) . gathered[r][:, :V] (C x V)
    A* result = std::is_same_v<T, A> ? reinterpret_cast<A*>(out + r0 * H_ * V_) : s.result.data();
    gemm(n, H_, V_, C_, {probs, C_ * H_, H_, true}, {s.gathered.data(), C_ * D_, D_, false}, result,
         H_ * V_, V_);
    if constexpr (!std::is_same_v<T, A>) convert(result, n * H_ * V_, out + r0 * H_ * V_);
  }

  void backward_block(int64_t b, Scratch& s, const T* out, const A* lse, const T* grad_out,
                      T* grad_q, A* sink_rows, A* dgathered) const {
    const int64_t r0 = b * block_, n = std::min(block_, in_.rows - r0);
    gather(r0, n, s.gathered.data());
    const W* q = operand(static_cast<const T*>(in_.q), r0, n, D_, s.q_w);
    const W* dout = operand(grad_out, r0, n, V_, s.dout_w);
    scores(n, q, s);
    // d probs[r] (C x H) = gathered[r][:, :V] (C x V) . d out[r]^T (V x H)
    gemm(n, C_, H_, V_, {s.gathered.data(), C_ * D_, D_, false}, {dout, H_ * V_, V_, true},
         s.dprobs.data(), C_ * H_, H_);
    for (int64_t r = 0; r < n; ++r) {
      const int64_t row = r0 + r;
      A* full = s.rows.data();
      A* delta = s.rows.data() + H_;
      row_terms(row, out, lse, grad_out, full, delta, sink_rows);
      const int64_t at = r * C_ * H_;
      if constexpr (std::is_same_v<A, float>) {
        ops_.logit_gradient({s.logits.data() + at, H_, C_, ids(row), static_cast<float>(in_.scale)},
                            full, s.dprobs.data() + at, delta, s.probs.data() + at,
                            s.grad.data() + at);
      } else {
        logit_gradient_generic<A>(s.logits.data() + at, H_, C_, ids(row), static_cast<A>(in_.scale),
                                  full, s.dprobs.data() + at, delta, s.probs.data() + at,
                                  s.grad.data() + at);
      }
    }
    // The key gradient grad . q + probs . d out is one product of depth 2 * heads, writing the
    // [columns, qk_dim] block once: [grad | probs] per column, [q ; d out] per row (d out's rows
    // padded with zeros from value_dim to qk_dim).
    W* pair = s.pair.data();
    W* stack = s.stack.data();
    for (int64_t rc = 0; rc < n * C_; ++rc) {
      convert(s.grad.data() + rc * H_, H_, pair + rc * 2 * H_);
      convert(s.probs.data() + rc * H_, H_, pair + rc * 2 * H_ + H_);
    }
    for (int64_t r = 0; r < n; ++r) {
      std::memcpy(stack + r * 2 * H_ * D_, q + r * H_ * D_,
                  sizeof(W) * static_cast<std::size_t>(H_ * D_));
      for (int64_t h = 0; h < H_; ++h) {
        W* to = stack + ((r * 2 + 1) * H_ + h) * D_;
        std::memcpy(to, dout + (r * H_ + h) * V_, sizeof(W) * static_cast<std::size_t>(V_));
        std::fill(to + V_, to + D_, W(0));
      }
    }
    // d q[r] (H x D) = grad[r]^T (H x C) . gathered[r] (C x D)
    A* dq = std::is_same_v<T, A> ? reinterpret_cast<A*>(grad_q + r0 * H_ * D_) : s.result.data();
    gemm(n, H_, D_, C_, {pair, C_ * 2 * H_, 2 * H_, true}, {s.gathered.data(), C_ * D_, D_, false},
         dq, H_ * D_, D_);
    if constexpr (!std::is_same_v<T, A>) convert(dq, n * H_ * D_, grad_q + r0 * H_ * D_);
    // d gathered[r] (C x D) = [grad | probs][r] (C x 2H) . [q ; d out][r] (2H x D)
    gemm(n, C_, D_, 2 * H_, {pair, C_ * 2 * H_, 2 * H_, false}, {stack, 2 * H_ * D_, D_, false},
         dgathered, C_ * D_, D_);
  }

  // A row's backward terms: full[h] the log of the softmax's whole denominator (the sink's term
  // included), delta[h] = d out . out, and the row's share of d sinks.
  void row_terms(int64_t row, const T* out, const A* lse, const T* grad_out, A* full, A* delta,
                 A* sink_rows) const {
    constexpr A kInf = std::numeric_limits<A>::infinity();
    for (int64_t h = 0; h < H_; ++h) {
      const A keys = lse[row * H_ + h];
      full[h] = in_.sinks != nullptr ? log_add_exp(keys, sink(h)) : keys;
      const T* o = out + (row * H_ + h) * V_;
      const T* d = grad_out + (row * H_ + h) * V_;
      A sum = 0;
      if constexpr (std::is_same_v<T, uint16_t>) {
        sum = ops_.dot_bf16(o, d, V_);
      } else if constexpr (std::is_same_v<T, float>) {
        sum = ops_.dot_f32(o, d, V_);
      } else {
        for (int64_t v = 0; v < V_; ++v) sum += o[v] * d[v];
      }
      delta[h] = sum;
      if (in_.sinks != nullptr) {  // the sink's value is zero: d sink = -p_sink * delta
        const A p_sink = full[h] > -kInf ? std::exp(sink(h) - full[h]) : A(0);
        sink_rows[row * H_ + h] = -p_sink * sum;
      }
    }
  }

  // The direct products (float32, use_direct): one row at a time, its kv rows read in the table.
  ad::DirectRow direct_row(int64_t row) const {
    ad::DirectRow d;
    d.kv = static_cast<const float*>(in_.kv);
    d.ids = ids(row);
    d.columns = C_;
    d.heads = H_;
    d.qk_dim = D_;
    return d;
  }

  void forward_block_direct(int64_t b, Scratch& s, T* out, A* lse) const {
    if constexpr (std::is_same_v<T, float> && std::is_same_v<A, float>) {
      const int64_t r0 = b * block_, n = std::min(block_, in_.rows - r0);
      const auto* q = static_cast<const float*>(in_.q);
      for (int64_t row = r0; row < r0 + n; ++row) {
        const ad::DirectRow dr = direct_row(row);
        ops_.direct_dots(dr, q + row * H_ * D_, D_, s.logits.data());
        ops_.softmax({s.logits.data(), H_, C_, dr.ids, static_cast<float>(in_.scale)},
                     static_cast<const float*>(in_.sinks), s.probs.data(), lse + row * H_,
                     s.rows.data());
        ops_.direct_weighted_sum(dr, s.probs.data(), V_, out + row * H_ * V_);
      }
    } else {
      SPARSECP_CHECK(false, "sparse attention: the direct products take float32 only");
    }
  }

  // kv-row gradients added into grad_kv (in_place) or stored in the block's slot.
  void backward_block_direct(int64_t b, Scratch& s, const T* out, const A* lse, const T* grad_out,
                             T* grad_q, A* sink_rows, A* to, bool in_place) const {
    if constexpr (std::is_same_v<T, float> && std::is_same_v<A, float>) {
      const int64_t r0 = b * block_, n = std::min(block_, in_.rows - r0);
      const auto* q_all = static_cast<const float*>(in_.q);
      float* dout_padded = s.stack.data();
      A* full = s.rows.data();
      A* delta = s.rows.data() + H_;
      for (int64_t r = 0; r < n; ++r) {
        const int64_t row = r0 + r;
        const ad::DirectRow dr = direct_row(row);
        const float* q = q_all + row * H_ * D_;
        const float* dout = grad_out + row * H_ * V_;
        ops_.direct_dots(dr, q, D_, s.logits.data());
        ops_.direct_dots(dr, dout, V_, s.dprobs.data());
        row_terms(row, out, lse, grad_out, full, delta, sink_rows);
        ops_.logit_gradient({s.logits.data(), H_, C_, dr.ids, static_cast<float>(in_.scale)}, full,
                            s.dprobs.data(), delta, s.probs.data(), s.grad.data());
        ops_.direct_weighted_sum(dr, s.grad.data(), D_, grad_q + row * H_ * D_);
        for (int64_t h = 0; h < H_; ++h) {
          std::memcpy(dout_padded + h * D_, dout + h * V_,
                      sizeof(float) * static_cast<std::size_t>(V_));
          std::fill(dout_padded + h * D_ + V_, dout_padded + (h + 1) * D_, 0.0f);
        }
        ops_.direct_key_gradient(dr, s.grad.data(), s.probs.data(), q, dout_padded,
                                 in_place ? to : to + r * C_ * D_, in_place);
      }
    } else {
      SPARSECP_CHECK(false, "sparse attention: the direct products take float32 only");
    }
  }

  // grad_kv[id][lo, hi) += block b's gradient rows, in row then column order.
  void scatter(int64_t b, const A* dgathered, int64_t lo, int64_t hi, A* grad_kv) const {
    const int64_t r0 = b * block_, n = std::min(block_, in_.rows - r0);
    for (int64_t r = 0; r < n; ++r) {
      const int32_t* row = ids(r0 + r);
      if constexpr (std::is_same_v<A, float>) {
        ops_.scatter_add(dgathered + r * C_ * D_, row, C_, D_, lo, hi, grad_kv);
      } else {
        for (int64_t c = 0; c < C_; ++c) {
          if (row[c] < 0) continue;
          const A* from = dgathered + (r * C_ + c) * D_;
          A* to = grad_kv + static_cast<int64_t>(row[c]) * D_;
          for (int64_t d = lo; d < hi; ++d) to[d] += from[d];
        }
      }
    }
  }

  const SparseAttentionInputs& in_;
  bool onednn_;
  bool direct_;  // float32 only (use_direct)
  ad::RowOps ops_;
  int threads_;
  int64_t block_;
  int64_t blocks_;
  int64_t H_, C_, D_, V_;
};

template <class Visit>
void dispatch(const SparseAttentionInputs& in, bool onednn, const Visit& visit) {
  switch (in.dtype) {
    case AttentionDType::kFloat32:
      visit(Types<float, float, float>{});
      return;
    case AttentionDType::kBFloat16:
      if (onednn) {
        visit(Types<uint16_t, uint16_t, float>{});
      } else {
        visit(Types<uint16_t, float, float>{});
      }
      return;
    case AttentionDType::kFloat64:
      visit(Types<double, double, double>{});
      return;
  }
}

}  // namespace

bool sparse_attention_has_onednn(AttentionDType dtype) {
  return ad::onednn_runs(element_of(dtype));
}

const char* sparse_attention_gemm_name(AttentionDType dtype, AttentionGemm gemm, int64_t heads) {
  check_gemm(dtype, heads, gemm);
  if (gemm == AttentionGemm::kDirect ||
      (heads > 0 && use_direct(dtype, heads, gemm, KernelIsa::kAuto))) {
    return "direct";
  }
  return ad::gemm_library_name(use_onednn(dtype, gemm));
}

void validate_sparse_attention(const SparseAttentionInputs& in,
                               const SparseAttentionConfig& config) {
  SPARSECP_CHECK(in.heads >= 1, "sparse attention heads must be positive, got ", in.heads);
  SPARSECP_CHECK(in.qk_dim >= 1, "sparse attention qk_dim must be positive, got ", in.qk_dim);
  SPARSECP_CHECK(in.value_dim >= 1 && in.value_dim <= in.qk_dim,
                 "sparse attention value_dim must be in [1, qk_dim ", in.qk_dim, "], got ",
                 in.value_dim);
  SPARSECP_CHECK(in.rows >= 0, "sparse attention rows must be non-negative, got ", in.rows);
  SPARSECP_CHECK(in.keys >= 0, "sparse attention keys must be non-negative, got ", in.keys);
  SPARSECP_CHECK(in.columns >= 0, "sparse attention columns must be non-negative, got ",
                 in.columns);
  SPARSECP_CHECK(std::isfinite(in.scale), "sparse attention scale must be finite, got ", in.scale);
  SPARSECP_CHECK(in.keys <= std::numeric_limits<int32_t>::max(), "sparse attention keys ", in.keys,
                 " exceed int32 indices");
  SPARSECP_CHECK(config.threads >= 0 && config.threads <= kMaxAttentionThreads,
                 "sparse attention threads must be in [0, ", kMaxAttentionThreads, "], got ",
                 config.threads);
  check_gemm(in.dtype, in.heads, config.gemm);
  (void)resolve_kernel_isa(config.isa);  // throws naming an ISA this CPU cannot run
  const bool empty = in.rows == 0;
  SPARSECP_CHECK(empty || in.q != nullptr, "sparse attention q is null");
  SPARSECP_CHECK(empty || in.columns == 0 || in.indices != nullptr,
                 "sparse attention indices is null");
  for (int64_t r = 0; r < in.rows; ++r) {
    for (int64_t c = 0; c < in.columns; ++c) {
      const int32_t id = in.indices[r * in.columns + c];
      SPARSECP_CHECK(id >= -1 && id < in.keys, "sparse attention index ", id, " at row ", r,
                     ", column ", c, " is out of range [-1, ", in.keys, ") (kv has ", in.keys,
                     " rows)");
    }
  }
  SPARSECP_CHECK(in.keys == 0 || in.kv != nullptr, "sparse attention kv is null");
}

int64_t sparse_attention_block_rows(const SparseAttentionInputs& in,
                                    const SparseAttentionConfig& config) {
  check_gemm(in.dtype, in.heads, config.gemm);
  std::size_t budget = config.scratch_bytes, per_row = 0;
  if (use_direct(in, config)) {
    const std::size_t fixed = direct_fixed_bytes(in);
    budget = budget > fixed ? budget - fixed : 0;
    per_row = direct_block_row_bytes(in);
  } else {
    const auto [w, a] = element_sizes(in.dtype, use_onednn(in.dtype, config.gemm));
    per_row = row_bytes(in, w, a);
  }
  return static_cast<int64_t>(
      std::clamp<std::size_t>(budget / std::max<std::size_t>(per_row, 1), 1, 16));
}

std::size_t sparse_attention_scratch_bytes(const SparseAttentionInputs& in,
                                           const SparseAttentionConfig& config) {
  const auto rows = static_cast<std::size_t>(sparse_attention_block_rows(in, config));
  if (use_direct(in, config)) {
    return rows * direct_block_row_bytes(in) + direct_fixed_bytes(in);
  }
  const auto [w, a] = element_sizes(in.dtype, use_onednn(in.dtype, config.gemm));
  return rows * row_bytes(in, w, a);
}

void sparse_attention_forward(const SparseAttentionInputs& in, const SparseAttentionConfig& config,
                              void* out, void* lse) {
  validate_sparse_attention(in, config);
  if (in.rows == 0) return;
  const bool onednn = use_onednn(in.dtype, config.gemm);
  std::optional<BlasSingleThreaded> one_thread_blas;  // each worker's products on the worker
  if (!onednn && !use_direct(in, config)) one_thread_blas.emplace();
  dispatch(in, onednn, [&](auto types) {
    using K = Kernel<decltype(types)>;
    K(in, config, onednn)
        .forward(static_cast<typename K::T*>(out), static_cast<typename K::A*>(lse));
  });
}

void sparse_attention_backward(const SparseAttentionInputs& in, const SparseAttentionConfig& config,
                               const void* out, const void* lse, const void* grad_out, void* grad_q,
                               void* grad_kv, void* grad_sinks) {
  validate_sparse_attention(in, config);
  SPARSECP_CHECK(in.sinks == nullptr || grad_sinks != nullptr,
                 "sparse attention grad_sinks is null with sinks");
  const bool onednn = use_onednn(in.dtype, config.gemm);
  std::optional<BlasSingleThreaded> one_thread_blas;  // each worker's products on the worker
  if (!onednn && !use_direct(in, config)) one_thread_blas.emplace();
  dispatch(in, onednn, [&](auto types) {
    using K = Kernel<decltype(types)>;
    using A = typename K::A;
    if (in.rows == 0) {
      std::fill(static_cast<A*>(grad_kv), static_cast<A*>(grad_kv) + in.keys * in.qk_dim, A(0));
      if (grad_sinks != nullptr && in.sinks != nullptr) {
        std::fill(static_cast<A*>(grad_sinks), static_cast<A*>(grad_sinks) + in.heads, A(0));
      }
      return;
    }
    K(in, config, onednn)
        .backward(static_cast<const typename K::T*>(out), static_cast<const A*>(lse),
                  static_cast<const typename K::T*>(grad_out), static_cast<typename K::T*>(grad_q),
                  static_cast<A*>(grad_kv),
                  in.sinks != nullptr ? static_cast<A*>(grad_sinks) : nullptr);
  });
}

}  // namespace sparsecp
