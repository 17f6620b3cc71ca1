// Private to the selection kernel: keeping a row's best candidates and writing them out in
// key order. A candidate is one 64-bit integer (select_internal.hpp: score order, then the
// lower key id), all distinct within a row, so "the k largest" is one exact set whatever
// order they arrive in; both steps below are exact, neither depends on that order.
//
// Why not std::nth_element and std::sort: at the DeepSeek-V4 indexer's shape (top-k 512 of
// 2,048 keys a row) the two took about 40% of a bf16 selection call on an AMX Xeon, more
// than the products. A radix partition reads each candidate about twice; the key-order
// write-out is a bitmap over the row's visible keys instead of a comparison sort.
#pragma once

#include <cstdint>
#include <vector>

namespace sparsecp::select_detail {

// Reused by every row a thread processes; bounded by kCandidateScratchBytes plus 8 bytes per
// candidate of a row's buffer (the ties), whatever the number of keys.
inline constexpr int64_t kCandidateScratchBytes = 256 * 4 + 4096;  // histogram + bitmap

struct CandidateScratch {
  std::vector<uint32_t> histogram;  // one radix digit's counts
  std::vector<uint64_t> ties;       // the candidates sharing the boundary digit
  std::vector<uint64_t> key_bits;   // a bitmap of selected keys, a window of keys at a time
};

// Moves the `keep` largest of values[0, count) to values[0, keep), in no particular order;
// values[keep, count) are left unspecified; with keep >= count every value is kept. Requires
// the values distinct. Returns the smallest kept value (0 when nothing is kept).
uint64_t keep_largest(uint64_t* values, int64_t count, int64_t keep, CandidateScratch& scratch);

// Writes the key ids of candidates[0, count) to out[0, count) in increasing order. Every
// id lies in [first_key, first_key + span) and appears once.
void write_keys_in_order(const uint64_t* candidates, int64_t count, int64_t first_key, int64_t span,
                         int32_t* out, CandidateScratch& scratch);

}  // namespace sparsecp::select_detail
