// `sparsecp bench select`: the worker's selection kernels timed side by side on generated
// small-integer data (every score exact, so every path must select the same keys).
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "batch_input.hpp"
#include "bench_driver.hpp"
#include "command.hpp"
#include "model_flags.hpp"
#include "sparsecp/error.hpp"
#include "sparsecp/kernels/bf16.hpp"
#include "sparsecp/kernels/select.hpp"
#include "sparsecp/planning/workload.hpp"

namespace sparsecp::cli {
namespace {

struct BenchSelectFlags : BenchRunFlags {
  ModelFlags model;
  int64_t rows = 0;  // per document; 0 = the whole document
  int64_t doc_length = 8192;
  int64_t documents = 1;
  int64_t ratio = 4;
  std::string dtype = "both";
  std::string isa = "auto";
  bool baseline = true;
  bool json = false;
};

// What a user would write without a fused kernel: per head, a BLAS GEMM of the
// segment's rows against all of its document's keys into a [rows, keys] matrix, ReLU
// and the weighted sum into a [rows, keys] score matrix, then a partial sort of each
// row's visible keys. Same ordering of candidates (ties to the lower id).
void baseline_select(const std::vector<float>& q, const std::vector<float>& weights,
                     const std::vector<float>& keys, std::span<const Segment> segments,
                     const SelectConfig& config, std::vector<int32_t>& out) {
  const int64_t heads = config.heads, dim = config.head_dim, topk = config.topk;
  std::fill(out.begin(), out.end(), -1);
  std::vector<float> logits, scores;
  for (const Segment& s : segments) {
    const int64_t rows = s.q_end - s.q_begin;
    const int64_t count = s.key_end - s.key_begin;
    if (rows == 0 || count == 0) continue;
    logits.assign(static_cast<size_t>(rows * count), 0.0f);
    scores.assign(static_cast<size_t>(rows * count), 0.0f);
    for (int64_t h = 0; h < heads; ++h) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows),
                  static_cast<int>(count), static_cast<int>(dim), 1.0f,
                  q.data() + s.q_begin * heads * dim + h * dim, static_cast<int>(heads * dim),
                  keys.data() + s.key_begin * dim, static_cast<int>(dim), 0.0f, logits.data(),
                  static_cast<int>(count));
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < rows; ++r) {
        const float w = weights[static_cast<size_t>((s.q_begin + r) * heads + h)];
        float* score = scores.data() + r * count;
        const float* logit = logits.data() + r * count;
        for (int64_t k = 0; k < count; ++k) score[k] += w * std::max(logit[k], 0.0f);
      }
    }
    const int64_t end = count * config.ratio + s.residual;
#pragma omp parallel for schedule(dynamic, 16)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t visible = (end - rows + r + 1) / config.ratio;
      std::vector<std::pair<float, int32_t>> row;
      for (int64_t k = 0; k < visible; ++k) {
        row.emplace_back(scores[static_cast<size_t>(r * count + k)],
                         static_cast<int32_t>(s.key_begin + k));
      }
      const int64_t kept = std::min(topk, visible);
      std::partial_sort(row.begin(), row.begin() + kept, row.end(),
                        [](const auto& a, const auto& b) {
                          return a.first > b.first || (a.first == b.first && a.second < b.second);
                        });
      int32_t* dst = out.data() + (s.q_begin + r) * topk;
      for (int64_t i = 0; i < kept; ++i) dst[i] = row[static_cast<size_t>(i)].second;
      std::sort(dst, dst + kept);
    }
  }
}

// The generated problem: segments, small-integer Q/weights/keys (fp32 and bf16 copies)
// and real-valued projection inputs.
struct Problem {
  SelectConfig config;
  int64_t rows = 0;
  int64_t bank = 0;
  int64_t width = 0;
  std::vector<Segment> segments;
  std::vector<float> q, weights, keys;
  std::vector<uint16_t> q16, keys16;
  std::vector<float> qr, wq, cos, sin;
  std::vector<uint16_t> qr16, wq16;
};

// Sizes are checked before anything is allocated: a product that overflows is an error,
// and a problem larger than the machine's memory fails at once.
Problem make_problem(const BenchSelectFlags& c) {
  SPARSECP_CHECK(c.documents >= 1, "--documents must be positive, got ", c.documents);
  SPARSECP_CHECK(c.doc_length >= 1, "--doc-length must be positive, got ", c.doc_length);
  SPARSECP_CHECK(c.rows >= 0 && c.rows <= c.doc_length, "--rows must be within [0, --doc-length ",
                 c.doc_length, "], got ", c.rows);
  c.validate();
  SPARSECP_CHECK(c.dtype == "fp32" || c.dtype == "bf16" || c.dtype == "both",
                 "--dtype must be fp32, bf16 or both, got '", c.dtype, "'");
  Problem p;
  p.config = c.model.select_config(c.ratio, c.threads);
  p.config.isa = bench_isas(c.isa).back();
  validate_select_config(p.config);
  const int64_t per_doc = c.rows == 0 ? c.doc_length : c.rows;
  BufferBudget budget("bench select");
  p.rows = budget.elements({per_doc, c.documents});
  p.bank = budget.elements({c.doc_length / c.ratio, c.documents});
  p.width = budget.elements({c.model.heads, c.model.head_dim});
  budget.add(4 * 3, {p.rows, p.width});  // q (fp32, bf16) and the projected q
  budget.add(4 * 2, {p.rows, c.model.heads});
  budget.add(4 * 2, {p.bank, c.model.head_dim});
  budget.add(4 * 2, {p.rows, c.model.q_rank});
  budget.add(4 * 2, {c.model.q_rank, p.width});
  budget.add(4, {p.rows, c.model.rope_dim});
  budget.add(4 * 3, {p.rows, c.model.topk});
  budget.add(4 * 3, {c.sgemm_size, c.sgemm_size});
  budget.check_fits_memory();

  const int64_t keys_per_doc = c.doc_length / c.ratio;
  for (int64_t d = 0; d < c.documents; ++d) {
    p.segments.push_back({d * per_doc, (d + 1) * per_doc, d * keys_per_doc, (d + 1) * keys_per_doc,
                          c.doc_length % c.ratio});
  }
  SplitMix64 random(c.seed);
  const auto fill = [&](std::vector<float>& v, int64_t n, int bound) {
    v.resize(static_cast<size_t>(n));
    for (float& x : v) {
      x = static_cast<float>(static_cast<int>(random.next() % (2 * bound + 1)) - bound);
    }
  };
  fill(p.q, p.rows * p.width, 2);
  fill(p.weights, p.rows * c.model.heads, 2);
  fill(p.keys, p.bank * c.model.head_dim, 2);
  p.q16.resize(p.q.size());
  p.keys16.resize(p.keys.size());
  std::transform(p.q.begin(), p.q.end(), p.q16.begin(), float_to_bf16);
  std::transform(p.keys.begin(), p.keys.end(), p.keys16.begin(), float_to_bf16);
  // Projection inputs (real-valued; only timed).
  p.qr.resize(static_cast<size_t>(p.rows * c.model.q_rank));
  p.wq.resize(static_cast<size_t>(c.model.q_rank * p.width));
  p.cos.resize(static_cast<size_t>(p.rows * c.model.rope_dim / 2));
  p.sin.resize(p.cos.size());
  for (float& x : p.qr) x = static_cast<float>(random.uniform() - 0.5);
  for (float& x : p.wq) x = static_cast<float>(random.uniform() - 0.5) * 0.05f;
  for (size_t i = 0; i < p.cos.size(); ++i) {
    p.cos[i] = static_cast<float>(std::cos(0.001 * static_cast<double>(i)));
    p.sin[i] = static_cast<float>(std::sin(0.001 * static_cast<double>(i)));
  }
  p.qr16.resize(p.qr.size());
  p.wq16.resize(p.wq.size());
  std::transform(p.qr.begin(), p.qr.end(), p.qr16.begin(), float_to_bf16);
  std::transform(p.wq.begin(), p.wq.end(), p.wq16.begin(), float_to_bf16);
  return p;
}

// The text report, from the JSON report and the timed paths.
void print_bench_select(const BenchSelectFlags& c, const Problem& p,
                        const std::vector<KernelIsa>& isas, const std::vector<TimedPath>& paths,
                        const nlohmann::ordered_json& out, double proj_flops) {
  std::string names;
  for (const KernelIsa isa : isas) {
    names += std::string(names.empty() ? "" : ", ") + kernel_isa_name(isa);
  }
  std::printf(
      "bench select: %lld rows (%lld document(s) of %lld tokens), %lld keys, heads %lld x %lld, "
      "q_rank %lld, topk %lld, ratio %lld, %d threads, kernel %s; medians of %lld interleaved "
      "repeats (min-max)\n",
      static_cast<long long>(p.rows), static_cast<long long>(c.documents),
      static_cast<long long>(c.doc_length), static_cast<long long>(p.bank),
      static_cast<long long>(c.model.heads), static_cast<long long>(c.model.head_dim),
      static_cast<long long>(c.model.q_rank), static_cast<long long>(c.model.topk),
      static_cast<long long>(c.ratio), out["threads"].get<int>(), names.c_str(),
      static_cast<long long>(c.repeat));
  const double flops = out["gflop"].get<double>() * 1e9;
  const double sgemm = out["sgemm_gflops"].get<double>();
  std::printf("  score work             %10.1f GFLOP (2*heads*head_dim per visible pair)\n",
              flops / 1e9);
  for (const TimedPath& t : paths) {
    const Spread s = t.spread();
    const double work = t.name == "sgemm" ? 2.0 * std::pow(static_cast<double>(c.sgemm_size), 3)
                        : t.name.rfind("projection", 0) == 0 ? proj_flops
                                                             : flops;
    std::printf("  %-22s %10.4f s (%.4f-%.4f)  %8.1f GFLOP/s", t.name.c_str(), s.median, s.min,
                s.max, work / s.median / 1e9);
    if (t.name == "sgemm") std::printf("  (OpenBLAS kernel %s)", blas_core_name().c_str());
    if (t.name.rfind("fused", 0) == 0) {
      std::printf("  (%.0f%% of sgemm)", 100.0 * work / s.median / 1e9 / sgemm);
    }
    std::printf("\n");
  }
  for (const auto& e : out["per_isa"]) {
    if (e.contains("bf16_speedup")) {
      std::printf("  %s bf16 / fp32 fused speedup: %.2fx (%s)\n",
                  e["isa"].get<std::string>().c_str(), e["bf16_speedup"].get<double>(),
                  e["bf16_dot_products"].get<std::string>().c_str());
    }
    if (c.baseline) {
      std::printf("  %s fused is %.2fx faster than the baseline\n",
                  e["isa"].get<std::string>().c_str(), e["speedup_vs_baseline"].get<double>());
    }
  }
  std::printf("  scratch memory         %10.2f MiB (threads x tile, independent of rows)\n",
              static_cast<double>(out["scratch_bytes"].get<size_t>()) / (1 << 20));
  std::printf("  results %s\n", out["verified"].get<bool>()
                                    ? "identical across every fused path and the baseline"
                                    : "DIFFER between paths");
}

// One ISA's fused paths and their outputs (with --isa all, one per ISA this CPU runs).
struct PerIsa {
  KernelIsa isa;
  SelectConfig config;
  std::vector<int32_t> fused, fused16;
};

// The paths of one run, in the order they are timed (interleaved): the sgemm reference,
// each ISA's fused fp32/bf16 paths, the projections and the materialising baseline.
struct BenchPaths {
  const BenchSelectFlags& c;
  const Problem& p;
  std::vector<PerIsa> per;
  std::vector<int32_t> base;
  std::vector<float> projected;
  std::vector<TimedPath> paths;
  bool run_fp32, run_bf16;
  // Packed once, outside the timed projections (as a layer holds its weights).
  ProjectionWeights wq, wq16;

  BenchPaths(const BenchSelectFlags& flags, const Problem& problem,
             const std::vector<KernelIsa>& isas)
      : c(flags),
        p(problem),
        run_fp32(flags.dtype != "bf16"),
        run_bf16(flags.dtype != "fp32"),
        wq(MatrixView::f32(problem.wq.data(), flags.model.q_rank, problem.width)),
        wq16(MatrixView::bf16(problem.wq16.data(), flags.model.q_rank, problem.width)) {
    const auto out_size = static_cast<size_t>(p.rows * c.model.topk);
    base.assign(out_size, 0);
    projected.assign(static_cast<size_t>(p.rows * p.width), 0.0f);
    for (const KernelIsa isa : isas) {
      PerIsa& r = per.emplace_back(PerIsa{isa, p.config, {}, {}});
      r.config.isa = isa;
      r.fused.assign(out_size, 0);
      r.fused16.assign(out_size, 0);
    }
  }

  const SelectConfig& config() const { return per.back().config; }
  std::string suffix(const PerIsa& r) const {
    return per.size() > 1 ? std::string(" ") + kernel_isa_name(r.isa) : std::string();
  }
  const TimedPath& path(const std::string& name) const {
    for (const TimedPath& t : paths) {
      if (t.name == name) return t;
    }
    throw Error("bench select: no timed path named '" + name + "'");
  }
  // The main path of an ISA: fp32 unless only bf16 runs.
  const TimedPath& main_path(const PerIsa& r) const {
    return path((run_fp32 ? "fused fp32" : "fused bf16") + suffix(r));
  }

  void add_paths() {
    const int64_t rows = p.rows, width = p.width, q_rank = c.model.q_rank;
    const int64_t half = c.model.rope_dim / 2;
    const MatrixView weights = MatrixView::f32(p.weights.data(), rows, c.model.heads);
    paths = {sgemm_path(c.sgemm_size)};
    for (PerIsa& r : per) {
      if (run_fp32) {
        paths.push_back({"fused fp32" + suffix(r), [this, &r, rows, width, weights] {
                           select_topk(MatrixView::f32(p.q.data(), rows, width), weights,
                                       MatrixView::f32(p.keys.data(), p.bank, c.model.head_dim),
                                       p.segments, r.config, r.fused);
                         }});
      }
      if (run_bf16) {
        paths.push_back({"fused bf16" + suffix(r), [this, &r, rows, width, weights] {
                           select_topk(MatrixView::bf16(p.q16.data(), rows, width), weights,
                                       MatrixView::bf16(p.keys16.data(), p.bank, c.model.head_dim),
                                       p.segments, r.config, r.fused16);
                         }});
      }
    }
    const MatrixView cos = MatrixView::f32(p.cos.data(), rows, half);
    const MatrixView sin = MatrixView::f32(p.sin.data(), rows, half);
    if (run_fp32) {
      paths.push_back({"projection fp32", [this, rows, q_rank, cos, sin] {
                         project_index_query(MatrixView::f32(p.qr.data(), rows, q_rank), wq, cos,
                                             sin, config(), projected);
                       }});
    }
    if (run_bf16) {
      paths.push_back({"projection bf16", [this, rows, q_rank, cos, sin] {
                         project_index_query(MatrixView::bf16(p.qr16.data(), rows, q_rank), wq16,
                                             cos, sin, config(), projected);
                       }});
    }
    if (c.baseline) {
      paths.push_back({"baseline (GEMM/head)", [this] {
                         baseline_select(p.q, p.weights, p.keys, p.segments, config(), base);
                       }});
    }
  }

  // Every path must select the same keys (small-integer inputs: exact on every ISA).
  bool verified() const {
    const std::vector<int32_t>& first = run_fp32 ? per.front().fused : per.front().fused16;
    bool same = true;
    for (const PerIsa& r : per) {
      if (run_fp32) same = same && r.fused == first;
      if (run_bf16) same = same && r.fused16 == first;
    }
    return c.baseline ? same && first == base : same;
  }
};

// One ISA's figures: its main path's time and rates, bf16 beside fp32, the baseline.
nlohmann::ordered_json per_isa_json(const BenchPaths& b, const PerIsa& r, double flops,
                                    double sgemm, int threads) {
  const TimedPath& main = b.main_path(r);
  nlohmann::ordered_json e;
  e["isa"] = kernel_isa_name(r.isa);
  e["seconds"] = main.median_seconds();
  e["seconds_min"] = main.spread().min;
  e["seconds_max"] = main.spread().max;
  e["gflops"] = flops / main.median_seconds() / 1e9;
  e["fraction_of_sgemm"] = flops / main.median_seconds() / 1e9 / sgemm;
  // The names of earlier versions, kept as aliases.
  e["score_gflops"] = e["gflops"];
  e["score_fraction_of_sgemm"] = e["fraction_of_sgemm"];
  if (b.run_bf16) {
    const double t16 = b.path("fused bf16" + b.suffix(r)).median_seconds();
    e["bf16_seconds"] = t16;
    e["bf16_gflops"] = flops / t16 / 1e9;
    e["bf16_fraction_of_sgemm"] = flops / t16 / 1e9 / sgemm;
    e["bf16_score_gflops"] = e["bf16_gflops"];
    e["bf16_dot_products"] = select_bf16_products(r.isa);
  }
  if (b.run_fp32 && b.run_bf16) {
    e["bf16_speedup"] = b.path("fused fp32" + b.suffix(r)).median_seconds() /
                        b.path("fused bf16" + b.suffix(r)).median_seconds();
  }
  if (b.c.baseline) {
    e["speedup_vs_baseline"] =
        b.path("baseline (GEMM/head)").median_seconds() / main.median_seconds();
  }
  e["scratch_bytes"] =
      select_scratch_bytes(r.config, b.run_bf16 ? DType::kBFloat16 : DType::kFloat32, threads);
  return e;
}

// The whole run's figures (the --json object; the text report prints from it too).
nlohmann::ordered_json bench_json(const BenchPaths& b, double proj_flops) {
  const BenchSelectFlags& c = b.c;
  const double flops = select_score_flops(b.p.segments, b.config());
  const double sgemm = sgemm_gflops(b.paths.front(), c.sgemm_size);
  const int threads = c.threads > 0 ? c.threads : omp_get_max_threads();
  nlohmann::ordered_json per_isa = nlohmann::ordered_json::array();
  for (const PerIsa& r : b.per) per_isa.push_back(per_isa_json(b, r, flops, sgemm, threads));

  nlohmann::ordered_json out;
  out["rows"] = b.p.rows;
  out["doc_length"] = c.doc_length;
  out["documents"] = c.documents;
  out["heads"] = c.model.heads;
  out["head_dim"] = c.model.head_dim;
  out["q_rank"] = c.model.q_rank;
  out["topk"] = c.model.topk;
  out["ratio"] = c.ratio;
  out["threads"] = threads;
  out["repeat"] = c.repeat;
  out["score_gflop"] = flops / 1e9;
  out["gflop"] = flops / 1e9;
  out["sgemm_gflops"] = sgemm;
  out["sgemm_core"] = blas_core_name();
  // The flat fields describe the last (with --isa all: the best) ISA; `per_isa` has each.
  for (const auto& [key, value] : per_isa.back().items()) out[key] = value;
  if (b.run_fp32) {
    out["projection_seconds"] = b.path("projection fp32").median_seconds();
    out["projection_gflops"] = proj_flops / b.path("projection fp32").median_seconds() / 1e9;
  }
  if (b.run_bf16) {
    out["bf16_projection_gflops"] = proj_flops / b.path("projection bf16").median_seconds() / 1e9;
  }
  if (c.baseline) out["baseline_seconds"] = b.path("baseline (GEMM/head)").median_seconds();
  out["per_isa"] = per_isa;
  out["verified"] = b.verified();
  return out;
}

void run_bench(const BenchSelectFlags& c) {
  const Problem p = make_problem(c);
  const std::vector<KernelIsa> isas = bench_isas(c.isa);
  BenchPaths bench(c, p, isas);
  bench.add_paths();
  const Progress progress("sparsecp bench select", c.json);
  time_interleaved(bench.paths, c.repeat, &progress);
  const double proj_flops = 2.0 * static_cast<double>(p.rows) *
                            static_cast<double>(c.model.q_rank) * static_cast<double>(p.width);
  const nlohmann::ordered_json out = bench_json(bench, proj_flops);
  if (c.json) {
    std::cout << out.dump() << "\n";
  } else {
    print_bench_select(c, p, isas, bench.paths, out, proj_flops);
  }
  if (!out["verified"].get<bool>()) throw ExitStatus{1};
}

// Registered under "bench" so that the tool knows `sparsecp bench ...` as a command;
// every `bench <kernel>` command shares the parent through bench_command().
const Registration registration("bench", [](CLI::App& app) {
  auto b = std::make_shared<BenchSelectFlags>();
  CLI::App* bench = bench_command(app).add_subcommand(
      "select",
      "Time worker-side selection on generated small-integer data: fused score+top-k (fp32 "
      "and bf16), Index-Q projection (BLAS + RoPE), the BLAS's own square sgemm rate and a "
      "materialising baseline (BLAS GEMM per head + ReLU + weighted sum + partial sort), all "
      "interleaved in one run; checks that every path selects the same keys.");
  bench
      ->add_option("--rows", b->rows, "Rows per document: its last N rows (0 = the whole document)")
      ->capture_default_str();
  bench->add_option("--doc-length", b->doc_length, "Tokens per document")->capture_default_str();
  bench->add_option("--documents", b->documents, "Documents (one segment each)")
      ->capture_default_str();
  b->model.add_to(*bench);
  bench->add_option("--ratio", b->ratio, "Compression ratio")->capture_default_str();
  bench->add_option("--dtype", b->dtype, "fp32, bf16 or both (bf16/fp32 ratio in one run)")
      ->capture_default_str();
  bench->add_option("--isa", b->isa, kBenchIsaHelp)->capture_default_str();
  b->add_to(*bench);
  bench->add_flag("--no-baseline{false}", b->baseline, "Skip the materialising baseline");
  bench->add_flag("--json", b->json,
                  "Print one JSON object: gflops, fraction_of_sgemm, sgemm_gflops, seconds "
                  "(+_min/_max), baseline_seconds, bf16_gflops, bf16_speedup, projection_gflops, "
                  "speedup_vs_baseline, scratch_bytes, verified, ... of the (last) ISA, and "
                  "per_isa: the same fields for each ISA run (score_gflops, "
                  "score_fraction_of_sgemm, bf16_score_gflops: older names of the same)");
  bench->footer(
      "Examples:\n"
      "  sparsecp bench select                      # DeepSeek-V4 indexer shape, 8192-token "
      "document\n"
      "  sparsecp bench select --dtype fp32 --doc-length 4096 --repeats 5 --json\n"
      "Exit status 1 if the paths disagree.");
  bench->callback([b] { run_bench(*b); });
});

}  // namespace
}  // namespace sparsecp::cli
