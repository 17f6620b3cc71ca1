// sparsecp: a per-row cost model of Lightning Indexer selection, beyond raw pairs.
//
// The seed balances causal (query, key) pairs (cost.hpp): a row at document position
// p costs vis = floor((p + 1) / ratio). What a worker really spends per row is
//
//     cost(vis) = a + b * width(vis) + c * min(topk, vis) + d * heap(vis)
//     width(vis) = roundup(min(vis, candidates), quantum)
//     heap(vis)  = topk * ln(max(min(vis, candidates), topk) / topk)
//
//   a  the row's fixed work: Index-Q projection (qr @ Wq_b, RoPE), weights, the
//      row's top-k output;
//   b  scoring one visible key (heads x head_dim multiply-adds, ReLU, weighting);
//   c  top-k upkeep per candidate while the running top-k is not yet full (a row that
//      sees fewer than topk keys keeps every one of them).
//   d  one admission into a full running top-k (named "heap" below, after the classic
//      structure). A key enters when it is among the best topk of the keys scored so
//      far: the i-th key with probability topk / i for scores in random order, so a row
//      scoring n > topk keys admits about topk * ln(n / topk) of them (sum of topk / i
//      over i in (topk, n]). A heap pays a sift-down per admission; sparsecp's CPU kernel
//      (kernels/select/select.cpp) appends each key that beats the row's threshold to a
//      buffer and, when the buffer is full, keeps its best topk with nth_element and
//      raises the threshold: a write plus a share of a compaction per admission, tens of
//      nanoseconds. Without this term a linear model under-prices the rows that see a
//      few thousand keys against those that see tens of thousands (sparsecp's CPU kernel,
//      one set of timings over 0..16K visible keys: 13.9% rms residual without it, 4.1%
//      with it; docs/RESULTS.md).
//
// Two settings shape the key term; they describe the kernel, they are not fitted
// (fit_cost_model copies them from its options into the model):
//   candidates  C: layers that score a fixed candidate set (DeepSeek-V4.1's later indexer
//               layers score 16K positions) spend at most C keys per row; 0 = no cap.
//   quantum     Q: fused GPU kernels round a row's score width up to a multiple of Q
//               (8192 in Megatron-LM's fused path); 1 = exact widths.
// The defaults (no cap, quantum 1) give exactly the model without these terms; d = 0 (the
// default, and what a model file without a `d` line means) is the three-term model.
//
// `sparsecp calibrate` fits a, b, c, d (nanoseconds) from timed selection runs on the
// machine at hand and saves them with `save_cost_model` (io/cost_model_file.hpp); planners
// that accept a model (spill, auto, simulate's new modes) take it as a value. The default
// model, a = 0, b = 1, c = 0, is exactly the seed's causal pair count: the seed's
// modes always use it, so their plans keep bit-exact parity.
//
// Every coefficient is finite and non-negative, so the cost never decreases along a
// document: a document's heaviest rows are its last ones (the planners rely on it).
//
// File format (text, one `key value` per line, '#' starts a comment, any order):
//     # sparsecp cost model
//     a 61.5
//     b 0.0412
//     c 0.0031
//     d 44.2
//     topk 512
//     unit ns
//     candidates 16384
//     quantum 1
//     note heads 64 head_dim 128 q_rank 1536, AMD EPYC, 2026-11-30
// a, b, c and topk are required; `d` (default 0), `candidates` (default 0, no cap), `quantum`
// (default 1), `unit` (default "pairs") and `note` are free text for reports. Unknown keys and
// malformed numbers are errors naming the line.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace sparsecp {

// Largest width quantum a model accepts (keeps every closed-form sum in 64 bits).
inline constexpr int64_t kMaxCostModelQuantum = int64_t{1} << 24;
// The largest coefficient (and spill owner load) accepted: times the most rows, keys or
// admissions a batch can hold (below 2^64 each), summed over every task, it stays far from
// the largest double, so no plan's cost can become inf or NaN. 1e200 ns a pair is no
// selector's cost; a file with 1e308 is a typo or an attack.
inline constexpr double kMaxCostModelCoefficient = 1e200;

struct CostModel {
  double a = 0;  // per selected row
  double b = 1;  // per visible key
  double c = 0;  // per min(topk, visible keys)
  double d = 0;  // per expected admission into the full running top-k, heap(visible)
  int64_t topk = 512;
  int64_t candidates = 0;      // C: most keys a row scores (0 = no cap)
  int64_t quantum = 1;         // Q: key widths round up to a multiple of this
  std::string unit = "pairs";  // what one cost unit is ("pairs" or "ns")
  std::string note;            // where the figures come from (one line)

  // A model from its three coefficients (units stay "pairs" unless set afterwards).
  static CostModel linear(double a, double b, double c, int64_t topk) {
    CostModel model;
    model.a = a;
    model.b = b;
    model.c = c;
    model.topk = topk;
    return model;
  }

  // The seed's causal pair count (a = 0, b = 1, c = 0, d = 0, no cap, quantum 1).
  bool is_causal() const { return a == 0 && b == 1 && c == 0 && d == 0 && exact_widths(); }

  // No candidate cap and quantum 1: the key term is the visible key count itself.
  bool exact_widths() const { return candidates == 0 && quantum == 1; }

  // Keys the row's key term prices: roundup(min(visible, candidates), quantum).
  int64_t width(int64_t visible) const;

  // Expected admissions into the full running top-k of a row that sees `visible` keys:
  // topk * ln(max(min(visible, candidates), topk) / topk) (0 up to topk keys).
  double heap(int64_t visible) const;

  // sum of heap(vis(p)) over document positions [0, rows): closed form through ln n!,
  // O(1) (relative error below 1e-12).
  double heap_prefix(int64_t rows, int64_t ratio) const;

  // Cost of one row that sees `visible` keys.
  double row(int64_t visible) const;

  // sum of width(vis(p)) over document positions [0, rows): closed form, O(1).
  int64_t width_prefix(int64_t rows, int64_t ratio) const;

  // Cost of the first `rows` rows of a document (document positions [0, rows)).
  // For the causal model this is work_prefix(rows, ratio) exactly (as a double, exact
  // below 2^53 pairs).
  double prefix(int64_t rows, int64_t ratio) const;

  // Cost of document rows [start, end).
  double range(int64_t start, int64_t end, int64_t ratio) const {
    return prefix(end, ratio) - prefix(start, ratio);
  }
};

// Throws Error unless a, b, c, d are finite, non-negative and at most
// kMaxCostModelCoefficient, a + b + c + d > 0, topk >= 1,
// candidates >= 0 and quantum >= 1 (each error names the value).
void validate_cost_model(const CostModel& model);

// The model's id, 16 hex digits: a hash (FNV-1a, 64 bits) of its terms (a, b, c, topk;
// d when not 0 and candidates and quantum when not the defaults, so older models keep
// their ids; unit, bit
// for bit) and its note, which names the shape and device it was fitted for
// (`sparsecp calibrate` writes "heads 16 head_dim 128 ... isa avx2 threads 1, <CPU>, <date>").
// Every report that balances a model prints it, so two runs can tell whether they
// balanced the same one. Stable across platforms and builds.
std::string cost_model_id(const CostModel& model);

// The text form described above (round-trips exactly: numbers use 17 digits).
std::string format_cost_model(const CostModel& model);

// Parses the text form; `origin` (e.g. a file name) prefixes error messages.
CostModel parse_cost_model(std::string_view text, std::string_view origin);

// Reading and writing cost model files: io/cost_model_file.hpp (planning opens no file).

}  // namespace sparsecp
