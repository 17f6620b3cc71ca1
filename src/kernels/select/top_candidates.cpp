// The row's best candidates (top_candidates.hpp): an MSD radix partition and a bitmap
// write-out in key order.
#include "top_candidates.hpp"

#include <algorithm>
#include <bit>
#include <functional>

#include "select_internal.hpp"

namespace sparsecp::select_detail {

namespace {

constexpr int kDigitBits = 8;
constexpr uint64_t kDigitMask = (uint64_t{1} << kDigitBits) - 1;
// Below this many candidates in play, a comparison select is cheaper than another digit.
constexpr int64_t kSmallSet = 48;
// Keys per pass of the key-order write-out: a 4 KiB bitmap.
constexpr int64_t kWindowKeys = 32768;
static_assert(kCandidateScratchBytes == (kDigitMask + 1) * 4 + kWindowKeys / 8,
              "CandidateScratch's documented bound");

}  // namespace

uint64_t keep_largest(uint64_t* values, int64_t count, int64_t keep, CandidateScratch& scratch) {
  if (keep <= 0 || count <= 0) return 0;
  if (keep < count) {
    // values[0, done) are known to be kept; values[done, end) are still in play, of which
    // `keep - done` are.
    int64_t done = 0;
    int64_t end = count;
    scratch.histogram.resize(kDigitMask + 1);
    while (keep > done && keep < end) {
      if (end - done <= kSmallSet) {
        std::nth_element(values + done, values + keep - 1, values + end, std::greater<>());
        break;
      }
      // The digit starts at the highest bit where the candidates in play differ: the
      // leading bits scores of one row share (sign, exponent) would separate nothing.
      uint64_t any = 0;
      uint64_t all = ~uint64_t{0};
      for (int64_t i = done; i < end; ++i) {
        any |= values[i];
        all &= values[i];
      }
      const int top = 63 - std::countl_zero(any ^ all);  // they differ: the values are distinct
      const int shift = std::max(0, top + 1 - kDigitBits);
      std::fill(scratch.histogram.begin(), scratch.histogram.end(), 0u);
      for (int64_t i = done; i < end; ++i) ++scratch.histogram[(values[i] >> shift) & kDigitMask];
      // The boundary digit: every candidate above it is kept, some of those on it are.
      const int64_t need = keep - done;
      int64_t above = 0;
      uint64_t boundary = kDigitMask;
      while (above + scratch.histogram[boundary] < need) above += scratch.histogram[boundary--];
      // Branch-free: the digits fall either way at random.
      if (scratch.ties.size() < static_cast<std::size_t>(end - done)) {
        scratch.ties.reserve(static_cast<std::size_t>(end - done));  // exactly: no doubling
        scratch.ties.resize(static_cast<std::size_t>(end - done));
      }
      uint64_t* ties = scratch.ties.data();
      int64_t kept = done;
      int64_t tied = 0;
      for (int64_t i = done; i < end; ++i) {  // writes never pass reads: kept <= i
        const uint64_t value = values[i];
        const uint64_t digit = (value >> shift) & kDigitMask;
        values[kept] = value;
        kept += static_cast<int64_t>(digit > boundary);
        ties[tied] = value;
        tied += static_cast<int64_t>(digit == boundary);
      }
      std::copy(ties, ties + tied, values + kept);
      done = kept;
      end = kept + tied;
    }
  }
  keep = std::min(keep, count);
  return *std::min_element(values, values + keep);
}

void write_keys_in_order(const uint64_t* candidates, int64_t count, int64_t first_key, int64_t span,
                         int32_t* out, CandidateScratch& scratch) {
  // The bitmap covers kWindowKeys keys at a time, so its size never grows with the bank.
  scratch.key_bits.resize(kWindowKeys / 64);
  int64_t written = 0;
  for (int64_t window = 0; window < span && written < count; window += kWindowKeys) {
    const int64_t keys = std::min(kWindowKeys, span - window);
    const int64_t words = (keys + 63) / 64;
    std::fill_n(scratch.key_bits.begin(), words, uint64_t{0});
    for (int64_t i = 0; i < count; ++i) {
      const int64_t bit = candidate_key(candidates[i]) - first_key - window;
      if (bit >= 0 && bit < keys) {
        scratch.key_bits[static_cast<std::size_t>(bit / 64)] |= uint64_t{1} << (bit % 64);
      }
    }
    for (int64_t w = 0; w < words; ++w) {
      for (uint64_t bits = scratch.key_bits[static_cast<std::size_t>(w)]; bits != 0;
           bits &= bits - 1) {
        out[written++] = static_cast<int32_t>(first_key + window + w * 64 + std::countr_zero(bits));
      }
    }
  }
}

}  // namespace sparsecp::select_detail
