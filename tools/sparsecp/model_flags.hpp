// sparsecp CLI: the model-shape options (--heads, --head-dim, --rope-dim, --q-rank,
// --topk), declared once and shared by `run`, `calibrate`, `select`, `bench select` and
// `simulate` (which sizes moved rows with them), and the overflow-checked buffer
// arithmetic every command that allocates from these sizes goes through.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "sparsecp/kernels/select.hpp"
#include "sparsecp/planning/row_bytes.hpp"

namespace sparsecp::cli {

struct ModelFlags {
  int64_t heads = 64;      // index heads
  int64_t head_dim = 128;  // index head dimension
  int64_t rope_dim = 64;   // rotated trailing channels per head
  int64_t q_rank = 1536;   // low-rank query residual width (q_lora_rank)
  int64_t topk = 512;      // selected keys per row

  // Which options a command declares (all by default).
  enum Field : unsigned { kHeads = 1, kHeadDim = 2, kRopeDim = 4, kQRank = 8, kTopk = 16 };
  static constexpr unsigned kAll = kHeads | kHeadDim | kRopeDim | kQRank | kTopk;

  // Declares the options in `fields` with the current values as defaults. `--heads` also
  // answers to `--index-heads` and `--q-rank` to `--qr-rank` and `--q-lora-rank` (hidden old
  // names).
  void add_to(CLI::App& command, unsigned fields = kAll);

  // Throws Error naming the first bad value: every size >= 1 (rope_dim >= 0, even and at
  // most head_dim), heads x head_dim within the kernels' limit.
  void validate() const;

  // The selection config of this shape (validated).
  SelectConfig select_config(int64_t ratio, int threads) const;

  // Bytes of one moved row under this shape with the given field dtypes (bf16 qr, fp32
  // weights and RoPE by default; int32 ids back).
  RowBytes row_bytes(int64_t qr_bytes = 2, int64_t weight_bytes = 4, int64_t rope_bytes = 4) const;

  // "16 index heads x head_dim 128 (rope 64), q_rank 256, top-k 512".
  std::string describe() const;
};

// Element and byte counts of the buffers a command is about to allocate, checked for
// 64-bit overflow as they are added and against the machine's physical memory before
// anything is allocated: a size product that overflows is an error naming `what`, never
// undefined behaviour, and a problem larger than memory fails at once instead of after
// minutes of paging.
class BufferBudget {
 public:
  explicit BufferBudget(std::string what) : what_(std::move(what)) {}

  // The product of `factors` (elements of one buffer); throws when it overflows.
  int64_t elements(std::initializer_list<int64_t> factors) const;
  // Adds a buffer of `elements(factors)` items of `item_bytes` each; returns its element
  // count.
  int64_t add(int64_t item_bytes, std::initializer_list<int64_t> factors);
  // Throws unless the bytes added so far fit in physical memory.
  void check_fits_memory() const;
  int64_t bytes() const { return bytes_; }

 private:
  std::string what_;
  int64_t bytes_ = 0;
};

}  // namespace sparsecp::cli
