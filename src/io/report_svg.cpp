#include "sparsecp/io/report_svg.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <vector>

namespace sparsecp {

namespace {

constexpr double kWidth = 1200;
constexpr double kMargin = 20;
constexpr double kGap = 20;
// Tableau 10: distinguishable, and readable on white.
constexpr const char* kPalette[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                    "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};

std::string escape(std::string_view text) {
  std::string out;
  for (const char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        // Control characters are not allowed in XML 1.0 text.
        if (static_cast<unsigned char>(c) >= 0x20 || c == '\n' || c == '\t') out += c;
    }
  }
  return out;
}

std::string num(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f", std::isfinite(value) ? value : 0.0);
  return text;
}

std::string label(double value) {
  char text[32];
  if (std::fabs(value) >= 100 || value == std::floor(value)) {
    std::snprintf(text, sizeof text, "%.0f", value);
  } else {
    std::snprintf(text, sizeof text, "%.2g", value);
    if (std::fabs(value) >= 1) std::snprintf(text, sizeof text, "%.2f", value);
  }
  return text;
}

// A tick step of 1, 2, 2.5 or 5 times a power of ten giving about `ticks` intervals.
double nice_step(double span, int ticks) {
  if (!(span > 0) || !std::isfinite(span)) return 1;
  const double raw = span / ticks;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (const double factor : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    if (factor * power >= raw) return factor * power;
  }
  return 10 * power;
}

class Svg {
 public:
  void text(double x, double y, std::string_view content, int size = 12,
            std::string_view anchor = "start", std::string_view weight = "normal",
            std::string_view fill = "#222") {
    body_ << "<text x=\"" << num(x) << "\" y=\"" << num(y) << "\" font-size=\"" << size
          << "\" text-anchor=\"" << anchor << "\" font-weight=\"" << weight << "\" fill=\"" << fill
          << "\">" << escape(content) << "</text>\n";
  }
  void rect(double x, double y, double w, double h, std::string_view fill,
            std::string_view stroke = "none", std::string_view title = "") {
    body_ << "<rect x=\"" << num(x) << "\" y=\"" << num(y) << "\" width=\"" << num(std::max(0.0, w))
          << "\" height=\"" << num(std::max(0.0, h)) << "\" fill=\"" << fill << "\" stroke=\""
          << stroke << "\"";
    if (title.empty()) {
      body_ << "/>\n";
    } else {
      body_ << "><title>" << escape(title) << "</title></rect>\n";
    }
  }
  void line(double x1, double y1, double x2, double y2, std::string_view stroke, double width = 1,
            std::string_view dash = "") {
    body_ << "<line x1=\"" << num(x1) << "\" y1=\"" << num(y1) << "\" x2=\"" << num(x2)
          << "\" y2=\"" << num(y2) << "\" stroke=\"" << stroke << "\" stroke-width=\"" << width
          << "\"";
    if (!dash.empty()) body_ << " stroke-dasharray=\"" << dash << "\"";
    body_ << "/>\n";
  }
  void polyline(const std::vector<std::pair<double, double>>& points, std::string_view stroke,
                std::string_view dash = "") {
    if (points.size() < 2) return;
    body_ << "<polyline fill=\"none\" stroke=\"" << stroke << "\" stroke-width=\"2\"";
    if (!dash.empty()) body_ << " stroke-dasharray=\"" << dash << "\"";
    body_ << " points=\"";
    for (const auto& [x, y] : points) body_ << num(x) << ',' << num(y) << ' ';
    body_ << "\"/>\n";
  }
  void circle(double x, double y, double r, std::string_view fill, std::string_view title) {
    body_ << "<circle cx=\"" << num(x) << "\" cy=\"" << num(y) << "\" r=\"" << num(r)
          << "\" fill=\"" << fill << "\"><title>" << escape(title) << "</title></circle>\n";
  }

  std::string finish(double height) const {
    std::ostringstream out;
    out << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
        << "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"" << num(kWidth)
        << "\" height=\"" << num(height) << "\" viewBox=\"0 0 " << num(kWidth) << ' ' << num(height)
        << "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n"
        << "<rect x=\"0\" y=\"0\" width=\"" << num(kWidth) << "\" height=\"" << num(height)
        << "\" fill=\"#ffffff\"/>\n"
        << body_.str() << "</svg>\n";
    return out.str();
  }

 private:
  std::ostringstream body_;
};

// Strategy names in first-seen order; colour i is kPalette[i % 10].
class Colours {
 public:
  void add(const std::string& name) {
    if (std::find(names_.begin(), names_.end(), name) == names_.end()) names_.push_back(name);
  }
  const char* of(const std::string& name) const {
    const auto it = std::find(names_.begin(), names_.end(), name);
    return kPalette[static_cast<size_t>(it - names_.begin()) % std::size(kPalette)];
  }
  const std::vector<std::string>& names() const { return names_; }

 private:
  std::vector<std::string> names_;
};

// A plot frame: horizontal grid lines and y labels from `low` to `high`, linear or
// logarithmic (then `low` > 0 and values below it sit on the axis).
struct Frame {
  double left, top, width, height, low, high;
  bool log = false;
  double y(double value) const {
    if (log) {
      const double v = std::log10(std::max(value, low));
      return top + height - (v - std::log10(low)) / (std::log10(high) - std::log10(low)) * height;
    }
    return top + height - (value - low) / (high - low) * height;
  }
};

// A tick label with as many decimals as the step needs.
std::string tick_label(double value, double step) {
  const int digits = step >= 1 ? 0 : static_cast<int>(std::ceil(-std::log10(step) - 1e-9));
  char text[32];
  std::snprintf(text, sizeof text, "%.*f", std::min(digits, 6), value);
  return text;
}

void draw_y_axis(Svg& svg, const Frame& f, double step, const std::string& unit) {
  if (f.log) {
    for (double tick = f.low; tick <= f.high * (1 + 1e-9); tick *= 10) {
      const double y = f.y(tick);
      svg.line(f.left, y, f.left + f.width, y, "#e3e3e3");
      svg.text(f.left - 4, y + 4, tick_label(tick, 1) + unit, 10, "end", "normal", "#555");
    }
  } else {
    for (double tick = f.low; tick <= f.high + step * 1e-9; tick += step) {
      const double y = f.y(tick);
      svg.line(f.left, y, f.left + f.width, y, "#e3e3e3");
      svg.text(f.left - 4, y + 4, tick_label(tick, step) + unit, 10, "end", "normal", "#555");
    }
  }
  svg.line(f.left, f.top, f.left, f.top + f.height, "#888");
  svg.line(f.left, f.top + f.height, f.left + f.width, f.top + f.height, "#888");
}

double draw_work_bars(Svg& svg, std::span<const SimulationResult> batch, const Colours& colours,
                      double top) {
  const SimulationResult* first = nullptr;
  double highest = 1.0;
  std::vector<const SimulationResult*> shown;
  for (const auto& result : batch) {
    if (!result.error.empty() || result.work.empty() || result.total_work <= 0) continue;
    shown.push_back(&result);
    if (!first) first = &result;
    const double mean = static_cast<double>(result.total_work) / static_cast<double>(result.cp);
    for (const int64_t work : result.work)
      highest = std::max(highest, static_cast<double>(work) / mean);
  }
  if (shown.empty()) return top;
  svg.text(kMargin, top + 16,
           "Per-rank work on one batch (" + first->workload + " " + std::to_string(first->batch) +
               ", cp " + std::to_string(first->cp) + "), in units of the mean rank work",
           15, "start", "bold");
  svg.text(kMargin, top + 34,
           "Dashed line: perfect balance (1.0). The tallest bar is the strategy's imbalance.", 11,
           "start", "normal", "#555");
  top += 46;
  const double step = nice_step(highest, 4);
  const double high = std::ceil(highest / step - 1e-9) * step;
  const int columns = 4;
  const double panel_width = (kWidth - 2 * kMargin - (columns - 1) * kGap) / columns;
  const double panel_height = 170;
  for (size_t i = 0; i < shown.size(); ++i) {
    const SimulationResult& r = *shown[i];
    const double x = kMargin + static_cast<double>(i % columns) * (panel_width + kGap);
    const double y = top + static_cast<double>(i / columns) * (panel_height + kGap);
    char heading[160];
    std::snprintf(heading, sizeof heading, "%s: imbalance %.3f", r.strategy.c_str(), r.imbalance);
    svg.text(x + 40, y + 12, heading, 12, "start", "bold", colours.of(r.strategy));
    const Frame frame{x + 40, y + 22, panel_width - 44, panel_height - 42, 0.0, high};
    draw_y_axis(svg, frame, step, "");
    const double mean = static_cast<double>(r.total_work) / static_cast<double>(r.cp);
    const double slot = frame.width / static_cast<double>(r.cp);
    const double gap = r.cp <= 16 ? slot * 0.2 : (r.cp <= 64 ? slot * 0.1 : 0.0);
    for (int64_t rank = 0; rank < r.cp; ++rank) {
      const double value = static_cast<double>(r.work[static_cast<size_t>(rank)]) / mean;
      const double bar_top = frame.y(value);
      char tip[128];
      std::snprintf(tip, sizeof tip, "rank %lld: %.3f x mean", static_cast<long long>(rank), value);
      svg.rect(frame.left + static_cast<double>(rank) * slot + gap / 2, bar_top, slot - gap,
               frame.top + frame.height - bar_top, colours.of(r.strategy), "none", tip);
    }
    svg.line(frame.left, frame.y(1.0), frame.left + frame.width, frame.y(1.0), "#222", 1, "4,3");
    svg.text(frame.left + frame.width / 2, frame.top + frame.height + 13,
             "ranks 0-" + std::to_string(r.cp - 1), 10, "middle", "normal", "#555");
  }
  const size_t rows = (shown.size() + columns - 1) / columns;
  return top + static_cast<double>(rows) * (panel_height + kGap);
}

double draw_legend(Svg& svg, const Colours& colours, double top) {
  double x = kMargin;
  for (const auto& name : colours.names()) {
    const double width = 34 + 7.5 * static_cast<double>(name.size());
    if (x + width > kWidth - kMargin) {
      x = kMargin;
      top += 20;
    }
    svg.rect(x, top + 3, 22, 10, colours.of(name));
    svg.text(x + 27, top + 12, name, 12);
    x += width;
  }
  return top + 24;
}

// One "metric versus CP size" chart: one panel per workload, one line per strategy,
// and optionally a dashed black line for a strategy-independent bound.
struct Chart {
  std::string heading = {};
  std::string note = {};
  double (*value)(const SummaryRow&) = nullptr;
  double floor_value = 0;  // the axis starts here (1 for a log axis)
  bool log = false;
  double (*bound)(const SummaryRow&) = nullptr;
  std::string bound_name = {};
};

// The x position of a CP size in a panel: evenly spaced, in increasing order.
double cp_x(const Frame& frame, const std::vector<int64_t>& cps, int64_t cp) {
  const auto index = std::find(cps.begin(), cps.end(), cp) - cps.begin();
  return cps.size() == 1 ? frame.left + frame.width / 2
                         : frame.left + 12 +
                               static_cast<double>(index) * (frame.width - 24) /
                                   static_cast<double>(cps.size() - 1);
}

// One line per strategy; a missing or non-finite value breaks the line.
void draw_strategy_lines(Svg& svg, std::span<const SummaryRow> summary, const Colours& colours,
                         const Chart& chart, const Frame& frame, const std::string& workload,
                         const std::vector<int64_t>& cps) {
  for (const auto& name : colours.names()) {
    std::vector<std::pair<double, double>> points;
    for (const int64_t cp : cps) {
      const SummaryRow* found = nullptr;
      for (const auto& row : summary) {
        if (row.strategy == name && row.workload == workload && row.cp == cp) found = &row;
      }
      const double v = found ? chart.value(*found) : NAN;
      if (!std::isfinite(v)) {
        svg.polyline(points, colours.of(name));
        points.clear();
        continue;
      }
      const double px = cp_x(frame, cps, cp);
      const double py = frame.y(v);
      points.emplace_back(px, py);
      svg.circle(px, py, 3, colours.of(name),
                 name + ", cp " + std::to_string(cp) + ": " + label(v));
    }
    svg.polyline(points, colours.of(name));
  }
}

// The bound is a property of the batches: take it from any strategy's row.
void draw_bound_line(Svg& svg, std::span<const SummaryRow> summary, const Chart& chart,
                     const Frame& frame, const std::string& workload,
                     const std::vector<int64_t>& cps) {
  std::vector<std::pair<double, double>> points;
  for (const int64_t cp : cps) {
    for (const auto& row : summary) {
      if (row.workload != workload || row.cp != cp || !std::isfinite(chart.bound(row))) continue;
      points.emplace_back(cp_x(frame, cps, cp), frame.y(chart.bound(row)));
      svg.circle(points.back().first, points.back().second, 2.5, "#222",
                 chart.bound_name + ", cp " + std::to_string(cp) + ": " + label(chart.bound(row)));
      break;
    }
  }
  svg.polyline(points, "#222", "5,4");
}

double draw_versus_cp(Svg& svg, std::span<const SummaryRow> summary, const Colours& colours,
                      double top, const Chart& chart) {
  const double floor_value = chart.floor_value;
  std::vector<std::string> workloads;
  std::vector<int64_t> cps;
  double highest = floor_value;
  for (const auto& row : summary) {
    if (std::find(workloads.begin(), workloads.end(), row.workload) == workloads.end()) {
      workloads.push_back(row.workload);
    }
    if (std::find(cps.begin(), cps.end(), row.cp) == cps.end()) cps.push_back(row.cp);
    const double v = chart.value(row);
    if (std::isfinite(v)) highest = std::max(highest, v);
  }
  std::sort(cps.begin(), cps.end());
  svg.text(kMargin, top + 16, chart.heading, 15, "start", "bold");
  svg.text(kMargin, top + 34, chart.note, 11, "start", "normal", "#555");
  top += 46;
  if (highest <= floor_value) highest = floor_value + 1;
  const double step = nice_step(highest - floor_value, 5);
  const double high = chart.log
                          ? std::pow(10.0, std::ceil(std::log10(highest) - 1e-9))
                          : floor_value + std::ceil((highest - floor_value) / step - 1e-9) * step;
  const int columns = static_cast<int>(std::min<size_t>(3, workloads.size()));
  const double panel_width = (kWidth - 2 * kMargin - (columns - 1) * kGap) / columns;
  const double panel_height = 260;
  for (size_t w = 0; w < workloads.size(); ++w) {
    const double x =
        kMargin + static_cast<double>(w % static_cast<size_t>(columns)) * (panel_width + kGap);
    const double y =
        top + static_cast<double>(w / static_cast<size_t>(columns)) * (panel_height + kGap);
    svg.text(x + panel_width / 2 + 24, y + 12, workloads[w], 13, "middle", "bold");
    const Frame frame{x + 52,      y + 22, panel_width - 62, panel_height - 50,
                      floor_value, high,   chart.log};
    draw_y_axis(svg, frame, step, "");
    for (const int64_t cp : cps) {
      svg.text(cp_x(frame, cps, cp), frame.top + frame.height + 14, std::to_string(cp), 10,
               "middle", "normal", "#555");
    }
    svg.text(frame.left + frame.width / 2, frame.top + frame.height + 28, "CP size", 11, "middle",
             "normal", "#555");
    draw_strategy_lines(svg, summary, colours, chart, frame, workloads[w], cps);
    if (chart.bound) draw_bound_line(svg, summary, chart, frame, workloads[w], cps);
  }
  const size_t rows =
      (workloads.size() + static_cast<size_t>(columns) - 1) / static_cast<size_t>(columns);
  return top + static_cast<double>(rows) * (panel_height + kGap);
}

double draw_rank_section(Svg& svg, const RankSection& section, const Colours& colours, double top) {
  double highest = 1.0;
  const auto mean_of = [](const RankSeries& series) {
    double total = 0;
    for (const double v : series.values) total += std::isfinite(v) ? v : 0;
    return series.values.empty() ? 0.0 : total / static_cast<double>(series.values.size());
  };
  for (const RankSeries& series : section.series) {
    const double mean = mean_of(series);
    if (mean <= 0) continue;
    for (const double v : series.values) {
      if (std::isfinite(v)) highest = std::max(highest, v / mean);
    }
  }
  svg.text(kMargin, top + 16, section.heading + ", in units of the strategy's mean rank", 15,
           "start", "bold");
  svg.text(kMargin, top + 34,
           "Dashed line: perfect balance (1.0). The tallest bar is the strategy's imbalance.", 11,
           "start", "normal", "#555");
  top += 46;
  const double step = nice_step(highest, 4);
  const double high = std::ceil(highest / step - 1e-9) * step;
  const size_t columns = std::max<size_t>(1, std::min<size_t>(4, section.series.size()));
  const double panel_width = (kWidth - 2 * kMargin - static_cast<double>(columns - 1) * kGap) /
                             static_cast<double>(columns);
  const double panel_height = 170;
  for (size_t i = 0; i < section.series.size(); ++i) {
    const RankSeries& r = section.series[i];
    const auto ranks = static_cast<int64_t>(r.values.size());
    const double mean = mean_of(r);
    double most = 0;
    for (const double v : r.values) most = std::max(most, std::isfinite(v) ? v : 0.0);
    const double x = kMargin + static_cast<double>(i % columns) * (panel_width + kGap);
    const double y = top + static_cast<double>(i / columns) * (panel_height + kGap);
    char heading[160];
    std::snprintf(heading, sizeof heading, "%s: imbalance %.3f", r.strategy.c_str(),
                  mean > 0 ? most / mean : 1.0);
    svg.text(x + 40, y + 12, heading, 12, "start", "bold", colours.of(r.strategy));
    const Frame frame{x + 40, y + 22, panel_width - 44, panel_height - 42, 0.0, high};
    draw_y_axis(svg, frame, step, "");
    if (ranks == 0 || mean <= 0) continue;
    const double slot = frame.width / static_cast<double>(ranks);
    const double gap = ranks <= 16 ? slot * 0.2 : (ranks <= 64 ? slot * 0.1 : 0.0);
    for (int64_t rank = 0; rank < ranks; ++rank) {
      const double raw = r.values[static_cast<size_t>(rank)];
      const double value = (std::isfinite(raw) ? raw : 0.0) / mean;
      const double bar_top = frame.y(value);
      char tip[160];
      std::snprintf(tip, sizeof tip, "rank %lld: %.4g %s, %.3f x mean",
                    static_cast<long long>(rank), std::isfinite(raw) ? raw : 0.0,
                    section.unit.c_str(), value);
      svg.rect(frame.left + static_cast<double>(rank) * slot + gap / 2, bar_top, slot - gap,
               frame.top + frame.height - bar_top, colours.of(r.strategy), "none", tip);
    }
    svg.line(frame.left, frame.y(1.0), frame.left + frame.width, frame.y(1.0), "#222", 1, "4,3");
    svg.text(frame.left + frame.width / 2, frame.top + frame.height + 13,
             "ranks 0-" + std::to_string(ranks - 1), 10, "middle", "normal", "#555");
  }
  const size_t rows = (section.series.size() + columns - 1) / columns;
  return top + static_cast<double>(rows) * (panel_height + kGap);
}

}  // namespace

std::string render_rank_bars_svg(std::string_view title, std::string_view subtitle,
                                 std::span<const RankSection> sections) {
  Svg svg;
  Colours colours;
  for (const RankSection& section : sections) {
    for (const RankSeries& series : section.series) colours.add(series.strategy);
  }
  svg.text(kMargin, 32, title, 20, "start", "bold");
  double top = 40;
  if (!subtitle.empty()) {
    svg.text(kMargin, 56, subtitle, 12, "start", "normal", "#555");
    top = 64;
  }
  top = draw_legend(svg, colours, top);
  for (const RankSection& section : sections)
    top = draw_rank_section(svg, section, colours, top) + 10;
  return svg.finish(top + kMargin);
}

std::string render_simulation_svg(std::span<const SimulationResult> batch,
                                  std::span<const SummaryRow> summary, std::string_view title) {
  Svg svg;
  Colours colours;
  for (const auto& result : batch) colours.add(result.strategy);
  for (const auto& row : summary) colours.add(row.strategy);
  svg.text(kMargin, 32, title, 20, "start", "bold");
  double top = 44;
  top = draw_legend(svg, colours, top);
  if (!batch.empty()) top = draw_work_bars(svg, batch, colours, top) + 10;
  if (!summary.empty()) {
    top = draw_versus_cp(svg, summary, colours, top,
                         Chart{.heading = "Imbalance (max / mean rank work) versus CP size",
                               .note = "Median over batches; 1.0 is perfect balance. Lower is "
                                       "better.",
                               .value = [](const SummaryRow& row) { return row.imbalance; },
                               .floor_value = 1.0}) +
          10;
    top =
        draw_versus_cp(
            svg, summary, colours, top,
            Chart{.heading = "Bytes moved versus CP size (MiB)",
                  .note = "Median over batches: selection inputs sent to workers plus top-k ids "
                          "sent back. Dashed black: the fewest any plan must move to reach the "
                          "mean. Lower is better.",
                  .value = [](const SummaryRow& row) { return row.bytes_moved / 1048576.0; },
                  .bound = [](const SummaryRow& row) { return row.bytes_moved_bound / 1048576.0; },
                  .bound_name = "bound"}) +
        10;
    top = draw_versus_cp(
              svg, summary, colours, top,
              Chart{.heading = "Fragments on the busiest rank versus CP size (log scale)",
                    .note = "Median over batches of the most segments one rank selects; each is a "
                            "separate piece of work for the selector. Lower is better.",
                    .value = [](const SummaryRow& row) { return row.fragments_max; },
                    .floor_value = 1.0,
                    .log = true}) +
          10;
  }
  return svg.finish(top + kMargin);
}

}  // namespace sparsecp
