// `sparsecp calibrate`: fit the per-row cost model a + b * vis + c * min(topk, vis)
// (planning/cost_model.hpp) to timed selection runs on this machine, and save it. The
// procedure is the library's (planning/calibration.hpp), on sparsecp's own CPU kernel
// (calibration.hpp).
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "batch_input.hpp"
#include "calibration.hpp"
#include "command.hpp"
#include "progress.hpp"
#include "sparsecp/error.hpp"
#include "sparsecp/io/cost_model_file.hpp"
#include "sparsecp/io/output_set.hpp"
#include "sparsecp/planning/cost_model.hpp"

namespace sparsecp::cli {
namespace {

struct CalibrateFlags {
  CalibrationSettings settings;
  std::string visible = "0,64,256,448,512,640,1024,2048,4096,8192,16384";
  std::string out = "cost_model.txt";
  bool json = false;
};

void print_report(const CpuCalibration& calibration, const std::string& out) {
  const Calibration& fit = calibration.fit;
  std::printf("sparsecp calibrate: %s\n", fit.model.note.c_str());
  std::printf("model id %s\n", cost_model_id(fit.model).c_str());
  std::printf("  %8s %6s %12s %12s %12s %12s %12s %9s\n", "mean vis", "rows", "sum vis",
              "sum min(k,v)", "sum heap", "measured ms", "model ms", "residual");
  for (const CalibrationPoint& p : fit.points) {
    const CostSample& s = p.sums;
    std::printf("  %8.0f %6.0f %12.0f %12.0f %12.0f %12.3f %12.3f %8.1f%%\n", s.visible / s.rows,
                s.rows, s.visible, s.capped, s.heap, s.seconds * 1e3, p.predicted * 1e3,
                100 * (p.predicted - s.seconds) / s.seconds);
  }
  std::printf(
      "fit (ns per row): a = %.4g (fixed), b = %.4g per visible key, c = %.4g per min(topk, "
      "vis), d = %.4g per top-k admission (topk * ln(vis / topk) of a row that sees "
      "more than topk keys); plus %.3g ms per call (not part of the per-row model); rms "
      "relative residual %.1f%%; took %.1f s\n",
      fit.model.a, fit.model.b, fit.model.c, fit.model.d, fit.per_call_seconds * 1e3,
      100 * fit.rms_relative_residual, calibration.seconds_taken);
  if (out != "-") std::printf("saved to %s\n", out.c_str());
}

void print_json(const CpuCalibration& calibration, const std::string& out) {
  const Calibration& fit = calibration.fit;
  nlohmann::json json;
  json["a_ns"] = fit.model.a;
  json["b_ns"] = fit.model.b;
  json["c_ns"] = fit.model.c;
  json["d_ns"] = fit.model.d;
  json["topk"] = fit.model.topk;
  json["note"] = fit.model.note;
  json["id"] = cost_model_id(fit.model);
  json["file"] = out;
  json["per_call_ns"] = fit.per_call_seconds * 1e9;
  json["rms_relative_residual"] = fit.rms_relative_residual;
  json["seconds_taken"] = calibration.seconds_taken;
  json["points"] = nlohmann::json::array();
  for (const CalibrationPoint& p : fit.points) {
    json["points"].push_back({{"visible", p.target},
                              {"rows", p.rows},
                              {"sum_visible", p.sums.visible},
                              {"sum_min_topk_visible", p.sums.capped},
                              {"seconds", p.sums.seconds},
                              {"predicted_seconds", p.predicted}});
  }
  std::printf("%s\n", json.dump(2).c_str());
}

void run_calibrate(CalibrateFlags& flags) {
  flags.settings.grid.visible = parse_integer_list(flags.visible, "--visible", false);
  // Progress on a terminal only (progress.hpp): the points, then the fit.
  const Progress progress("sparsecp calibrate", flags.json);
  progress.say("timing the selection at %zu visible-key counts, %d repeats each ...",
               flags.settings.grid.visible.size(), flags.settings.grid.repeats);
  const CpuCalibration fit = calibrate_cpu(flags.settings, &progress);
  progress.say("fitted in %s", human_seconds(fit.seconds_taken).c_str());
  if (flags.out != "-") {
    OutputSet output;  // whole or absent (io/output_set.hpp)
    output.add_text(flags.out, format_cost_model(fit.fit.model), "--out");
    output.commit();
  }
  if (flags.json) {
    print_json(fit, flags.out);
  } else {
    print_report(fit, flags.out);
  }
}

const Registration registration("calibrate", [](CLI::App& app) {
  auto flags = std::make_shared<CalibrateFlags>();
  CLI::App* sub = app.add_subcommand(
      "calibrate",
      "Time the worker's selection (Index-Q projection, scoring, top-k) on this machine at a\n"
      "few visible-key counts, fit the per-row cost a + b*vis + c*min(topk, vis) +\n"
      "d*topk*ln(vis/topk) (the last: expected admissions into a full running top-k)\n"
      "in nanoseconds by non-negative least squares, print the fit with each point's residual,\n"
      "and save the model for `--cost-model` of spill, auto, plan, route and run (format:\n"
      "include/sparsecp/planning/cost_model.hpp). Times are the selecting thread's CPU time,\n"
      "median of --repeats run interleaved; a fit over --max-residual is refused. Prints the\n"
      "model's id (a hash of its terms, shape and device). bf16 qr, Wq_b and keys, fp32\n"
      "weights and RoPE.");
  flags->settings.model.add_to(*sub);
  sub->add_option("--ratio", flags->settings.grid.ratio, "Key compression ratio (tokens per key)")
      ->capture_default_str();
  sub->add_option("--rows", flags->settings.grid.rows, "Rows per timed point")
      ->capture_default_str();
  sub->add_option(
         "--visible", flags->visible,
         "Mean visible keys per row at each point, comma-separated (>= 3 points; 0 = "
         "projection only); points below and above --topk separate b from c, points up to 16K "
         "keys b from d")
      ->capture_default_str();
  sub->add_option("--repeats", flags->settings.grid.repeats,
                  "Timed runs per point (median; at most 10000)")
      ->capture_default_str();
  sub->add_option("--threads", flags->settings.threads, "Selection threads (OpenMP and OpenBLAS)")
      ->capture_default_str();
  sub->add_option("--max-residual", flags->settings.grid.max_residual,
                  "Refuse (exit with an error, save nothing) a fit whose rms relative residual "
                  "exceeds this fraction, as on a busy machine; 0: no bound")
      ->capture_default_str();
  sub->add_option("--out", flags->out, "File to save the model to ('-': do not save)")
      ->capture_default_str();
  sub->add_flag("--json", flags->json,
                "Print JSON: {a_ns, b_ns, c_ns, d_ns, topk, note, id, file, rms_relative_residual, "
                "seconds_taken, points: [{visible, rows, sum_visible, sum_min_topk_visible, "
                "seconds, predicted_seconds}]}");
  sub->footer(
      "Examples:\n"
      "  sparsecp calibrate\n"
      "  sparsecp calibrate --heads 32 --q-rank 1024 --out v41_cost_model.txt\n"
      "  sparsecp spill --cp 8 --cost-model cost_model.txt");
  sub->callback([flags] { run_calibrate(*flags); });
});

}  // namespace
}  // namespace sparsecp::cli
