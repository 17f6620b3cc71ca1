#include "sparsecp/io/simulate_report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iomanip>
#include <iterator>
#include <limits>
#include <map>
#include <sstream>
#include <tuple>

namespace sparsecp {

namespace {

void json_string(std::ostream& out, std::string_view text) {
  out << '"';
  for (const char c : text) {
    switch (c) {
      case '"':
        out << "\\\"";
        break;
      case '\\':
        out << "\\\\";
        break;
      case '\n':
        out << "\\n";
        break;
      case '\t':
        out << "\\t";
        break;
      case '\r':
        out << "\\r";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char escaped[8];
          std::snprintf(escaped, sizeof escaped, "\\u%04x", static_cast<unsigned>(c));
          out << escaped;
        } else {
          out << c;
        }
    }
  }
  out << '"';
}

// Shortest round-trip form; integers without a fraction; null when not finite.
std::string number(double value) {
  if (!std::isfinite(value)) return "null";
  if (value == std::floor(value) && std::fabs(value) < 9.0e15) {
    return std::to_string(static_cast<int64_t>(value));
  }
  char text[32];
  std::snprintf(text, sizeof text, "%.17g", value);
  // Prefer the shortest representation that reads back exactly.
  for (int precision = 6; precision < 17; ++precision) {
    char shorter[32];
    std::snprintf(shorter, sizeof shorter, "%.*g", precision, value);
    if (std::strtod(shorter, nullptr) == value) return shorter;
  }
  return text;
}

struct Field {
  const char* name;
  double SummaryRow::*value;
};

// The JSON/CSV numeric columns, in output order after strategy, cp and workload.
constexpr Field kFields[] = {
    {"imbalance", &SummaryRow::imbalance},
    {"lower_bound", &SummaryRow::lower_bound},
    {"rows_moved", &SummaryRow::rows_moved},
    {"max_rows_moved_per_rank", &SummaryRow::max_rows_moved_per_rank},
    {"bytes_moved", &SummaryRow::bytes_moved},
    {"fragments_max", &SummaryRow::fragments_max},
    {"rows_max", &SummaryRow::rows_max},
    {"padding_rows", &SummaryRow::padding_rows},
    {"plan_ms", &SummaryRow::plan_ms},
    {"row_lower_bound", &SummaryRow::row_lower_bound},
    {"moved_fraction", &SummaryRow::moved_fraction},
    {"rows_moved_bound", &SummaryRow::rows_moved_bound},
    {"moved_bound_fraction", &SummaryRow::moved_bound_fraction},
    {"bytes_moved_bound", &SummaryRow::bytes_moved_bound},
    {"max_bytes_sent_per_rank", &SummaryRow::max_bytes_sent_per_rank},
};

// The node map's columns (rows with ranks_per_node > 0), after kFields.
constexpr Field kNodeMapFields[] = {
    {"cross_node_rows", &SummaryRow::cross_node_rows},
    {"cross_node_fraction", &SummaryRow::cross_node_fraction},
    {"cross_node_bytes", &SummaryRow::cross_node_bytes},
    {"cross_node_bound", &SummaryRow::cross_node_bound},
    {"cross_node_bound_fraction", &SummaryRow::cross_node_bound_fraction},
    {"cross_node_bytes_bound", &SummaryRow::cross_node_bytes_bound},
};

bool any_node_map(std::span<const SummaryRow> rows) {
  return std::any_of(rows.begin(), rows.end(),
                     [](const SummaryRow& row) { return row.ranks_per_node > 0; });
}

std::string csv_cell(std::string_view text) {
  if (text.find_first_of(",\"\n\r") == std::string_view::npos) return std::string(text);
  std::string quoted = "\"";
  for (const char c : text) {
    if (c == '"') quoted += '"';
    quoted += c;
  }
  return quoted + '"';
}

}  // namespace

void write_json(std::ostream& out, std::span<const SummaryRow> rows) {
  out << "{\"results\":[";
  for (size_t i = 0; i < rows.size(); ++i) {
    const SummaryRow& row = rows[i];
    out << (i == 0 ? "\n" : ",\n") << "{\"strategy\":";
    json_string(out, row.strategy);
    out << ",\"cp\":" << row.cp << ",\"workload\":";
    json_string(out, row.workload);
    for (const Field& field : kFields)
      out << ",\"" << field.name << "\":" << number(row.*field.value);
    if (row.ranks_per_node > 0) {
      out << ",\"ranks_per_node\":" << row.ranks_per_node;
      for (const Field& field : kNodeMapFields)
        out << ",\"" << field.name << "\":" << number(row.*field.value);
    }
    if (row.batch) out << ",\"batch\":" << *row.batch;
    out << ",\"batches\":" << row.batches << ",\"failures\":" << row.failures << ",\"note\":";
    json_string(out, row.note);
    out << '}';
  }
  out << "\n]}\n";
}

void write_csv(std::ostream& out, std::span<const SummaryRow> rows) {
  const bool node_map = any_node_map(rows);
  out << "strategy,cp,workload";
  for (const Field& field : kFields) out << ',' << field.name;
  if (node_map) {
    out << ",ranks_per_node";
    for (const Field& field : kNodeMapFields) out << ',' << field.name;
  }
  out << ",batch,batches,failures,note\n";
  for (const SummaryRow& row : rows) {
    out << csv_cell(row.strategy) << ',' << row.cp << ',' << csv_cell(row.workload);
    const auto cells = [&](std::span<const Field> fields) {
      for (const Field& field : fields) {
        const double value = row.*field.value;
        out << ',' << (std::isfinite(value) ? number(value) : "");
      }
    };
    cells(kFields);
    if (node_map && row.ranks_per_node > 0) {
      out << ',' << row.ranks_per_node;
      cells(kNodeMapFields);
    } else if (node_map) {
      out << std::string(1 + std::size(kNodeMapFields), ',');
    }
    out << ',' << (row.batch ? std::to_string(*row.batch) : "") << ',' << row.batches << ','
        << row.failures << ',' << csv_cell(row.note) << '\n';
  }
}

namespace {

std::string fixed(double value, int digits) {
  if (!std::isfinite(value)) return "-";
  std::ostringstream text;
  text << std::fixed << std::setprecision(digits) << value;
  return text.str();
}

}  // namespace

void write_table(std::ostream& out, std::span<const SummaryRow> rows) {
  // Blocks in first-seen (workload, cp, batch) order.
  std::vector<std::tuple<std::string, int64_t, std::optional<int64_t>>> blocks;
  for (const auto& row : rows) {
    auto key = std::make_tuple(row.workload, row.cp, row.batch);
    if (std::find(blocks.begin(), blocks.end(), key) == blocks.end()) blocks.push_back(key);
  }
  const bool node_map = any_node_map(rows);
  const std::string header =
      std::string(
          "  strategy         imbalance  bound  moved%  need%  max moved/rank  MiB moved  "
          "frag max  rows max  padding  plan ms") +
      (node_map ? "  x-node%  bound%  MiB x-node" : "");
  for (const auto& [workload, cp, batch] : blocks) {
    out << workload << ", cp " << cp;
    if (batch) {
      out << ", batch " << *batch << '\n';
    } else {
      int64_t batches = 0;
      for (const auto& row : rows) {
        if (row.workload == workload && row.cp == cp && !row.batch) {
          batches = std::max(batches, row.batches);
        }
      }
      out << " (median of " << batches << (batches == 1 ? " batch)" : " batches)") << '\n';
    }
    out << header << '\n';
    for (const auto& row : rows) {
      if (row.workload != workload || row.cp != cp || row.batch != batch) continue;
      char line[256];
      std::snprintf(line, sizeof line, "  %-16s %9s %6s %7s %6s %15s %10s %9s %9s %8s %8s",
                    row.strategy.c_str(), fixed(row.imbalance, 3).c_str(),
                    fixed(row.lower_bound, 3).c_str(), fixed(100 * row.moved_fraction, 1).c_str(),
                    fixed(100 * row.moved_bound_fraction, 1).c_str(),
                    fixed(row.max_rows_moved_per_rank, 0).c_str(),
                    fixed(row.bytes_moved / (1024.0 * 1024.0), 1).c_str(),
                    fixed(row.fragments_max, 0).c_str(), fixed(row.rows_max, 0).c_str(),
                    fixed(row.padding_rows, 0).c_str(), fixed(row.plan_ms, 2).c_str());
      out << line;
      if (node_map) {
        const bool mapped = row.ranks_per_node > 0;
        std::snprintf(line, sizeof line, " %8s %7s %11s",
                      mapped ? fixed(100 * row.cross_node_fraction, 2).c_str() : "-",
                      mapped ? fixed(100 * row.cross_node_bound_fraction, 2).c_str() : "-",
                      mapped ? fixed(row.cross_node_bytes / (1024.0 * 1024.0), 2).c_str() : "-");
        out << line;
      }
      if (row.failures > 0)
        out << "  (" << row.failures << " failed: " << row.note << ')';
      else if (!row.note.empty())
        out << "  (" << row.note << ')';
      out << '\n';
    }
    out << '\n';
  }
}

}  // namespace sparsecp
