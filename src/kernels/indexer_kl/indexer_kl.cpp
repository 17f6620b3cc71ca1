// Fused indexer KL loss: one pass over each row's selected ids computes the teacher,
// the student, the loss and the three gradients (indexer_kl.hpp has the math).
//
// Work decomposition: rows (b, t) in order are cut into blocks of kBlockRows; OpenMP
// threads take blocks in increasing order from a shared counter. Per row, the kernels
// read the selected key rows in place through row pointers (bf16 student keys are
// widened once into a per-thread tile), so nothing of size [rows, ...] is ever built.
// A row writes its own grad_index_query and grad_merge_weight rows directly. Its
// index-key contributions [slots, D] and its loss go to the block's commit buffer;
// buffers are applied to grad_index_key and the loss total strictly in block order
// (CommitQueue), which makes every bit independent of the thread count.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <vector>

#include "../select/select_internal.hpp"  // cpu_has_avx512_bf16
#include "indexer_kl_internal.hpp"
#include "sparsecp/error.hpp"

namespace sparsecp {
namespace kd = kl_detail;

namespace kl_detail {
namespace {
std::atomic<bool> emulate_pairs{false};
}  // namespace
void set_bf16_pair_emulation_for_testing(bool enabled) { emulate_pairs = enabled; }
}  // namespace kl_detail

namespace {

constexpr int64_t kBlockRows = 4;  // rows per work item and per commit buffer

kd::KlKernels resolve_kernels(KernelIsa requested) {
  const KernelIsa isa = resolve_kernel_isa(requested);  // SPARSECP_ISA for kAuto
#if defined(__x86_64__) || defined(_M_X64)
  if (isa == KernelIsa::kAvx2) {
    // No bf16 dot product instruction: bf16 is a storage format, widened exactly.
    return {kd::gemm_avx2,
            nullptr,
            kd::teacher_avx2,
            kd::scores_avx2,
            kd::student_backward_avx2,
            kd::transpose_portable};
  }
  if (isa == KernelIsa::kAvx512) {
    kd::KlKernels k{kd::gemm_avx512,
                    nullptr,
                    kd::teacher_avx512,
                    kd::scores_avx512,
                    kd::student_backward_avx512,
                    kd::transpose_avx512};
    if (select_detail::cpu_has_avx512_bf16()) {
      k.pair_gemm = kd::pair_gemm_avx512_bf16;
    } else if (kd::emulate_pairs) {
      k.pair_gemm = kd::pair_gemm_avx512_emulated;
    }
    return k;
  }
#endif
  return {kd::gemm_portable,
          nullptr,
          kd::teacher_portable,
          kd::scores_portable,
          kd::student_backward_portable,
          kd::transpose_portable};
}

int resolve_threads(int threads) {
  return threads > 0 ? threads : std::max(1, omp_get_max_threads());
}

int64_t round_up16(int64_t value) { return (value + 15) / 16 * 16; }

// What every row of a call shares.
struct Call {
  const IndexerKlInputs* in = nullptr;
  const IndexerKlGradients* out = nullptr;
  kd::KlShape s;
  kd::KlKernels kernels;
  float scale = 1.0f;
  double coeff = 0.0;  // loss_coeff / (B * S)
  bool pair_teacher = false;
  bool pair_student = false;
  std::vector<float> sinks;  // widened
};

// Element counts of one thread's scratch (RowScratch), from the shapes alone.
struct RowSizes {
  int64_t slots = 0, pointers = 0, b_rows = 0, floats = 0, bf16 = 0;

  explicit RowSizes(const Call& call) {
    const kd::KlShape& s = call.s;
    const IndexerKlInputs& in = *call.in;
    slots = s.topk;
    // key_rows, a_rows, pair_rows (pointer arrays)
    pointers = s.topk + std::max(s.topk, s.heads) + s.topk;
    b_rows = std::max({s.att_dim, s.head_dim, s.heads});
    floats = (call.pair_student ? 0 : s.head_dim * s.heads) +
             (call.pair_teacher ? 0 : s.att_dim * s.att_heads) + s.topk * s.att_heads +
             s.topk * s.heads + 3 * s.topk +
             (in.index_key.dtype == DType::kBFloat16 ? s.topk * s.head_dim : 0) +
             (in.index_query.dtype == DType::kBFloat16 ? s.heads * s.head_dim : 0) +
             (in.merge_weight.dtype == DType::kBFloat16 ? s.heads : 0) +
             (in.compressed_key.dtype == DType::kBFloat16 && !call.pair_teacher
                  ? kd::kGemmRowBlock * kd::kGemmDepthBlock
                  : 0);
    bf16 = (call.pair_student ? s.head_dim / 2 * round_up16(s.heads) * 2 : 0) +
           (call.pair_teacher ? s.att_dim / 2 * round_up16(s.att_heads) * 2 : 0);
  }
  int64_t bytes() const { return slots * 8 + pointers * 8 + b_rows * 8 + floats * 4 + bf16 * 2; }
};

// Per-thread scratch, sized once per call: independent of B and S.
struct RowScratch {
  std::vector<int64_t> slots;              // compact-bank key of each valid slot
  std::vector<const float*> key_rows;      // fp32 student key row of each slot
  std::vector<const void*> a_rows;         // GEMM A operand rows
  std::vector<const uint16_t*> pair_rows;  // pair GEMM A operand rows (bf16)
  std::vector<const float*> b_rows;        // GEMM B operand rows
  std::vector<float> query_t;              // q^T [D][H] (fp32 student)
  std::vector<uint16_t> query_pairs;       // q pairs [D/2][ldH][2] (bf16 pair student)
  std::vector<float> att_query_t;          // qatt^T [Dm][Hm]
  std::vector<uint16_t> att_pairs;         // qatt pairs [Dm/2][ldHm][2]
  std::vector<float> logits;               // teacher [T][Hm], then exp
  std::vector<float> z;                    // student [T][H], then dz
  std::vector<float> key_tile;             // widened bf16 student keys [T][D]
  std::vector<float> query_row;            // widened bf16 q row [H][D]
  std::vector<float> weights;              // widened bf16 merge weights [H]
  std::vector<float> a_buffer;             // bf16 A rows widened by the GEMM
  std::vector<float> teacher, score, g;    // [T]

  // Allocates exactly what RowSizes counts (indexer_kl_scratch_bytes reports it).
  explicit RowScratch(const Call& call) {
    const kd::KlShape& s = call.s;
    const IndexerKlInputs& in = *call.in;
    const auto n = [](int64_t v) { return static_cast<size_t>(v); };
    slots.resize(n(s.topk));
    key_rows.resize(n(s.topk));
    a_rows.resize(n(std::max(s.topk, s.heads)));
    pair_rows.resize(n(s.topk));
    b_rows.resize(n(std::max({s.att_dim, s.head_dim, s.heads})));
    if (call.pair_student) {
      query_pairs.assign(n(s.head_dim / 2 * round_up16(s.heads) * 2), 0);
    } else {
      query_t.resize(n(s.head_dim * s.heads));
    }
    if (call.pair_teacher) {
      att_pairs.assign(n(s.att_dim / 2 * round_up16(s.att_heads) * 2), 0);
    } else {
      att_query_t.resize(n(s.att_dim * s.att_heads));
    }
    logits.resize(n(s.topk * s.att_heads));
    z.resize(n(s.topk * s.heads));
    if (in.index_key.dtype == DType::kBFloat16) key_tile.resize(n(s.topk * s.head_dim));
    if (in.index_query.dtype == DType::kBFloat16) query_row.resize(n(s.heads * s.head_dim));
    if (in.merge_weight.dtype == DType::kBFloat16) weights.resize(n(s.heads));
    if (in.compressed_key.dtype == DType::kBFloat16 && !call.pair_teacher) {
      a_buffer.resize(n(kd::kGemmRowBlock * kd::kGemmDepthBlock));
    }
    teacher.resize(n(s.topk));
    score.resize(n(s.topk));
    g.resize(n(s.topk));
  }
};

// One block's index-key contributions and loss, waiting to be applied in order.
struct Commit {
  int64_t block = -1;
  int64_t count = 0;              // contribution rows used
  std::vector<int64_t> key_rows;  // grad_index_key row of each contribution
  // [count][D]; not zero-initialised (rows are written before they are read).
  std::unique_ptr<float[]> contributions;
  double loss = 0.0;  // sum of the block's row losses, rows in order
};

// Applies commits to grad_index_key and the loss total in block order, whichever
// thread finished them. Buffers are pooled: a thread takes one before taking a block,
// and waits only if every buffer holds a block still waiting for an earlier one.
class CommitQueue {
 public:
  CommitQueue(int64_t buffers, int64_t rows, int64_t dim, std::span<float> grad_key)
      : pool_(static_cast<size_t>(buffers)),
        ring_(static_cast<size_t>(buffers), nullptr),
        dim_(dim),
        grad_key_(grad_key) {
    for (auto& commit : pool_) {
      commit = std::make_unique<Commit>();
      commit->key_rows.resize(static_cast<size_t>(rows));
      commit->contributions.reset(new float[static_cast<size_t>(rows * dim)]);
      free_.push_back(commit.get());
    }
  }

  Commit* acquire() {
    std::unique_lock lock(mutex_);
    available_.wait(lock, [&] { return !free_.empty(); });
    Commit* commit = free_.back();
    free_.pop_back();
    return commit;
  }
  void release(Commit* commit) {
    std::lock_guard lock(mutex_);
    free_.push_back(commit);
    available_.notify_one();
  }

  // Hands over a finished block; if no thread is applying, applies every block that
  // is next in order. Blocks in flight span fewer than `buffers` indices (each holds a
  // buffer), so block % buffers never collides in the ring.
  void publish(Commit* commit) {
    std::unique_lock lock(mutex_);
    ring_[static_cast<size_t>(commit->block) % ring_.size()] = commit;
    if (applying_) return;
    applying_ = true;
    for (;;) {
      Commit*& slot = ring_[static_cast<size_t>(next_) % ring_.size()];
      if (slot == nullptr || slot->block != next_) break;
      Commit* ready = slot;
      slot = nullptr;
      lock.unlock();
      apply(*ready);
      lock.lock();
      free_.push_back(ready);
      ++next_;
      available_.notify_one();
    }
    applying_ = false;
  }

  double total() const { return total_; }

 private:
  void apply(const Commit& commit) {
    for (int64_t r = 0; r < commit.count; ++r) {
      float* dst = grad_key_.data() + commit.key_rows[static_cast<size_t>(r)] * dim_;
      const float* src = commit.contributions.get() + r * dim_;
      for (int64_t d = 0; d < dim_; ++d) dst[d] += src[d];
    }
    total_ += commit.loss;
  }

  std::vector<std::unique_ptr<Commit>> pool_;
  std::vector<Commit*> free_;
  std::vector<Commit*> ring_;
  int64_t next_ = 0;
  bool applying_ = false;
  double total_ = 0.0;
  int64_t dim_;
  std::span<float> grad_key_;
  std::mutex mutex_;
  std::condition_variable available_;
};

// Address of element `index` of a float view.
const void* element_address(const TensorView& view, int64_t index) {
  return static_cast<const char*>(view.data) + index * dtype_bytes(view.dtype);
}

// A forward product of one row: out[j][h] = key_j . query_h for the row's n selected
// keys and its `heads` query vectors (head h at `query` + h * stride elements, `dim`
// channels each): the teacher's logits (Katt x qatt^T) and the student's dot products
// (Kidx x q^T). The query is transposed into the GEMM's B; the keys are its A, read in
// place through x.a_rows (rows of key_dtype) or, with `pairs`, x.pair_rows (bf16).
struct ForwardProduct {
  const void* query = nullptr;
  DType query_dtype = DType::kFloat32;
  int64_t stride = 0, heads = 0, dim = 0;
  DType key_dtype = DType::kFloat32;
  bool pairs = false;
  float* transposed = nullptr;    // [dim][heads] when !pairs
  uint16_t* pair_pack = nullptr;  // [dim / 2][round_up16(heads)][2] when pairs
  float* out = nullptr;           // [n][heads]
};

void forward_product(const Call& call, const ForwardProduct& f, int64_t n, RowScratch& x) {
  kd::TransposeArgs pack;
  pack.src = f.query;
  pack.rows = f.heads;
  if (f.pairs) {  // bf16 pairs viewed as 32-bit elements
    pack.stride = f.stride / 2;
    pack.cols = f.dim / 2;
    pack.dst = f.pair_pack;
    pack.ld = round_up16(f.heads);
  } else {
    pack.widen_bf16 = f.query_dtype == DType::kBFloat16;
    pack.stride = f.stride;
    pack.cols = f.dim;
    pack.dst = f.transposed;
    pack.ld = f.heads;
  }
  call.kernels.transpose(pack);
  if (f.pairs) {
    kd::PairGemmArgs args;
    args.a = x.pair_rows.data();
    args.b = f.pair_pack;
    args.ldb = pack.ld;
    args.c = f.out;
    args.ldc = f.heads;
    args.m = n;
    args.n = f.heads;
    args.depth = f.dim;
    call.kernels.pair_gemm(args);
    return;
  }
  for (int64_t d = 0; d < f.dim; ++d) x.b_rows[d] = f.transposed + d * f.heads;
  kd::GemmArgs args;
  args.a = x.a_rows.data();
  args.a_dtype = f.key_dtype;
  args.b = x.b_rows.data();
  args.c = f.out;
  args.ldc = f.heads;
  args.m = n;
  args.n = f.heads;
  args.depth = f.dim;
  args.a_buffer = x.a_buffer.data();
  call.kernels.gemm(args);
}

// Teacher: P[j] (before L1 normalisation) of one row's n slots, into x.teacher.
void teacher_row(const Call& call, int64_t b, int64_t t, int64_t n, RowScratch& x) {
  const kd::KlShape& s = call.s;
  const IndexerKlInputs& in = *call.in;
  const int64_t Hm = s.att_heads, Dm = s.att_dim;
  for (int64_t j = 0; j < n; ++j) {
    const void* key = element_address(in.compressed_key, (b * s.keys + x.slots[j]) * Dm);
    x.a_rows[j] = key;
    x.pair_rows[j] = static_cast<const uint16_t*>(key);  // used when call.pair_teacher
  }
  ForwardProduct f;
  f.query = element_address(in.attention_query, (b * Hm * s.rows + t) * Dm);  // head 0, row t
  f.query_dtype = in.attention_query.dtype;
  f.stride = s.rows * Dm;  // head-major: the next head's row t
  f.heads = Hm;
  f.dim = Dm;
  f.key_dtype = in.compressed_key.dtype;
  f.pairs = call.pair_teacher;
  f.transposed = x.att_query_t.data();
  f.pair_pack = x.att_pairs.data();
  f.out = x.logits.data();
  forward_product(call, f, n, x);

  kd::TeacherArgs args;
  args.logits = x.logits.data();
  args.ldl = Hm;
  args.slots = n;
  args.heads = Hm;
  args.scale = call.scale;
  args.sinks = call.sinks.data();
  args.probabilities = x.teacher.data();
  call.kernels.teacher(args);
}

// Student forward: z [n][H] and the scores I[j] into x.score. Sets x.key_rows (fp32
// student key rows, widened into x.key_tile for bf16) for the backward products.
void student_row(const Call& call, int64_t b, int64_t row, int64_t n, const float* weights,
                 RowScratch& x) {
  const kd::KlShape& s = call.s;
  const IndexerKlInputs& in = *call.in;
  const int64_t H = s.heads, D = s.head_dim;
  const int64_t key_base = b * s.index_keys + s.offset;
  if (in.index_key.dtype == DType::kFloat32) {
    const auto* keys = static_cast<const float*>(in.index_key.data);
    for (int64_t j = 0; j < n; ++j) x.key_rows[j] = keys + (key_base + x.slots[j]) * D;
  } else {
    const auto* keys = static_cast<const uint16_t*>(in.index_key.data);
    for (int64_t j = 0; j < n; ++j) {
      const uint16_t* src = keys + (key_base + x.slots[j]) * D;
      float* dst = x.key_tile.data() + j * D;
      for (int64_t d = 0; d < D; ++d) dst[d] = std::bit_cast<float>(uint32_t{src[d]} << 16);
      x.key_rows[j] = dst;
      x.pair_rows[j] = src;  // used when call.pair_student
    }
  }
  for (int64_t j = 0; j < n; ++j) x.a_rows[j] = x.key_rows[j];
  ForwardProduct f;
  f.query = element_address(in.index_query, row * H * D);
  f.query_dtype = in.index_query.dtype;
  f.stride = D;
  f.heads = H;
  f.dim = D;
  f.pairs = call.pair_student;
  f.transposed = x.query_t.data();
  f.pair_pack = x.query_pairs.data();
  f.out = x.z.data();
  forward_product(call, f, n, x);

  kd::ScoreArgs args;
  args.z = x.z.data();
  args.ldz = H;
  args.slots = n;
  args.heads = H;
  args.weights = weights;
  args.scores = x.score.data();
  call.kernels.scores(args);
}

// The row's softmax against the teacher's distribution in double: returns the unscaled
// row loss and leaves each slot's loss gradient (scaled by coeff) in x.g.
double row_loss(const Call& call, int64_t n, RowScratch& x) {
  double mass = 0.0;
  for (int64_t j = 0; j < n; ++j) mass += x.teacher[j];
  const double denominator = std::max(mass, static_cast<double>(FLT_MIN));
  double top = x.score[0];
  for (int64_t j = 1; j < n; ++j) top = std::max(top, static_cast<double>(x.score[j]));
  double sum = 0.0;
  for (int64_t j = 0; j < n; ++j) sum += std::exp(static_cast<double>(x.score[j]) - top);
  const double log_sum = top + std::log(sum);
  double loss = 0.0;
  for (int64_t j = 0; j < n; ++j) {
    const double p = x.teacher[j] / denominator;
    const double log_pred = x.score[j] - log_sum;
    loss += p * (std::log(std::max(p, static_cast<double>(FLT_MIN))) - log_pred);
    x.g[j] = static_cast<float>((std::exp(log_pred) - p) * call.coeff);
  }
  return loss;
}

// The row's index query in fp32 (the caller's, or bf16 widened into x.query_row).
const float* query_row(const IndexerKlInputs& in, int64_t row, int64_t width, RowScratch& x) {
  if (in.index_query.dtype == DType::kFloat32) {
    return static_cast<const float*>(in.index_query.data) + row * width;
  }
  const auto* bits = static_cast<const uint16_t*>(in.index_query.data) + row * width;
  for (int64_t i = 0; i < width; ++i)
    x.query_row[i] = std::bit_cast<float>(uint32_t{bits[i]} << 16);
  return x.query_row.data();
}

// Backward of one row: dw and dz (in place of z), then dq = dz^T Kidx and the key
// contributions dz q (appended to `commit`), each a row-pointer GEMM.
void row_backward(const Call& call, int64_t row, int64_t n, const float* weights, float* dq,
                  float* dw, RowScratch& x, Commit& commit) {
  const kd::KlShape& s = call.s;
  const int64_t H = s.heads, D = s.head_dim;
  kd::StudentBackwardArgs backward;
  backward.z = x.z.data();
  backward.ldz = H;
  backward.slots = n;
  backward.heads = H;
  backward.weights = weights;
  backward.g = x.g.data();
  backward.dw = dw;
  call.kernels.student_backward(backward);

  for (int64_t h = 0; h < H; ++h) x.a_rows[h] = x.z.data() + h;
  kd::GemmArgs dq_args;
  dq_args.a = x.a_rows.data();
  dq_args.a_step = H;
  dq_args.b = x.key_rows.data();
  dq_args.c = dq;
  dq_args.ldc = D;
  dq_args.m = H;
  dq_args.n = D;
  dq_args.depth = n;
  call.kernels.gemm(dq_args);

  const float* q = query_row(*call.in, row, H * D, x);
  for (int64_t j = 0; j < n; ++j) x.a_rows[j] = x.z.data() + j * H;
  for (int64_t h = 0; h < H; ++h) x.b_rows[h] = q + h * D;
  kd::GemmArgs dk_args;
  dk_args.a = x.a_rows.data();
  dk_args.b = x.b_rows.data();
  dk_args.c = commit.contributions.get() + commit.count * D;
  dk_args.ldc = D;
  dk_args.m = n;
  dk_args.n = D;
  dk_args.depth = H;
  call.kernels.gemm(dk_args);
  const int64_t key_base = row / s.rows * s.index_keys + s.offset;
  for (int64_t j = 0; j < n; ++j) commit.key_rows[commit.count + j] = key_base + x.slots[j];
  commit.count += n;
}

// One row: loss (unscaled row loss, returned) and gradients; key contributions appended
// to `commit`.
double process_row(const Call& call, int64_t row, RowScratch& x, Commit& commit) {
  const kd::KlShape& s = call.s;
  const IndexerKlInputs& in = *call.in;
  const int64_t H = s.heads, D = s.head_dim, T = s.topk;
  const int64_t b = row / s.rows, t = row % s.rows;
  float* dq = call.out->index_query.data() + row * H * D;
  float* dw = call.out->merge_weight.data() + row * H;
  int64_t n = 0;
  for (int64_t j = 0; j < T; ++j) {
    const int64_t id = in.topk_indices.at(row * T + j);
    if (id != -1) x.slots[n++] = id - s.offset;
  }
  if (n == 0) {
    std::fill(dq, dq + H * D, 0.0f);
    std::fill(dw, dw + H, 0.0f);
    return 0.0;
  }
  const float* weights = nullptr;
  if (in.merge_weight.dtype == DType::kFloat32) {
    weights = static_cast<const float*>(in.merge_weight.data) + row * H;
  } else {
    for (int64_t h = 0; h < H; ++h) x.weights[h] = kd::element(in.merge_weight, row * H + h);
    weights = x.weights.data();
  }

  teacher_row(call, b, t, n, x);
  student_row(call, b, row, n, weights, x);
  const double loss = row_loss(call, n, x);
  row_backward(call, row, n, weights, dq, dw, x, commit);
  return loss;
}

Call make_call(const IndexerKlInputs& in, const IndexerKlOptions& options, const kd::KlShape& s,
               const IndexerKlGradients* out) {
  Call call;
  call.in = &in;
  call.out = out;
  call.s = s;
  call.kernels = resolve_kernels(options.isa);
  call.scale = static_cast<float>(options.attention_scale);
  call.coeff =
      s.batch * s.rows == 0 ? 0.0 : options.loss_coeff / static_cast<double>(s.batch * s.rows);
  const bool pairs = call.kernels.pair_gemm != nullptr;
  call.pair_teacher = pairs && in.attention_query.dtype == DType::kBFloat16 &&
                      in.compressed_key.dtype == DType::kBFloat16 && s.att_dim % 2 == 0;
  call.pair_student = pairs && in.index_query.dtype == DType::kBFloat16 &&
                      in.index_key.dtype == DType::kBFloat16 && s.head_dim % 2 == 0;
  call.sinks.resize(static_cast<size_t>(s.att_heads));
  for (int64_t hm = 0; hm < s.att_heads; ++hm) call.sinks[hm] = kd::element(in.sinks, hm);
  return call;
}

int64_t commit_buffers(int threads) { return 2 * static_cast<int64_t>(threads); }

}  // namespace

double indexer_kl_loss(const IndexerKlInputs& in, const IndexerKlOptions& options,
                       const IndexerKlGradients& out) {
  const bool compute = options.loss_coeff != 0.0;
  const kd::KlShape s = kd::validate_indexer_kl(in, options, &out, compute);
  const int64_t rows = s.batch * s.rows;
  int threads = resolve_threads(options.threads);
  const int64_t blocks = (rows + kBlockRows - 1) / kBlockRows;
  threads = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, blocks)));
  const auto zero = [&](std::span<float> span) {
    const auto size = static_cast<int64_t>(span.size());
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < size; ++i) span[static_cast<size_t>(i)] = 0.0f;
  };
  zero(out.index_key);
  if (!compute || rows == 0) {
    zero(out.index_query);
    zero(out.merge_weight);
    return 0.0;
  }

  const Call call = make_call(in, options, s, &out);
  std::vector<std::unique_ptr<RowScratch>> scratch;
  for (int i = 0; i < threads; ++i) scratch.push_back(std::make_unique<RowScratch>(call));
  CommitQueue queue(commit_buffers(threads), kBlockRows * s.topk, s.head_dim, out.index_key);
  std::atomic<int64_t> next_block{0};
#pragma omp parallel num_threads(threads)
  {
    RowScratch& x = *scratch[static_cast<size_t>(omp_get_thread_num())];
    for (;;) {
      Commit* commit = queue.acquire();
      const int64_t block = next_block.fetch_add(1);
      if (block >= blocks) {
        queue.release(commit);
        break;
      }
      commit->block = block;
      commit->count = 0;
      commit->loss = 0.0;
      const int64_t end = std::min(rows, (block + 1) * kBlockRows);
      for (int64_t row = block * kBlockRows; row < end; ++row) {
        commit->loss += process_row(call, row, x, *commit);
      }
      queue.publish(commit);
    }
  }
  return queue.total() * call.coeff;
}

std::size_t indexer_kl_scratch_bytes(const IndexerKlInputs& in, const IndexerKlOptions& options) {
  const kd::KlShape s = kd::validate_indexer_kl(in, options, nullptr, false);
  const IndexerKlGradients none;
  const Call call = make_call(in, options, s, &none);
  const int64_t threads = resolve_threads(options.threads);
  const int64_t commit = kBlockRows * s.topk * (8 + 4 * s.head_dim);
  return static_cast<std::size_t>(threads * RowSizes(call).bytes() +
                                  commit_buffers(static_cast<int>(threads)) * commit +
                                  4 * s.att_heads);
}

double indexer_kl_flops(const IndexerKlInputs& in, const IndexerKlOptions& options) {
  const kd::KlShape s = kd::validate_indexer_kl(in, options, nullptr, true);
  if (options.loss_coeff == 0.0) return 0.0;
  int64_t pairs = 0;
  const int64_t count = s.batch * s.rows * s.topk;
  for (int64_t i = 0; i < count; ++i) pairs += in.topk_indices.at(i) != -1;
  const double per_pair = 2.0 * static_cast<double>(s.att_heads * s.att_dim) +
                          6.0 * static_cast<double>(s.heads * s.head_dim);
  return static_cast<double>(pairs) * per_pair;
}

}  // namespace sparsecp
