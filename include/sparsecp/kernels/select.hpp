// sparsecp: worker-side selection — Index-Q projection, RoPE and Lightning Indexer
// top-k over packed segments.
//
// A worker receives, for each of its `rows` query rows (worker order, see route.hpp):
//   qr      [rows, q_rank]          low-rank query residual
//   weights [rows, heads]           merge weights (already scaled by head_dim^-0.5 *
//                                   n_heads^-0.5, as the model does)
//   cos/sin [rows, rope_dim / 2]    the row's original RoPE factors
// plus the layer's Wq_b and the full compressed Index K bank [bank, head_dim], and the
// route's segments. It returns, per row, the `topk` selected bank key ids.
//
// Projection (seed `_project_worker_index_query` / `_project_index_query`):
//   q = RoPE(qr @ Wq_b), viewed as [rows, heads, head_dim]. RoPE rotates the trailing
//   `rope_dim` channels of every head in interleaved pairs, in fp32: for pair i,
//   channels (x0, x1) = (D - rope_dim + 2i, D - rope_dim + 2i + 1) become
//   (x0 * cos[i] - x1 * sin[i], x1 * cos[i] + x0 * sin[i]); earlier channels pass.
//   With bf16 qr/Wq_b the GEMM accumulates in fp32, its result is rounded to bf16 (a
//   bf16 Linear's output), RoPE runs in fp32 and its result is rounded to bf16 again
//   (the seed's `_apply_v41_rope` casting back); the values are returned as fp32.
//
// Scoring and top-k (seed "Packed Lightning Indexer", `_select_indices`):
//   I[t, s] = sum_h w[t, h] * ReLU(q[t, h, :] . k[s, :])   (ReLU(x) = x < 0 ? 0 : x:
//   a NaN dot product passes, as torch.relu; NaN and Inf inputs are not checked for)
//   over exactly the keys row t sees: the row at document position p of a segment
//   sees bank keys [key_begin, key_begin + floor((p + 1) / ratio)) (route.hpp).
//   Output per row: the `topk` best visible key ids — higher score first, equal scores
//   to the lower id, NaN above +inf (a total order, so ties are deterministic) —
//   sorted ascending and padded with -1. Rows that see no key, and rows covered by no
//   segment, are all -1.
//   Precision follows the key bank: with fp32 keys, q is used in fp32 (bf16 q is
//   widened); with bf16 keys, q is rounded to bf16 (round to nearest even; exact for
//   a bf16 projection) and each product is accumulated in fp32. Weights are fp32
//   (bf16 weights are widened).
//
// Guarantees:
//   * A row's result depends only on that row's inputs, its visible keys and the
//     kernel ISA (fixed per process unless forced): never on the thread count, on
//     which other rows share the call, or on where its keys fall in a tile. Every
//     (row, key) score is computed by the same instruction sequence wherever it is.
//   * The fast path never materialises [rows, heads, keys] or [rows, keys]: it works
//     in tiles of rows x keys, skips tiles no row sees, and keeps per-row top-k
//     state. Extra memory is bounded by threads x (key tile + score tile + top-k
//     state of a row block); see `select_scratch_bytes`.
//   * On small-integer inputs (every dot product exact in fp32) the fast and the
//     `_reference` functions return identical results, ties included.
//   * Invalid shapes, dtypes, segments or config throw sparsecp::Error naming the
//     value; the seed's texts are used where it has one.
//
// Layouts: every matrix is dense row-major (C order) with the shape given above; a
// MatrixView does not own its data. bf16 values are raw IEEE bfloat16 bits in
// uint16_t (the upper half of an fp32).
//
// bf16 keys on the avx512 ISA, in a build with oneDNN whose bf16 products run on AMX (or on a
// CPU without AVX512_BF16, where oneDNN has optimised ones): a row block's scores over a key
// tile come from one oneDNN product of fixed shape (rows and keys padded with zeros, so a
// row's scores never depend on its block or tile), then ReLU and the merge weights head by
// head in order. On AVX512_BF16 CPUs without AMX the kernel's own VDPBF16PS loops measured
// faster and are the default. SPARSECP_SELECT_GEMM=onednn or =native (read at each call)
// overrides; any other value is an error. Selections on exact inputs are the same on both
// paths; real-valued scores may differ in the last bits (different summation).
//
// Threads: `SelectConfig::threads` (0 = OpenMP's default). The projection's GEMM
// uses OpenBLAS, whose own thread count is OpenBLAS's setting.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "sparsecp/kernels/isa.hpp"
#include "sparsecp/segment.hpp"
#include "sparsecp/tensor.hpp"

namespace sparsecp {

// DType, MatrixView: tensor.hpp.

// Layout of Wq_b. kInOut: [q_rank, heads * head_dim] (qr @ Wq_b). kOutIn:
// [heads * head_dim, q_rank], i.e. PyTorch's `q_b_proj.weight` (qr @ Wq_b^T).
enum class WeightLayout { kInOut, kOutIn };

// KernelIsa and the ISA functions: isa.hpp.

// Shape and options of one selection call (DeepSeek-V4 indexer defaults).
struct SelectConfig {
  int64_t heads = 64;      // index heads
  int64_t head_dim = 128;  // D
  int64_t rope_dim = 64;   // trailing rotated channels per head; even, <= head_dim
  int64_t topk = 512;      // selected keys per row
  int64_t ratio = 4;       // compression ratio: one key per `ratio` raw tokens
  int threads = 0;         // worker threads; 0 = OpenMP default. Never changes results.
  KernelIsa isa = KernelIsa::kAuto;
};

// The most threads a selection call accepts. OpenMP gives up (libgomp: "Thread
// creation failed", or a segmentation fault) somewhere above ten thousand threads, so a
// typo in a thread count is an error instead.
inline constexpr int kMaxSelectThreads = 1024;

// Throws Error unless heads, head_dim, topk, ratio >= 1, 0 <= threads <=
// kMaxSelectThreads and config.isa resolves to an ISA this CPU runs
// (resolve_kernel_isa). (rope_dim is checked by the projection only: even and within
// [0, head_dim].)
void validate_select_config(const SelectConfig& config);

// A validated SelectConfig from its fields (validate_select_config's errors), the one place
// the CLI, the benches and the Python binding assemble one.
SelectConfig make_select_config(int64_t heads, int64_t head_dim, int64_t rope_dim, int64_t topk,
                                int64_t ratio = 4, int threads = 0,
                                KernelIsa isa = KernelIsa::kAuto);

// ---------------------------------------------------------------------------------
// Projection. Seed `_project_worker_index_query`.
//
// qr [rows, q_rank]; wq_b [q_rank, width] (kInOut) or [width, q_rank] (kOutIn), same
// dtype as qr; cos, sin [rows, rope_dim / 2] (fp32 or bf16, used in fp32).
// Writes q_out [rows, heads, head_dim] fp32 (q_out.size() == rows * width). The product goes
// through the linked BLAS; with config.threads resolving to 1 it stays on the calling thread
// (BlasSingleThreaded), as the RoPE pass does.
// Errors: "Indexer query width {w} is not divisible by head_dim {d}" (seed text);
// width / head_dim != config.heads; mismatched rows, q_rank, dtypes or sizes.
void project_index_query(MatrixView qr, MatrixView wq_b, MatrixView cos, MatrixView sin,
                         const SelectConfig& config, std::span<float> q_out,
                         WeightLayout layout = WeightLayout::kInOut);
// The layer's Wq_b prepared once for many projections (seed: the layer's `q_b_proj`
// weight, reused by every worker call of a step). bf16 weights are widened to fp32 here,
// once, instead of on every call (q_rank x width values: 12.6M for DeepSeek-V4); fp32
// weights are used in place, so the viewed data must outlive this object. The result of
// a projection is the same bit for bit as with the MatrixView overloads.
class ProjectionWeights {
 public:
  explicit ProjectionWeights(MatrixView wq_b, WeightLayout layout = WeightLayout::kInOut);
  // The weights as given (dtype and shape are what validation checks).
  MatrixView view() const { return original_; }
  WeightLayout layout() const { return layout_; }
  // The weights in fp32 (widened or the caller's), [q_rank, width] or [width, q_rank].
  const float* fp32_data() const;

 private:
  MatrixView original_;
  WeightLayout layout_;
  std::vector<float> widened_;  // bf16 weights widened once; empty for fp32
};

// The same projection with prepared weights.
void project_index_query(MatrixView qr, const ProjectionWeights& wq_b, MatrixView cos,
                         MatrixView sin, const SelectConfig& config, std::span<float> q_out);

// Plain loops, same contract; the specification the fast path is tested against.
void project_index_query_reference(MatrixView qr, MatrixView wq_b, MatrixView cos, MatrixView sin,
                                   const SelectConfig& config, std::span<float> q_out,
                                   WeightLayout layout = WeightLayout::kInOut);

// ---------------------------------------------------------------------------------
// Scoring + top-k. Seed `_select_indices` on packed segments (csa_tnd_plan).
//
// q [rows, heads * head_dim] (fp32 or bf16), weights [rows, heads], keys
// [bank, head_dim] (fp32 or bf16), segments as in route.hpp, addressing rows of q
// and keys of the bank. Writes out [rows, topk] int32 (out.size() == rows * topk).
// Errors: shape mismatches; segments outside [0, rows) x [0, bank], overlapping
// segments, residual outside [0, ratio), or more rows than document positions.
void select_topk(MatrixView q, MatrixView weights, MatrixView keys,
                 std::span<const Segment> segments, const SelectConfig& config,
                 std::span<int32_t> out);
void select_topk_reference(MatrixView q, MatrixView weights, MatrixView keys,
                           std::span<const Segment> segments, const SelectConfig& config,
                           std::span<int32_t> out);

// ---------------------------------------------------------------------------------
// Worker convenience: project_index_query then select_topk (the `select_tasks`
// closure of the seed's balanced path). qr and wq_b share a dtype; with bf16 the
// projected q is bf16-exact, so bf16 keys score it without further rounding.
// Index Q is projected and selected a chunk of rows at a time (about 16 MiB of fp32 q, at
// least four 32-row blocks per thread), so temporary memory is bounded by the thread count
// and config, not by rows; ids equal project_index_query then select_topk on all rows.
void select_worker_rows(MatrixView qr, MatrixView weights, MatrixView cos, MatrixView sin,
                        MatrixView wq_b, MatrixView keys, std::span<const Segment> segments,
                        const SelectConfig& config, std::span<int32_t> out,
                        WeightLayout layout = WeightLayout::kInOut);
// The same with prepared weights (no per-call conversion of Wq_b).
void select_worker_rows(MatrixView qr, MatrixView weights, MatrixView cos, MatrixView sin,
                        const ProjectionWeights& wq_b, MatrixView keys,
                        std::span<const Segment> segments, const SelectConfig& config,
                        std::span<int32_t> out);
void select_worker_rows_reference(MatrixView qr, MatrixView weights, MatrixView cos, MatrixView sin,
                                  MatrixView wq_b, MatrixView keys,
                                  std::span<const Segment> segments, const SelectConfig& config,
                                  std::span<int32_t> out,
                                  WeightLayout layout = WeightLayout::kInOut);

// What the fast path multiplies bf16 keys with under `isa` on this CPU: "onednn <version>"
// (oneDNN's matmul: a block's logits over a key tile as one product), "vdpbf16ps" (the avx512
// kernel's own bf16 dot products) or "widened" (bf16 widened to fp32 exactly), as chosen above
// and by SPARSECP_SELECT_GEMM. Throws like resolve_kernel_isa, and on a bad
// SPARSECP_SELECT_GEMM.
const char* select_bf16_products(KernelIsa isa = KernelIsa::kAuto);

// Upper bound of the fast path's scratch memory in bytes for `threads` threads
// (0 = OpenMP default) under `config`: threads x (packed key tile + q block + score
// tile + top-k candidates of one row block + the top-k's radix and bitmap buffers + the
// threshold test's survivors; on the oneDNN path also a tile's key rows, logits and
// reduced scores). Independent of rows and bank size.
std::size_t select_scratch_bytes(const SelectConfig& config, DType key_dtype, int threads = 0);

// Score FLOPs of a call: 2 * heads * head_dim per visible (row, key) pair. Throws like
// select_topk on invalid segments.
double select_score_flops(std::span<const Segment> segments, const SelectConfig& config);

}  // namespace sparsecp
