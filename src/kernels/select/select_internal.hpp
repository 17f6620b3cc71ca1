// Private to the selection component: shared validation, the total order of
// candidates, and the tile-kernel interface of the fast path.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>

#include "sparsecp/kernels/select.hpp"
#include "sparsecp/kernels/tnd_plan.hpp"

namespace sparsecp::select_detail {

// --- validation shared by the fast path and the reference -------------------------

// Checks config, shapes and segments of a select_topk call; returns the plan of
// rows that see a key (nullopt if none).
std::optional<TndPlan> validate_select(MatrixView q, MatrixView weights, MatrixView keys,
                                       std::span<const Segment> segments,
                                       const SelectConfig& config, std::span<int32_t> out);

// Checks a projection call; returns the projected width heads * head_dim.
int64_t validate_projection(MatrixView qr, MatrixView wq_b, MatrixView cos, MatrixView sin,
                            const SelectConfig& config, std::span<float> q_out,
                            WeightLayout layout);

// The same checks without an output buffer (select_worker_rows projects into its own).
int64_t validate_projection_inputs(MatrixView qr, MatrixView wq_b, MatrixView cos, MatrixView sin,
                                   const SelectConfig& config, WeightLayout layout);

// Rows [first, first + rows) of a view (within its rows).
inline MatrixView row_slice(MatrixView view, int64_t first, int64_t rows) {
  const std::size_t bytes = view.dtype == DType::kFloat32 ? 4 : 2;
  return {static_cast<const char*>(view.data) + static_cast<std::size_t>(first * view.cols) * bytes,
          view.dtype, rows, view.cols};
}

// Rows select_worker_rows projects and selects at a time: about 16 MiB of projected fp32
// Index Q, and at least four 32-row blocks per thread for the dynamic schedule.
int64_t projection_chunk_rows(const SelectConfig& config, int threads);

// Element (row, col) of a view, widened to fp32.
inline float element(MatrixView view, int64_t row, int64_t col) {
  const int64_t index = row * view.cols + col;
  if (view.dtype == DType::kFloat32) return static_cast<const float*>(view.data)[index];
  return std::bit_cast<float>(static_cast<uint32_t>(static_cast<const uint16_t*>(view.data)[index])
                              << 16);
}

// --- the order of candidates ---------------------------------------------------------

// Maps a score to an unsigned key with the same order; -0 == +0; every NaN above +inf.
inline uint32_t score_order(float score) {
  const uint32_t bits = std::bit_cast<uint32_t>(score + 0.0f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return 0xffffffffu;
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// A candidate as one integer: larger is better (higher score, then lower key id).
// Never 0, so 0 can mean "no threshold yet".
inline uint64_t candidate(float score, int64_t key) {
  return (static_cast<uint64_t>(score_order(score)) << 32) |
         (0xffffffffu - static_cast<uint32_t>(key));
}
inline int32_t candidate_key(uint64_t value) {
  return static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(value));
}

// Writes to out, in increasing order, the i < count with score_order(scores[i]) >= floor;
// returns how many. The cheap first test of a row's scores against its top-k threshold
// (whose score order is `floor`): most scores of a long row fail it.
int64_t scores_at_least_avx512(const float* scores, int64_t count, uint32_t floor, int32_t* out);

// out[i] = candidate(scores[i], key0 + i) for i < count (a row's buffer filling up).
void candidates_avx512(const float* scores, int64_t count, int64_t key0, uint64_t* out);

// --- tile kernels ------------------------------------------------------------------------
//
// Keys are packed per tile in panels of kPanelKeys keys. fp32 panel: [head_dim][16]
// floats. bf16 panel: [ceil(head_dim / 2)][16][2] bf16 (pairs of channels, the odd
// tail channel padded with 0). Keys past the tile's end are zero.
// A row's q is in natural [heads][head_dim] layout: fp32 floats, or for bf16 kernels
// [heads][ceil(head_dim / 2)] pairs (uint32: channel 2p in the low half, 2p+1 high).
// Kernels walk heads in chunks of `chunk_heads` (the register blocking).
// A kernel scores one row against `panels` panels: scores[panel * 16 + lane] =
//   sum_h weights[h] * ReLU(q[h] . key), accumulated head by head in order h = 0..H-1,
//   each dot product over channels in a fixed order. The instruction sequence for one
//   lane never depends on the panel's place in the tile or on `panels`.
inline constexpr int64_t kPanelKeys = 16;

struct ScoreRowArgs {
  const void* q_pack = nullptr;
  const float* weights = nullptr;
  const void* key_pack = nullptr;
  int64_t panels = 0;
  int64_t heads = 0;
  int64_t head_dim = 0;
  float* scores = nullptr;
};

using ScoreRowFn = void (*)(const ScoreRowArgs&);

struct TileKernel {
  ScoreRowFn score_row = nullptr;
  int64_t chunk_heads = 1;
  bool bf16 = false;  // packs are bf16 (dot products via AVX512_BF16)
};

// Implemented in kernel_*.cpp; each is compiled for its own ISA and must only be
// called when the CPU supports it.
void score_row_f32_portable(const ScoreRowArgs& args);
void score_row_f32_avx2(const ScoreRowArgs& args);
void score_row_f32_avx512(const ScoreRowArgs& args);
void score_row_bf16_avx512(const ScoreRowArgs& args);
// Transposes up to 16 rows x `cols` 32-bit elements (row stride `stride` elements,
// any alignment) into dst[c * 16 + row] (64-byte aligned), rows past `rows` as zero.
void pack_panel_u32_avx512(const void* src, int64_t stride, int64_t rows, int64_t cols,
                           uint32_t* dst);
inline constexpr int64_t kChunkHeadsPortable = 2;
inline constexpr int64_t kChunkHeadsAvx2 = 6;
inline constexpr int64_t kChunkHeadsAvx512 = 8;

// The oneDNN path for bf16 keys (select.cpp): one row block's scores over a tile,
// out[r * n + k] = sum_h weights[r * heads + h] * ReLU(logits[(r * heads + h) * n + k]),
// head by head in order h = 0..heads-1 (NaN kept: ReLU(NaN) is NaN), for r < rows.
struct ReduceHeadsArgs {
  const float* logits = nullptr;   // [rows * heads, n]
  const float* weights = nullptr;  // [rows, heads]
  int64_t rows = 0;
  int64_t heads = 0;
  int64_t n = 0;
  float* out = nullptr;  // [rows, n]
};
void reduce_heads_avx512(const ReduceHeadsArgs& args);

bool cpu_has_avx2();
bool cpu_has_avx512();
bool cpu_has_avx512_bf16();

}  // namespace sparsecp::select_detail
