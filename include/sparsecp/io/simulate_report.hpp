// sparsecp: simulate's reports — its summary rows (planning/simulate.hpp) as JSON, CSV
// or a readable table. report_svg.hpp draws the same rows as a chart.
#pragma once

#include <ostream>
#include <span>

#include "sparsecp/planning/simulate.hpp"

namespace sparsecp {

// {"results":[{"strategy":..,"cp":..,"workload":..,"imbalance":..,"lower_bound":..,
//   "rows_moved":..,"max_rows_moved_per_rank":..,"bytes_moved":..,"fragments_max":..,
//   "rows_max":..,"padding_rows":..,"plan_ms":.., <extra keys>},...]}
// Extra keys: batch (per-batch rows), batches, failures, row_lower_bound,
// moved_fraction, rows_moved_bound, moved_bound_fraction, bytes_moved_bound,
// max_bytes_sent_per_rank, note; with a node map (ranks_per_node > 0) also
// ranks_per_node, cross_node_rows, cross_node_fraction, cross_node_bytes,
// cross_node_bound, cross_node_bound_fraction, cross_node_bytes_bound. Non-finite
// numbers are null.
void write_json(std::ostream& out, std::span<const SummaryRow> rows);

// The same fields as CSV with a header line (RFC 4180 quoting); the node map's columns
// (after the numeric ones) when any row has one.
void write_csv(std::ostream& out, std::span<const SummaryRow> rows);

// A readable table, one block per (workload, cp); with a node map, three more columns:
// x-node% (cross_node_fraction), bound% (cross_node_bound_fraction) and MiB x-node.
void write_table(std::ostream& out, std::span<const SummaryRow> rows);

}  // namespace sparsecp
