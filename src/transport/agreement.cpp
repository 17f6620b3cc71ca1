#include "sparsecp/transport/agreement.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "sparsecp/error.hpp"

namespace sparsecp {
namespace {

// SplitMix64 finaliser as a hash step: order-sensitive, no collisions on small inputs.
uint64_t mix(uint64_t state, uint64_t value) {
  uint64_t z = state ^ (value + 0x9E3779B97F4A7C15ULL + (state << 6) + (state >> 2));
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

uint64_t mix_text(uint64_t state, std::string_view text) {
  state = mix(state, text.size());
  for (const char c : text) state = mix(state, static_cast<unsigned char>(c));
  return state;
}

// Layout of PlanningFingerprint::components().
enum Component : int {
  kValue,
  kDocuments,
  kTokens,
  kLengthsHash,
  kCp,
  kRatio,
  kMode,
  kBlockSize,
  kZigzagMinLength,
  kSettingCount,
  kSettingsHash,
  kNamesHash,
  kFirstSetting,
  kComponentCount = kFirstSetting + PlanningFingerprint::kMaxNamedSettings
};

std::string hex(int64_t value) {
  char text[24];
  std::snprintf(text, sizeof text, "%016llx",
                static_cast<unsigned long long>(static_cast<uint64_t>(value)));
  return text;
}

std::string optional_text(int64_t value) { return value < 0 ? "omitted" : std::to_string(value); }

// What differs between rank `a` and rank `b`, from their components. Setting names
// come from this rank's fingerprint when every rank used the same names.
std::string describe_difference(std::span<const int64_t> a, int64_t rank_a,
                                std::span<const int64_t> b, int64_t rank_b,
                                const PlanningFingerprint& mine, const std::string& documents) {
  const auto mode_text = [&](int64_t mode) -> std::string {
    const std::vector<std::string>& names = mine.strategy_names();
    if (mode >= 0 && mode < static_cast<int64_t>(names.size())) {
      std::string text(1, '\'');  // appended piecewise: GCC 12 -O3 warns (-Wrestrict) on "'" + s
      text.append(names[static_cast<size_t>(mode)]).push_back('\'');
      return text;
    }
    return mode < 0 ? std::string("none given") : std::to_string(mode);
  };
  std::vector<std::string> parts;
  const auto pair = [&](const std::string& what, const std::string& x, const std::string& y) {
    parts.push_back(what + ": rank " + std::to_string(rank_a) + " has " + x + ", rank " +
                    std::to_string(rank_b) + " has " + y);
  };
  if (a[kDocuments] != b[kDocuments] || a[kTokens] != b[kTokens] ||
      a[kLengthsHash] != b[kLengthsHash]) {
    const auto batch = [](std::span<const int64_t> c) {
      return std::to_string(c[kDocuments]) + " documents, " + std::to_string(c[kTokens]) +
             " tokens";
    };
    if (!documents.empty()) {
      parts.push_back(documents);
    } else {
      pair("document lengths differ", batch(a), batch(b));
    }
  }
  const auto scalar = [&](int component, const char* what, auto&& text) {
    if (a[component] != b[component]) pair(what, text(a[component]), text(b[component]));
  };
  const auto number = [](int64_t v) { return std::to_string(v); };
  scalar(kCp, "CP size differs", number);
  scalar(kRatio, "ratio differs", number);
  scalar(kMode, "mode differs", mode_text);
  scalar(kBlockSize, "block size differs", optional_text);
  scalar(kZigzagMinLength, "zigzag_min_length differs", optional_text);
  if (a[kSettingCount] != b[kSettingCount] || a[kNamesHash] != b[kNamesHash]) {
    pair("settings differ", std::to_string(a[kSettingCount]) + " settings",
         std::to_string(b[kSettingCount]) + " settings (different names)");
  } else {
    const std::vector<std::string>& names = mine.setting_names();
    const auto mine_components = mine.components();
    const bool named = mine_components[kNamesHash] == a[kNamesHash];
    const int64_t shown =
        std::min<int64_t>(a[kSettingCount], PlanningFingerprint::kMaxNamedSettings);
    for (int64_t i = 0; i < shown; ++i) {
      const int slot = kFirstSetting + static_cast<int>(i);
      if (a[slot] == b[slot]) continue;
      const std::string name = named && i < static_cast<int64_t>(names.size())
                                   ? names[static_cast<size_t>(i)]
                                   : "setting " + std::to_string(i);
      pair(name + " differs", std::to_string(a[slot]), std::to_string(b[slot]));
    }
    if (parts.empty() && a[kSettingsHash] != b[kSettingsHash]) {
      pair("settings differ", "settings hash " + hex(a[kSettingsHash]),
           "settings hash " + hex(b[kSettingsHash]));
    }
  }
  std::string text;
  for (const std::string& part : parts) text += (text.empty() ? "" : "; ") + part;
  return text;
}

// Collective (every rank calls it with the same `rank_a`, `rank_b` and counts): names
// the first document whose length differs between ranks a and b, e.g. "document
// lengths differ at document 2: rank 1 has 150, rank 0 has 100", or, when one list is
// a prefix of the other, the counts. Sums the two ranks' lengths into one buffer in
// chunks (every rank sees the same sums, so every rank stops at the same chunk).
std::string first_differing_document(Communicator& comm, const PlanningFingerprint& mine,
                                     int64_t rank_a, int64_t count_a, int64_t tokens_a,
                                     int64_t rank_b, int64_t count_b, int64_t tokens_b) {
  constexpr int64_t kChunk = 4096;
  const int64_t rank = comm.rank();
  const int64_t common = std::min(count_a, count_b);
  const std::vector<int64_t>& lengths = mine.lengths();
  const auto own = static_cast<int64_t>(lengths.size());
  std::vector<int64_t> both;
  for (int64_t begin = 0; begin < common; begin += kChunk) {
    const int64_t n = std::min(kChunk, common - begin);
    both.assign(static_cast<size_t>(2 * n), 0);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t d = begin + i;
      if (rank == rank_a && d < own) both[static_cast<size_t>(i)] = lengths[d];
      if (rank == rank_b && d < own) both[static_cast<size_t>(n + i)] = lengths[d];
    }
    comm.all_reduce(both, ReduceOp::kSum);
    for (int64_t i = 0; i < n; ++i) {
      if (both[static_cast<size_t>(i)] != both[static_cast<size_t>(n + i)]) {
        return "document lengths differ at document " + std::to_string(begin + i) + ": rank " +
               std::to_string(rank_a) + " has " + std::to_string(both[static_cast<size_t>(i)]) +
               ", rank " + std::to_string(rank_b) + " has " +
               std::to_string(both[static_cast<size_t>(n + i)]);
      }
    }
  }
  if (count_a != count_b) {
    return "document counts differ: rank " + std::to_string(rank_a) + " has " +
           std::to_string(count_a) + " documents (" + std::to_string(tokens_a) + " tokens), rank " +
           std::to_string(rank_b) + " has " + std::to_string(count_b) + " documents (" +
           std::to_string(tokens_b) + " tokens); the first " + std::to_string(common) + " agree";
  }
  return {};  // equal lists: the hashes differ for another reason (not reached)
}

}  // namespace

PlanningFingerprint dispatch_route_fingerprint(const SequenceDispatchRoute& route) {
  std::vector<int64_t> lengths;
  lengths.reserve(route.boundaries.empty() ? 0 : route.boundaries.size() - 1);
  for (size_t i = 1; i < route.boundaries.size(); ++i) {
    lengths.push_back(route.boundaries[i] - route.boundaries[i - 1]);
  }
  PlanningFingerprint fingerprint(lengths, route.size, route.ratio);
  fingerprint.add("route kind", static_cast<int64_t>(route.kind))
      .add("window", route.window)
      .add("raw local length", route.raw_local_length)
      .add("exchange needed", route.exchange_needed ? 1 : 0);
  for (size_t q = 0; q < route.interval_starts.size(); ++q) {
    fingerprint.add("interval start of rank " + std::to_string(q), route.interval_starts[q]);
  }
  return fingerprint;
}

PlanningFingerprint::PlanningFingerprint(std::span<const int64_t> lengths, int64_t cp,
                                         int64_t ratio)
    : lengths_(lengths.begin(), lengths.end()),
      documents_(static_cast<int64_t>(lengths.size())),
      cp_(cp),
      ratio_(ratio) {
  uint64_t tokens = 0;  // wrapping: only compared, never used as a size
  uint64_t hash = mix(0x5EED, lengths.size());
  for (const int64_t length : lengths) {
    tokens += static_cast<uint64_t>(length);
    hash = mix(hash, static_cast<uint64_t>(length));
  }
  tokens_ = static_cast<int64_t>(tokens);
  lengths_hash_ = hash;
}

PlanningFingerprint& PlanningFingerprint::set_strategy(int64_t index,
                                                       std::vector<std::string> names) {
  mode_ = index;
  strategy_names_ = std::move(names);
  return *this;
}

PlanningFingerprint& PlanningFingerprint::set_seed_options(
    std::optional<int64_t> block_size, std::optional<int64_t> zigzag_min_length) {
  block_size_ = block_size.value_or(-1);
  zigzag_min_length_ = zigzag_min_length.value_or(-1);
  return *this;
}

PlanningFingerprint& PlanningFingerprint::add_real(std::string_view name, double value) {
  const int64_t shown = std::isfinite(value) && std::fabs(value) < 9e12
                            ? static_cast<int64_t>(std::llround(value * 1e6))
                            : 0;
  add(std::string(name) + " (millionths)", shown);
  // The exact bits too, so that values closer than a millionth still differ.
  settings_hash_ = mix(settings_hash_, std::bit_cast<uint64_t>(value));
  return *this;
}

PlanningFingerprint& PlanningFingerprint::add(std::string_view name, int64_t value) {
  if (static_cast<int64_t>(names_.size()) < kMaxNamedSettings) {
    names_.emplace_back(name);
    settings_.push_back(value);
  }
  settings_hash_ = mix(mix_text(settings_hash_, name), static_cast<uint64_t>(value));
  ++setting_count_;
  return *this;
}

std::vector<int64_t> PlanningFingerprint::components() const {
  std::vector<int64_t> c(kComponentCount, 0);
  c[kDocuments] = documents_;
  c[kTokens] = tokens_;
  c[kLengthsHash] = static_cast<int64_t>(lengths_hash_);
  c[kCp] = cp_;
  c[kRatio] = ratio_;
  c[kMode] = mode_;
  c[kBlockSize] = block_size_;
  c[kZigzagMinLength] = zigzag_min_length_;
  c[kSettingCount] = setting_count_;
  c[kSettingsHash] = static_cast<int64_t>(settings_hash_);
  uint64_t names = 0x4E414D45;
  for (const std::string& name : names_) names = mix_text(names, name);
  c[kNamesHash] = static_cast<int64_t>(names);
  std::copy(settings_.begin(), settings_.end(), c.begin() + kFirstSetting);
  uint64_t value = 0xF1A9;
  for (int i = kDocuments; i < kComponentCount; ++i)
    value = mix(value, static_cast<uint64_t>(c[i]));
  c[kValue] = static_cast<int64_t>(value);
  return c;
}

uint64_t PlanningFingerprint::value() const { return static_cast<uint64_t>(components()[kValue]); }

void check_agreement(Communicator& comm, const PlanningFingerprint& fingerprint,
                     std::string_view context) {
  const std::vector<int64_t> mine = fingerprint.components();
  // min over ranks of v and of ~v (= ~max v): equal extremes <=> every rank agrees.
  int64_t extremes[2] = {mine[kValue], ~mine[kValue]};
  comm.all_reduce(extremes, ReduceOp::kMin);
  if (extremes[0] == ~extremes[1]) return;

  // Disagreement: every rank got here (same extremes everywhere). Gather every rank's
  // components as a sum of one-hot slots and let each rank build the same message.
  const int64_t size = comm.size();
  const int64_t rank = comm.rank();
  std::vector<int64_t> all(static_cast<size_t>(size * kComponentCount), 0);
  std::copy(mine.begin(), mine.end(), all.begin() + rank * kComponentCount);
  comm.all_reduce(all, ReduceOp::kSum);
  const auto of = [&](int64_t r) {
    return std::span<const int64_t>(all).subspan(static_cast<size_t>(r * kComponentCount),
                                                 kComponentCount);
  };
  int64_t first = -1;
  int64_t differing = 0;
  for (int64_t r = 1; r < size; ++r) {
    if (of(r)[kValue] != of(0)[kValue]) {
      if (first < 0) first = r;
      ++differing;
    }
  }
  std::ostringstream message;
  if (!context.empty()) message << context << ": ";
  if (first < 0) {  // cannot happen unless a rank's reduction was inconsistent
    message << "CP ranks disagree on the planning inputs (fingerprints range from "
            << hex(extremes[0]) << " to " << hex(~extremes[1]) << ")";
    SPARSECP_FAIL(message.str());
  }
  std::string documents;
  if (of(first)[kDocuments] != of(0)[kDocuments] || of(first)[kTokens] != of(0)[kTokens] ||
      of(first)[kLengthsHash] != of(0)[kLengthsHash]) {
    // Every rank sees the same components, so every rank takes this branch.
    documents = first_differing_document(comm, fingerprint, first, of(first)[kDocuments],
                                         of(first)[kTokens], 0, of(0)[kDocuments], of(0)[kTokens]);
  }
  message << "CP ranks disagree on the planning inputs: rank " << first << " has fingerprint "
          << hex(of(first)[kValue]) << ", rank 0 has " << hex(of(0)[kValue]) << " ("
          << describe_difference(of(first), first, of(0), 0, fingerprint, documents) << "); "
          << differing << " of " << size << " ranks differ from rank 0";
  SPARSECP_FAIL(message.str());
}

}  // namespace sparsecp
