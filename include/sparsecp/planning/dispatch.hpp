// sparsecp: KV dispatch routes — which key rows main attention needs from other CP ranks.
//
// Main attention keeps the original contiguous shards: rank r owns the raw tokens
// [r * local, (r + 1) * local) of the packed sequence. Its queries still need keys held
// by lower ranks:
//
//   * raw KV inside the sliding window (SWA): a left halo of up to `window - 1` rows
//     that never crosses the start of the document holding the rank's first token;
//   * compressed KV from the start of every document the rank touches (the main
//     attention of compressed layers sees its document's complete blocks).
//
// Public implementations all-gather the whole bank. A SequenceDispatchRoute moves only
// what is needed: every consumer q needs one contiguous interval [start_q, end_q) of the
// bank, where end_q is the end of q's own physical rows, and start_q is at or before
// their start. The interval arrives as ONE contiguous block in global order: rows from
// rank 0's part first, ..., then q's own rows last. `global_start` names where the
// block begins, so a row at global bank position g sits at block row g - global_start.
//
// A route is plain immutable data computed from the same inputs on every rank without
// communication. In particular `exchange_needed` is identical on every rank: it is true
// iff some rank's interval starts before its own rows, so all ranks skip the data
// exchange together or enter it together — provided they were given the same inputs,
// which the transport checks on every rank first (the route's defining inputs below).
//
// Physical layouts ("owner offsets"): the bank's rows are owned contiguously, rank r
// holding global rows [owner_offsets[r], owner_offsets[r + 1]). For raw KV the offsets
// are r * local. For the compressed bank a block is owned by the rank holding its last
// raw token (`compressed_owner_offsets`), so a rank's compressed extent can differ from
// its neighbours' and can be 0.
//
// Seed: `SequenceDispatchRoute`, `sliding_window_route`, `document_prefix_route`,
// `compressed_document_offsets`, `compressed_owner_offsets` (diff-coverage fragments of
// the attention module, seed 000). The fragments give the validation texts and the
// per-peer intervals; the send/receive layout below is this library's completion of them.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace sparsecp {

// Which builder made a route (its defining inputs differ per kind; see below).
enum class DispatchRouteKind : int64_t {
  kIntervals = 0,       // dispatch_route_from_intervals
  kSlidingWindow = 1,   // sliding_window_route
  kDocumentPrefix = 2,  // document_prefix_route
};

// Seed `SequenceDispatchRoute`: one rank's view of a KV dispatch.
//
// Sending: this rank sends to peer p its local rows
//   [send_begin[p], send_begin[p] + send_splits[p])   (local row indices)
// — one contiguous range per peer; ranges for different peers may overlap (the same
// row can be needed by several higher ranks). It never sends to itself, and only ever
// to higher ranks.
// Receiving: it receives receive_splits[p] rows from each lower peer p; concatenated in
// peer order they are exactly the block rows [0, local_start - global_start), so the
// receive buffer of a variable-split all-to-all can be the front of the output block.
// Its own local_length rows follow, completing [global_start, global_end).
struct SequenceDispatchRoute {
  int64_t size = 1;                  // CP group size
  int64_t rank = 0;                  // this rank inside the group
  int64_t global_start = 0;          // first global bank row of this rank's gathered block
  int64_t global_end = 0;            // one past its last row (the end of this rank's own rows)
  int64_t local_start = 0;           // global bank row of this rank's first physical row
  int64_t local_length = 0;          // physical rows this rank holds (checked by sequence_dispatch)
  std::vector<int64_t> send_begin;   // per peer: first local row sent (0 when none)
  std::vector<int64_t> send_splits;  // per peer: rows sent
  std::vector<int64_t> receive_splits;  // per peer: rows received
  bool exchange_needed = false;         // same value on every rank of the group

  // The route's defining inputs, identical on every rank of a consistent group. Ranks
  // handed different inputs build routes that do not fit together (rows sent where no
  // one expects them, halos never written), so every communicating entry point
  // (transport/sequence_gather.hpp) compares these across the group before data moves
  // (transport/agreement.hpp, dispatch_route_fingerprint). Not in the seed.
  DispatchRouteKind kind = DispatchRouteKind::kIntervals;
  std::vector<int64_t> boundaries;       // document boundaries (kIntervals: the owner offsets)
  std::vector<int64_t> interval_starts;  // kIntervals: every rank's interval start
  int64_t raw_local_length = 0;          // raw tokens per rank (kIntervals: 0)
  int64_t window = 0;                    // kSlidingWindow: the window (else 0)
  int64_t ratio = 0;                     // kDocumentPrefix: the ratio (else 0)

  // Rows of the gathered block: global_end - global_start.
  int64_t block_rows() const { return global_end - global_start; }
  // Rows received from other ranks: local_start - global_start.
  int64_t received_rows() const { return local_start - global_start; }
  // Rows sent to other ranks (with multiplicity).
  int64_t sent_rows() const;

  friend bool operator==(const SequenceDispatchRoute&, const SequenceDispatchRoute&) = default;
};

// The generic builder behind every route in this file (seed: the `intervals` tuple and
// the route construction that follows it). Rank q's consumer interval is
// [interval_starts[q], owner_offsets[q + 1]); owner_offsets has size + 1 entries, starts
// at 0 and never decreases; interval_starts has size entries with
// 0 <= interval_starts[q] <= owner_offsets[q]. Throws Error naming the bad value
// otherwise. Costs O(size).
SequenceDispatchRoute dispatch_route_from_intervals(std::span<const int64_t> interval_starts,
                                                    std::span<const int64_t> owner_offsets,
                                                    int64_t rank);

// Seed `sliding_window_route(boundaries, local_length, size, rank, window)`: the raw-KV
// halo of sliding-window attention. `boundaries` are the document boundaries of the
// packed sequence (0, cumulative lengths..., total), strictly increasing, ending at
// local_length * size. Peer q's interval is
//   [max(start of the document holding q's first token, q * local - window + 1),
//    (q + 1) * local)
// i.e. exactly the keys its rows see: a query at p sees [max(doc start, p - window + 1), p].
// Errors (seed texts): "SWA dispatch requires positive dimensions and a valid CP rank",
// "SWA document boundaries must span the full contiguous CP sequence".
SequenceDispatchRoute sliding_window_route(std::span<const int64_t> boundaries,
                                           int64_t local_length, int64_t size, int64_t rank,
                                           int64_t window);

// Seed `compressed_document_offsets(boundaries, ratio)`: compressed-bank offset of each
// document, plus the total. Document d holds floor(len_d / ratio) complete blocks, so
// entry d is sum_{j<d} floor(len_j / ratio); the result has boundaries.size() entries.
// Requires ratio >= 1 and strictly increasing boundaries starting at 0.
std::vector<int64_t> compressed_document_offsets(std::span<const int64_t> boundaries,
                                                 int64_t ratio);

// Seed `compressed_owner_offsets(boundaries, ratio, local_length)`: the compressed
// bank's physical layout. A block is owned by the rank holding its last raw token, so
// rank r owns compressed rows [owners[r], owners[r + 1]) where owners[r] counts the
// blocks that end before raw token r * local. Has size + 1 entries,
// size = boundaries.back() / local_length (which must divide evenly).
std::vector<int64_t> compressed_owner_offsets(std::span<const int64_t> boundaries, int64_t ratio,
                                              int64_t local_length);

// Seed `document_prefix_route(boundaries, local_length, size, rank, ratio)`, ratio 1 or 2:
// the compressed-KV route of main attention. The bank is laid out per
// compressed_owner_offsets; peer q's interval runs from the compressed offset of the
// document holding q's first raw token to the end of q's own blocks. A row at document
// position p of document d sees compressed rows [keys[d], keys[d] + floor((p + 1) / ratio)),
// all inside its rank's interval. `local_length` here is the raw shard length; the
// route's own `local_length` is the compressed extent the rank owns.
// Errors (seed texts): "Main KV dispatch requires a supported ratio and equal positive
// raw CP shards", "Main KV document boundaries must span the complete contiguous CP
// sequence".
SequenceDispatchRoute document_prefix_route(std::span<const int64_t> boundaries,
                                            int64_t local_length, int64_t size, int64_t rank,
                                            int64_t ratio);

// Document boundaries (0, cumulative lengths...) of positive document lengths.
// Throws Error for a non-positive length or a total that does not fit in 64 bits.
std::vector<int64_t> document_boundaries(std::span<const int64_t> lengths);

}  // namespace sparsecp
