// sparsecp: cross-rank agreement on the planning inputs.
//
// Every rank of a CP group plans independently from the same inputs (plan.hpp: pure,
// deterministic, no communication). If the ranks are handed *different* inputs — a
// data loader that diverged, a rank that read another step's document lengths, a
// launcher that passed one rank other flags — each rank builds a perfectly valid but
// different route, and the exchange that follows either deadlocks (the ranks issue
// different collectives or different row counts) or silently mixes up rows.
//
// A PlanningFingerprint summarises the inputs that must be identical on every rank:
// document lengths, CP size, ratio, the strategy and its parameters (block size, hybrid
// threshold, spill target, ...), plus any named settings the caller adds (tensor widths, topk,
// repeat counts: anything that decides the shape or number of the collectives that follow).
// check_agreement() compares it across the group *before* anything is exchanged:
//
//   * when all ranks agree it costs one allreduce of two 64-bit values (the minimum
//     and maximum of the fingerprint);
//   * when they do not, every rank (not just one) learns it: a second allreduce
//     gathers every rank's components, and every rank throws the same sparsecp::Error
//     naming a differing pair of ranks, both fingerprints and what differs, e.g.
//       CP ranks disagree on the planning inputs: rank 1 has fingerprint
//       0x3b5e..., rank 0 has 0x91c2... (document lengths differ at document 1:
//       rank 1 has 600, rank 0 has 500); 1 of 2 ranks differ from rank 0
//     (when the document lengths differ, further allreduces of the two ranks' lengths,
//     in chunks, find the first differing document; only on this error path).
//
// Both paths issue the same collectives on every rank, so the check itself can never
// hang: it is a collective like any other (every rank of the group must call it, in
// the same order relative to other collectives).
//
// Where it runs: `sparsecp run` checks before the first exchange (on by default,
// `--no-agreement-check` turns it off). The library's exchange entry points
// (exchange.hpp) always fold the same inputs into their own validity agreement, in
// every build type, so a mismatch there is an error on every rank too; when that
// agreement finds differing inputs, launch_indexer_inputs runs this check to name
// them (no extra collective while the ranks agree).
//
// Transport knows no strategies: it compares whatever the fingerprint holds. Building
// one from a strategy and its parameters is balanced_select.hpp's
// `planning_fingerprint`, one level above.
//
// Not in the seed: the Python module trusts its callers to pass identical inputs.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sparsecp/planning/dispatch.hpp"
#include "sparsecp/transport/comm.hpp"

namespace sparsecp {

// The inputs a CP group must agree on, reduced to a few 64-bit components.
// Equal inputs give equal fingerprints on every platform (no pointer or address
// enters it); different inputs give different fingerprints except with probability
// about 2^-64 per pair.
class PlanningFingerprint {
 public:
  // Settings compared value by value and named in a mismatch message (the first
  // kMaxNamedSettings added; any further ones still enter the fingerprint).
  static constexpr int kMaxNamedSettings = 64;

  // The batch every plan is made from: document lengths, CP size and ratio.
  PlanningFingerprint(std::span<const int64_t> lengths, int64_t cp, int64_t ratio);

  // The strategy: `index` into `names` (the registry's listing, used only to name the
  // strategies in a mismatch message; any index outside it is shown as a number).
  PlanningFingerprint& set_strategy(int64_t index, std::vector<std::string> names);
  // hyper_parallel's block size and hybrid threshold (unset: "omitted").
  PlanningFingerprint& set_seed_options(std::optional<int64_t> block_size,
                                        std::optional<int64_t> zigzag_min_length);

  // Adds a named value that must also agree (e.g. "topk", "qr width"). Names should be
  // short; they appear in the error message. Returns *this for chaining.
  PlanningFingerprint& add(std::string_view name, int64_t value);
  // A real-valued setting: shown as round(value * 1e6), compared by its exact bits.
  PlanningFingerprint& add_real(std::string_view name, double value);

  // The combined 64-bit fingerprint of everything above.
  uint64_t value() const;

  // Number of documents and total tokens (wrapping sum), for messages.
  int64_t documents() const { return documents_; }
  int64_t tokens() const { return tokens_; }

  // The components compared across ranks, in a fixed layout (see agreement.cpp);
  // components()[0] is value().
  std::vector<int64_t> components() const;
  // The names given to add(), in order (at most kMaxNamedSettings).
  const std::vector<std::string>& setting_names() const { return names_; }
  // The names set_strategy() was given (empty when it was not called).
  const std::vector<std::string>& strategy_names() const { return strategy_names_; }
  // The document lengths given to the constructor (to name the first differing one).
  const std::vector<int64_t>& lengths() const { return lengths_; }

 private:
  std::vector<int64_t> lengths_;
  int64_t documents_ = 0;
  int64_t tokens_ = 0;
  uint64_t lengths_hash_ = 0;
  int64_t cp_ = 0;
  int64_t ratio_ = 0;
  int64_t mode_ = -1;  // the strategy's index in strategy_names_; -1: not set
  std::vector<std::string> strategy_names_;
  int64_t block_size_ = -1;         // -1: omitted
  int64_t zigzag_min_length_ = -1;  // -1: omitted
  std::vector<std::string> names_;  // first kMaxNamedSettings names
  std::vector<int64_t> settings_;   // their values
  uint64_t settings_hash_ = 0;      // all names and values, in order
  int64_t setting_count_ = 0;
};

// Collective over `comm`: throws sparsecp::Error on every rank unless every rank
// passed an equal fingerprint (see the header comment for the message; a non-empty
// `context`, e.g. "Indexer input exchange", is put in front of it followed by ": ").
// Costs one 2-value allreduce when the ranks agree.
void check_agreement(Communicator& comm, const PlanningFingerprint& fingerprint,
                     std::string_view context = {});

// The defining inputs of a KV dispatch route (planning/dispatch.hpp): its kind, document
// lengths (from its boundaries; kIntervals: the owner extents), CP size, ratio, window,
// raw shard length, every rank's interval start (kIntervals) and whether an exchange is
// needed. Equal on every rank of a consistent group (nothing rank-specific enters it).
PlanningFingerprint dispatch_route_fingerprint(const SequenceDispatchRoute& route);

}  // namespace sparsecp
