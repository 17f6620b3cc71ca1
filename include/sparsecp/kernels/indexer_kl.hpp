// sparsecp: the Lightning Indexer's training loss — a sparse KL divergence between the
// main attention's distribution over each query's selected keys (the teacher, with an
// attention-sink logit) and the indexer's own scores (the student), forward and
// backward in one fused pass.
//
// Seed: hyper_parallel's `shared_compressed_indexer_kl_loss` (a torch.autograd.Function
// that computes the gradients in its forward), called by the compressed-attention layer
// on the original owner once the top-k ids are back (seed 000, "Fused KL" validation and
// the `main_key_offset` view of a compact bank). C++ names map to the seed's as
//   indexer_kl_loss          shared_compressed_indexer_kl_loss (forward + gradients)
//   IndexerKlInputs fields   its arguments, same names and order
//   IndexerKlOptions         attention_scale, loss_coeff, main_key_offset (+ threads, isa)
//
// Shapes (B batch, S query rows, H index heads x D index head dim, Hm attention heads x
// Dm attention head dim, K keys in the compressed bank, T = TopK slots per row):
//   index_query      q     [B, S, H, D]    fp32 or bf16
//   index_key        Kidx  [B, Ki, D]      fp32 or bf16; Ki >= main_key_offset + K
//   merge_weight     w     [B, S, H]       fp32 or bf16 (already scaled by the caller)
//   attention_query  qatt  [B, Hm, S, Dm]  fp32 or bf16, HEAD-MAJOR (as attention uses it)
//   compressed_key   Katt  [B, K, Dm]      fp32 or bf16 (the teacher's key bank)
//   topk_indices     ids   [B, S, T]       int32 or int64; -1 is padding
//   sinks                  [Hm]            fp32 or bf16 (the attention-sink logits)
// Every tensor is dense row-major (C order). Each may have its own float dtype.
//
// The math, per batch b and row t. S_t = the slots j of ids[b, t] with ids[b, t, j] != -1;
// slot j names compact-bank key s = ids[b, t, j] - main_key_offset, whose student key is
// Kidx[b, main_key_offset + s] and teacher key Katt[b, s]. A duplicated id is two slots.
//   Student   z[h, j] = q[b, t, h] . Kidx[b, off + s_j]
//             I[j]    = sum_h w[b, t, h] * ReLU(z[h, j]);  log_pred = log_softmax_{S_t}(I)
//   Teacher   for every attention head hm, the softmax over S_t plus one sink column of
//               [attention_scale * qatt[b, hm, t] . Katt[b, s_j] for j in S_t] + [sinks[hm]];
//             drop the sink column, sum over heads: P[j]; L1-normalise over S_t:
//               p[j] = P[j] / max(sum_{S_t} P, FLT_MIN).  The teacher is a constant.
//   Loss      row loss = sum_{j in S_t} p[j] * (log(max(p[j], FLT_MIN)) - log_pred[j]);
//             loss = loss_coeff / (B * S) * sum of row losses over rows with S_t != {}.
//             "tiny" in the seed's log(max(p, tiny)) is FLT_MIN (1.17549435e-38, the
//             smallest normal float32), the same clamp as the denominator: it only has to
//             keep 0 * log(0) out (p = 0 contributes exactly 0), and any p below it is
//             below float32's normal range, where p * log(p) < 1e-36 anyway.
//   Gradients (c = loss_coeff / (B * S); rows with S_t = {} get zeros)
//             g[j]            = (softmax_{S_t}(I)[j] - p[j]) * c
//             dz[h, j]        = g[j] * w[b, t, h] * [z[h, j] > 0]
//             grad_index_query[b, t, h]  = sum_j dz[h, j] * Kidx[b, off + s_j]
//             grad_merge_weight[b, t, h] = sum_j g[j] * ReLU(z[h, j])
//             grad_index_key[b, off + s] += sum_h dz[h, j] * q[b, t, h] for every slot j
//               naming s (a duplicated id adds twice); rows of index_key outside
//               [off, off + K) get zero gradient.
//   These are the seed's gradients of `loss` (computed in the forward pass; an autograd
//   backward scales them by the incoming gradient).
//   NaN and Inf. They are not checked for; they propagate as in the torch formulation:
//   ReLU(x) = x < 0 ? 0 : x (a NaN z passes, as torch.relu and clamp_min), dz is the
//   product g * w * [z > 0] (a NaN g or w stays NaN where the mask is 0), and the
//   gradient products are dense (an inactive slot adds 0 * Kidx and 0 * q, so an Inf
//   there gives NaN). Every ISA path, the reference and the torch path agree on which
//   outputs are NaN (tests/kernels/nan_propagation_test.cpp, python/tests/test_kl.py).
//
// Precision. The fast path computes every dot product and softmax in float32 (bf16
// inputs are widened exactly; where the CPU has AVX512_BF16 and both factors of a
// forward product are bf16, VDPBF16PS multiplies pairs exactly and accumulates in fp32),
// the per-slot log-softmax, teacher normalisation and loss terms in double, and
// accumulates the loss in double. Gradients are float32 (backward products always in
// fp32, never rounded to bf16). The `_reference` twin computes everything in double from
// the same (widened) input values; tests bound the difference.
//
// Validation (sparsecp::Error, kInvalidInput; the seed's texts where it has them):
//   * ids not [B, Q, TopK] with B, Q of index_query: "Fused KL indices must have shape
//     [B, Q, TopK] matching Indexer Q: topk_indices and index_query must share
//     batch/query dimensions (...)"  (both seed texts, then the shapes);
//   * unless K >= 1 and min(512, K) <= T <= 512: "Fused KL requires ordinary TopK512
//     selections, allowing padding for a compact bank; got K=<K>, TopK=<T>", with K the
//     compact bank's row count (compressed_key.shape[1], the seed's viewed index key);
//   * an id other than -1 outside [main_key_offset, main_key_offset + K) names the id,
//     its position [b, t, j] and the valid range;
//   * any other rank, extent, dtype or size mismatch (also of the gradient spans), a
//     negative main_key_offset, Ki < main_key_offset + K, a loss_coeff that is not
//     finite or an attention_scale that is not finite in float32, zero heads or head
//     dims, negative threads, an ISA the CPU lacks, or sizes whose byte counts overflow
//     64 bits.
//   Every check runs before any output is written. With loss_coeff == 0 the call
//   validates shapes and dtypes only, writes zero gradients and returns 0.0 without
//   computing (ids are not inspected). B * S == 0 returns 0.0 with zero gradients.
//
// Guarantees of the fast path (`indexer_kl_loss`):
//   * Determinism: the loss and every gradient bit are the same for any thread count
//     (and any OpenMP schedule). Rows are cut into fixed blocks of consecutive rows;
//     each block's key-gradient contributions and loss are computed by one thread in a
//     fixed order and committed in block order (a reorder buffer: a finished block
//     waits in its buffer until every earlier block is committed, and whichever thread
//     finishes the missing block commits the run). Results may differ between ISAs in
//     the last bits (different but fixed summation orders).
//   * Memory: no [B, S, ...] intermediate at all and nothing per row beyond one
//     thread's tile. Scratch is, per thread, the row's transposed queries ([D, H] and
//     [Dm, Hm]), its [T, Hm] and [T, H] logit tiles, and for bf16 its widened student
//     key rows [T, D]; plus 2 x threads commit buffers of kBlockRows (4) x T key-gradient
//     rows [D]: independent of B and S (`indexer_kl_scratch_bytes`; about 2.5 MiB a
//     thread at DeepSeek-V4 shapes). The selected keys are never copied for fp32 inputs
//     (kernels read them in place through row pointers); bf16 student keys are widened
//     once per row and serve both the forward and the backward product.
//   * Only the caller's gradient spans are written (they must not overlap the inputs);
//     index_key's gradient is zeroed first (it is an output, not accumulated into).
//
// Threads: `IndexerKlOptions::threads` (0 = OpenMP's default). No BLAS is called.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "sparsecp/kernels/isa.hpp"
#include "sparsecp/tensor.hpp"

namespace sparsecp {

// The seed's arguments, in its order. Shapes and dtypes: see the top of this file.
struct IndexerKlInputs {
  TensorView index_query;        // [B, S, H, D]
  TensorView index_key;          // [B, Ki, D], Ki >= main_key_offset + K
  TensorView merge_weight;       // [B, S, H]
  TensorView attention_query;    // [B, Hm, S, Dm] (head-major)
  TensorView compressed_key;     // [B, K, Dm]
  IndexTensorView topk_indices;  // [B, S, T], -1 padded, ids relative to index_key
  TensorView sinks;              // [Hm]
};

struct IndexerKlOptions {
  double attention_scale = 1.0;  // multiplies qatt . Katt in the teacher logits
  double loss_coeff = 1.0;       // the loss is loss_coeff / (B * S) * sum of row losses
  // Compact teacher bank (seed 000): compressed_key holds the bank's rows
  // [main_key_offset, main_key_offset + K) of index_key; ids are global index_key rows.
  int64_t main_key_offset = 0;
  int threads = 0;                   // 0 = OpenMP default. Never changes results.
  KernelIsa isa = KernelIsa::kAuto;  // kAuto: SPARSECP_ISA, else the best the CPU has
                                     // (select.hpp): AVX-512 > AVX2+FMA > portable.
  // The seed's TopK512 rule (min(512, K) <= TopK <= 512) is its API's check, not the kernel's:
  // true waives it for callers that select their own number of ids per row (a model's
  // index_topk), requiring only 1 <= TopK <= 512. Same math and error texts otherwise.
  bool any_topk = false;
};

// Where the gradients go: float32, each the size of its input (element counts
// B*S*H*D, B*Ki*D and B*S*H), same row-major layout.
struct IndexerKlGradients {
  std::span<float> index_query;
  std::span<float> index_key;
  std::span<float> merge_weight;
};

// Fused forward + backward: writes the three gradients and returns the loss.
// Seed: shared_compressed_indexer_kl_loss.
double indexer_kl_loss(const IndexerKlInputs& inputs, const IndexerKlOptions& options,
                       const IndexerKlGradients& gradients);

// Plain loops in double, same contract (ISA and threads ignored); the specification
// the fast path is tested against. Temporary memory: B*Ki*D doubles.
double indexer_kl_loss_reference(const IndexerKlInputs& inputs, const IndexerKlOptions& options,
                                 const IndexerKlGradients& gradients);

// Upper bound of the fast path's scratch memory in bytes for these shapes, dtypes and
// options (threads 0 = OpenMP default): independent of B and S. Validates like
// indexer_kl_loss except ids and gradient spans (data pointers are not read).
std::size_t indexer_kl_scratch_bytes(const IndexerKlInputs& inputs,
                                     const IndexerKlOptions& options);

// The counted FLOPs of a call: per valid (row, slot) pair, the teacher 2*Hm*Dm, the
// student forward 2*H*D and the two gradient products 2*2*H*D. 0 when loss_coeff == 0.
// Validates like indexer_kl_loss (ids included, gradient spans excluded).
double indexer_kl_flops(const IndexerKlInputs& inputs, const IndexerKlOptions& options);

}  // namespace sparsecp
