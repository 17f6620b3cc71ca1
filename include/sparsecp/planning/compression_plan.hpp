// sparsecp: the document compression plan — which raw KV rows each CP rank needs to
// compute the compressed blocks it owns.
//
// A compressed layer turns every complete block of `ratio` raw tokens of a document into
// one compressed KV row; a document of n tokens yields floor(n / ratio) blocks (the tail
// n % ratio tokens yield none). The compressed bank is owned block by block by the rank
// holding the block's last raw token (compressed_owner_offsets in dispatch.hpp). When
// the raw shard length and every document boundary are multiples of the ratio, every
// block lies inside one rank and each rank compresses its own tokens: there is no plan.
// Otherwise a block can straddle a rank boundary; its owner then needs the block's
// leading raw tokens from lower ranks — a left halo of at most ratio - 1 rows, which
// can span several ranks when ratio > local.
//
// The plan is pure integer data, identical on every rank for the same inputs:
//   * `halo`: a SequenceDispatchRoute over the raw rows whose gathered block
//     [halo.global_start, halo.global_end) holds every raw token of every block this
//     rank owns (its interval starts at the first owned block's first token, or at the
//     rank's own first token when that is earlier or it owns no block);
//   * `runs`: the owned blocks, one run per document, saying which gathered raw rows
//     form which compressed row.
//
// Seed: `document_compression_plan(boundaries, ratio, local_length, size, rank)`, called
// by `SharedCompressedAttentionState` only when
// `not (ratio <= 1 or (local % ratio == 0 and all(boundary % ratio == 0)))`; the seed's
// body is not in the fragments, so the content above is this library's completion from
// SYSTEM.md ("the raw-token halo each rank needs so that a compressed block straddling a
// rank boundary can be computed by its owner").
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "sparsecp/planning/dispatch.hpp"

namespace sparsecp {

// Consecutive owned blocks of one document: compressed row key_begin + i is computed from
// the gathered raw rows [raw_begin + i * ratio, raw_begin + (i + 1) * ratio), for
// i in [0, count). raw_begin is a row of the gathered raw block (0 = halo.global_start).
struct CompressedRun {
  int64_t document = 0;   // document index
  int64_t raw_begin = 0;  // first raw row of the first block, in the gathered block
  int64_t key_begin = 0;  // global compressed row of the first block
  int64_t count = 0;      // blocks in this run (always > 0)

  friend constexpr bool operator==(const CompressedRun&, const CompressedRun&) = default;
};

struct DocumentCompressionPlan {
  int64_t ratio = 1;
  SequenceDispatchRoute halo;       // raw-row route; halo.exchange_needed agrees on every rank
  int64_t key_begin = 0;            // compressed rows this rank owns: [key_begin, key_end),
  int64_t key_end = 0;              //   equal to compressed_owner_offsets[rank], [rank + 1]
  std::vector<CompressedRun> runs;  // in increasing key order; counts sum to key_end - key_begin

  friend bool operator==(const DocumentCompressionPlan&, const DocumentCompressionPlan&) = default;
};

// True when no compressed block can straddle a rank boundary (seed condition: ratio <= 1,
// or the local length and every boundary are multiples of the ratio).
bool compression_aligned(std::span<const int64_t> boundaries, int64_t ratio, int64_t local_length);

// Seed `document_compression_plan`. Returns std::nullopt when compression_aligned(...)
// holds (ratio 0 — a sliding-window-only layer — and ratio 1 included); otherwise the plan
// of `rank`. Inputs are validated first, in every case:
//   "Document compression requires a non-negative ratio, positive dimensions and a valid
//    CP rank", "Document compression boundaries must span the full contiguous CP sequence".
std::optional<DocumentCompressionPlan> document_compression_plan(
    std::span<const int64_t> boundaries, int64_t ratio, int64_t local_length, int64_t size,
    int64_t rank);

}  // namespace sparsecp
