// `sparsecp bench kl`: the fused indexer KL forward + backward against the same run's BLAS
// sgemm (the shared bench driver: interleaved repeats, medians), fp32 and bf16, checked
// against each other and against the double-precision reference.
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
#include "sparsecp/kernels/indexer_kl.hpp"
#include "sparsecp/planning/workload.hpp"

namespace sparsecp::cli {
namespace {

struct BenchKlCommand : BenchRunFlags {
  int64_t rows = 2048;
  int64_t doc_length = 8192;
  int64_t heads = 64;
  int64_t head_dim = 128;
  int64_t att_heads = 64;
  int64_t att_dim = 512;
  int64_t topk = 512;
  int64_t ratio = 4;
  std::string isa = "auto";
  int64_t verify_rows = 4;
  bool json = false;
};

// The bench's tensors: one document of doc_length tokens, its last `rows` rows, each
// selecting `topk` random visible compressed keys (sorted, -1 padded), real values
// held as bf16-exact fp32 and as bf16.
struct BenchData {
  int64_t rows = 0, keys = 0;
  std::vector<float> q, kidx, w, qatt, katt, sinks;
  std::vector<uint16_t> q16, kidx16, w16, qatt16, katt16;
  std::vector<int32_t> ids;

  IndexerKlInputs inputs(const BenchKlCommand& c, DType dtype) const {
    const bool f = dtype == DType::kFloat32;
    const auto view = [&](const std::vector<float>& a, const std::vector<uint16_t>& b,
                          std::vector<int64_t> shape) {
      return TensorView{f ? static_cast<const void*>(a.data()) : static_cast<const void*>(b.data()),
                        dtype, std::move(shape)};
    };
    IndexerKlInputs in;
    in.index_query = view(q, q16, {1, rows, c.heads, c.head_dim});
    in.index_key = view(kidx, kidx16, {1, keys, c.head_dim});
    in.merge_weight = view(w, w16, {1, rows, c.heads});
    in.attention_query = view(qatt, qatt16, {1, c.att_heads, rows, c.att_dim});
    in.compressed_key = view(katt, katt16, {1, keys, c.att_dim});
    in.sinks = TensorView{sinks.data(), DType::kFloat32, {c.att_heads}};
    in.topk_indices = {ids.data(), IndexDType::kInt32, {1, rows, c.topk}};
    return in;
  }
};

BenchData make_bench_data(const BenchKlCommand& c) {
  BenchData data;
  data.rows = c.rows;
  data.keys = c.doc_length / c.ratio;
  SplitMix64 random(c.seed);
  const auto fill = [&](std::vector<float>& values, std::vector<uint16_t>& bits, int64_t count,
                        double scale) {
    values.resize(static_cast<size_t>(count));
    bits.resize(static_cast<size_t>(count));
    for (size_t i = 0; i < values.size(); ++i) {
      bits[i] = float_to_bf16(static_cast<float>(scale * (2.0 * random.uniform() - 1.0)));
      values[i] = bf16_to_float(bits[i]);
    }
  };
  fill(data.q, data.q16, c.rows * c.heads * c.head_dim, 1.0);
  fill(data.kidx, data.kidx16, data.keys * c.head_dim, 1.0);
  fill(data.w, data.w16, c.rows * c.heads,
       1.0 / std::sqrt(static_cast<double>(c.heads * c.head_dim)));
  fill(data.qatt, data.qatt16, c.att_heads * c.rows * c.att_dim, 1.0);
  fill(data.katt, data.katt16, data.keys * c.att_dim, 1.0);
  std::vector<uint16_t> unused;
  fill(data.sinks, unused, c.att_heads, 1.0);
  data.ids.assign(static_cast<size_t>(c.rows * c.topk), -1);
  std::vector<int32_t> visible;
  for (int64_t r = 0; r < c.rows; ++r) {
    const int64_t position = c.doc_length - c.rows + r;
    const int64_t count = (position + 1) / c.ratio;
    visible.resize(static_cast<size_t>(count));
    for (int64_t k = 0; k < count; ++k) visible[static_cast<size_t>(k)] = static_cast<int32_t>(k);
    const int64_t take = std::min(count, c.topk);
    for (int64_t i = 0; i < take; ++i) {  // partial Fisher-Yates: a random take-subset
      const auto j = i + static_cast<int64_t>(random.next() % static_cast<uint64_t>(count - i));
      std::swap(visible[static_cast<size_t>(i)], visible[static_cast<size_t>(j)]);
    }
    int32_t* row = data.ids.data() + r * c.topk;
    std::copy(visible.begin(), visible.begin() + take, row);
    std::sort(row, row + take);
  }
  return data;
}

// The first `count` rows of the bench data as a case of their own (attention_query is
// head-major, so its rows are gathered).
BenchData first_rows(const BenchKlCommand& c, const BenchData& data, int64_t count) {
  BenchData sub = data;
  sub.rows = count;
  sub.q.resize(static_cast<size_t>(count * c.heads * c.head_dim));
  sub.w.resize(static_cast<size_t>(count * c.heads));
  sub.ids.resize(static_cast<size_t>(count * c.topk));
  sub.qatt.resize(static_cast<size_t>(c.att_heads * count * c.att_dim));
  for (int64_t h = 0; h < c.att_heads; ++h) {
    std::copy_n(data.qatt.begin() + h * data.rows * c.att_dim, count * c.att_dim,
                sub.qatt.begin() + h * count * c.att_dim);
  }
  return sub;
}

struct Run {
  double loss = 0.0;
  std::vector<float> q, k, w;
  explicit Run(const BenchData& data, const BenchKlCommand& c)
      : q(data.q.size()), k(data.kidx.size()), w(data.w.size()) {
    (void)c;
  }
  IndexerKlGradients spans() { return {q, k, w}; }
};

double relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff += (double{got[i]} - want[i]) * (double{got[i]} - want[i]);
    norm += double{want[i]} * want[i];
  }
  return norm == 0.0 ? std::sqrt(diff) : std::sqrt(diff / norm);
}

// Largest relative difference of loss and gradients between two runs.
double run_difference(const Run& a, const Run& b) {
  const double loss = std::abs(a.loss - b.loss) / std::max(std::abs(b.loss), 1e-12);
  return std::max(
      {loss, relative_error(a.q, b.q), relative_error(a.k, b.k), relative_error(a.w, b.w)});
}

// The sizes and options bench kl needs, checked before anything is allocated: a product
// that overflows is an error naming the sizes, and a problem larger than memory fails at
// once instead of after minutes of paging.
void check_bench_kl(const BenchKlCommand& c) {
  SPARSECP_CHECK(c.ratio >= 1 && c.doc_length >= 1 && c.rows >= 1 && c.rows <= c.doc_length,
                 "bench kl needs --ratio >= 1 and 1 <= --rows <= --doc-length, got ratio ", c.ratio,
                 ", rows ", c.rows, ", doc length ", c.doc_length);
  c.validate();
  SPARSECP_CHECK(c.verify_rows >= 0 && c.verify_rows <= c.rows,
                 "--verify-rows must be within [0, --rows], got ", c.verify_rows);
  {
    // Sizes first: a product that overflows is an error naming the sizes, and a problem
    // larger than memory fails at once instead of after minutes of paging.
    BufferBudget budget("bench kl");
    const int64_t keys = c.doc_length / c.ratio;
    budget.add(4 * 3, {c.rows, c.heads, c.head_dim});
    budget.add(4 * 3, {keys, c.head_dim});
    budget.add(4 * 3, {c.rows, c.heads});
    budget.add(4 * 2, {c.att_heads, c.rows, c.att_dim});
    budget.add(4 * 2, {keys, c.att_dim});
    budget.add(4, {c.rows, c.topk});
    budget.add(4 * 3, {c.sgemm_size, c.sgemm_size});
    budget.check_fits_memory();
  }
}

// One ISA's figures and checks (the `per_isa` entries of the JSON).
nlohmann::ordered_json isa_entry(KernelIsa isa, const IndexerKlOptions& options, int threads,
                                 double flops, double sgemm, const IndexerKlInputs& in32,
                                 const IndexerKlInputs& in16, const TimedPath& fp32,
                                 const TimedPath& bf16, double loss, double bf16_difference,
                                 double reference_difference, bool ok) {
  IndexerKlOptions sized = options;
  sized.threads = threads;
  nlohmann::ordered_json e;
  e["isa"] = kernel_isa_name(isa);
  e["seconds"] = fp32.median_seconds();
  e["gflops"] = flops / fp32.median_seconds() / 1e9;
  e["seconds_min"] = fp32.spread().min;
  e["seconds_max"] = fp32.spread().max;
  e["fraction_of_sgemm"] = flops / fp32.median_seconds() / 1e9 / sgemm;
  e["bf16_seconds"] = bf16.median_seconds();
  e["bf16_gflops"] = flops / bf16.median_seconds() / 1e9;
  e["bf16_fraction_of_sgemm"] = flops / bf16.median_seconds() / 1e9 / sgemm;
  e["bf16_speedup"] = fp32.median_seconds() / bf16.median_seconds();
  e["bf16_dot_products"] =
      isa == KernelIsa::kAvx512 && kernel_isa_bf16_dot_products() ? "vdpbf16ps" : "widened";
  e["scratch_bytes"] = indexer_kl_scratch_bytes(in32, sized);
  e["bf16_scratch_bytes"] = indexer_kl_scratch_bytes(in16, sized);
  e["loss"] = loss;
  e["bf16_max_relative_difference"] = bf16_difference;
  e["reference_max_relative_difference"] = reference_difference;
  e["verified"] = ok;
  return e;
}

// The JSON report. The flat fields describe the last (with --isa all: the best) ISA;
// `per_isa` has each.
nlohmann::ordered_json bench_kl_json(const BenchKlCommand& c, int64_t keys, int threads,
                                     double flops, double sgemm,
                                     const nlohmann::ordered_json& per_isa, bool verified) {
  const nlohmann::ordered_json& last = per_isa.back();
  nlohmann::ordered_json out;
  out["rows"] = c.rows;
  out["doc_length"] = c.doc_length;
  out["keys"] = keys;
  out["heads"] = c.heads;
  out["head_dim"] = c.head_dim;
  out["att_heads"] = c.att_heads;
  out["att_dim"] = c.att_dim;
  out["topk"] = c.topk;
  out["threads"] = threads;
  out["repeat"] = c.repeat;
  out["gflop"] = flops / 1e9;
  out["sgemm_gflops"] = sgemm;
  out["sgemm_core"] = blas_core_name();
  for (const auto& [key, value] : last.items()) out[key] = value;
  out["per_isa"] = per_isa;
  out["verified"] = verified;
  return out;
}

// The text report: the problem, the sgemm reference and each ISA's figures.
void print_bench_kl(const BenchKlCommand& c, int64_t keys, const std::vector<KernelIsa>& isas,
                    double flops, double sgemm, int threads,
                    const nlohmann::ordered_json& per_isa) {
  std::string names;
  for (const KernelIsa isa : isas)
    names += std::string(names.empty() ? "" : ", ") + kernel_isa_name(isa);
  std::printf(
      "bench kl: %lld rows (last of a %lld-token document), %lld keys, index heads %lld x %lld, "
      "attention heads %lld x %lld, topk %lld, %d threads, kernel %s, median of %lld\n",
      static_cast<long long>(c.rows), static_cast<long long>(c.doc_length),
      static_cast<long long>(keys), static_cast<long long>(c.heads),
      static_cast<long long>(c.head_dim), static_cast<long long>(c.att_heads),
      static_cast<long long>(c.att_dim), static_cast<long long>(c.topk), threads, names.c_str(),
      static_cast<long long>(c.repeat));
  std::printf("  counted work          %10.1f GFLOP (per selected pair 2*Hm*Dm + 2*H*D + 4*H*D)\n",
              flops / 1e9);
  std::printf("  BLAS sgemm %5lld^3     %10.1f GFLOP/s  (OpenBLAS kernel %s)\n",
              static_cast<long long>(c.sgemm_size), sgemm, blas_core_name().c_str());
  for (const auto& e : per_isa) {
    const std::string isa = e["isa"].get<std::string>();
    std::printf("  fused fp32 %-10s %10.3f s  %8.1f GFLOP/s  (%.0f%% of sgemm)\n", isa.c_str(),
                e["seconds"].get<double>(), e["gflops"].get<double>(),
                100.0 * e["fraction_of_sgemm"].get<double>());
    std::printf("  fused bf16 %-10s %10.3f s  %8.1f GFLOP/s  (%.2fx fp32, %s)\n", isa.c_str(),
                e["bf16_seconds"].get<double>(), e["bf16_gflops"].get<double>(),
                e["bf16_speedup"].get<double>(), e["bf16_dot_products"].get<std::string>().c_str());
    std::printf(
        "  %-10s scratch %.2f MiB fp32, %.2f MiB bf16 (independent of rows); loss %.9g; "
        "bf16 vs fp32 %.1e, first %lld rows vs reference %.1e: %s\n",
        isa.c_str(), static_cast<double>(e["scratch_bytes"].get<size_t>()) / (1 << 20),
        static_cast<double>(e["bf16_scratch_bytes"].get<size_t>()) / (1 << 20),
        e["loss"].get<double>(), e["bf16_max_relative_difference"].get<double>(),
        static_cast<long long>(c.verify_rows), e["reference_max_relative_difference"].get<double>(),
        e["verified"].get<bool>() ? "verified" : "NOT VERIFIED");
  }
}

void run_bench_kl(const BenchKlCommand& c) {
  check_bench_kl(c);
  const BenchData data = make_bench_data(c);
  IndexerKlOptions options;
  options.attention_scale = 1.0 / std::sqrt(static_cast<double>(c.att_dim));
  options.loss_coeff = 1.0;
  options.threads = c.threads;
  const std::vector<KernelIsa> isas = bench_isas(c.isa);
  const IndexerKlInputs in32 = data.inputs(c, DType::kFloat32);
  const IndexerKlInputs in16 = data.inputs(c, DType::kBFloat16);
  const double flops = indexer_kl_flops(in32, options);

  // One fp32 and one bf16 path per ISA, all interleaved with the sgemm in one run.
  struct PerIsa {
    KernelIsa isa;
    IndexerKlOptions options;
    std::unique_ptr<Run> fp32, bf16;
  };
  std::vector<PerIsa> runs;
  for (const KernelIsa isa : isas) {
    IndexerKlOptions o = options;
    o.isa = isa;
    runs.push_back({isa, o, std::make_unique<Run>(data, c), std::make_unique<Run>(data, c)});
  }
  std::vector<TimedPath> paths = {sgemm_path(c.sgemm_size)};
  for (PerIsa& r : runs) {
    const std::string suffix = isas.size() > 1 ? std::string(" ") + kernel_isa_name(r.isa) : "";
    paths.push_back({"fused fp32" + suffix,
                     [&] { r.fp32->loss = indexer_kl_loss(in32, r.options, r.fp32->spans()); }});
    paths.push_back({"fused bf16" + suffix,
                     [&] { r.bf16->loss = indexer_kl_loss(in16, r.options, r.bf16->spans()); }});
  }
  const Progress progress("sparsecp bench kl", c.json);
  time_interleaved(paths, c.repeat, &progress);
  const double sgemm = sgemm_gflops(paths[0], c.sgemm_size);
  const int threads = c.threads > 0 ? c.threads : omp_get_max_threads();

  // Checks per ISA: fp32 against bf16 (the same values), and the first rows against the
  // double reference (bounds as in tests/kernels/indexer_kl_test.cpp, looser for
  // real-valued q).
  const BenchData sub = first_rows(c, data, c.verify_rows);
  Run reference(sub, c);
  if (c.verify_rows > 0) {
    reference.loss =
        indexer_kl_loss_reference(sub.inputs(c, DType::kFloat32), options, reference.spans());
  }
  bool verified = true;
  nlohmann::ordered_json per_isa = nlohmann::ordered_json::array();
  for (size_t i = 0; i < runs.size(); ++i) {
    PerIsa& r = runs[i];
    const double bf16_difference = run_difference(*r.bf16, *r.fp32);
    double reference_difference = 0.0;
    if (c.verify_rows > 0) {
      Run fast(sub, c);
      fast.loss = indexer_kl_loss(sub.inputs(c, DType::kFloat32), r.options, fast.spans());
      reference_difference = run_difference(fast, reference);
    }
    const bool ok =
        std::isfinite(r.fp32->loss) && bf16_difference <= 1e-4 && reference_difference <= 1e-4;
    verified = verified && ok;
    const nlohmann::ordered_json e =
        isa_entry(r.isa, r.options, threads, flops, sgemm, in32, in16, paths[1 + 2 * i],
                  paths[2 + 2 * i], r.fp32->loss, bf16_difference, reference_difference, ok);
    per_isa.push_back(e);
  }
  const nlohmann::ordered_json out =
      bench_kl_json(c, data.keys, threads, flops, sgemm, per_isa, verified);
  if (c.json) {
    std::cout << out.dump() << "\n";
  } else {
    print_bench_kl(c, data.keys, isas, flops, sgemm, threads, per_isa);
  }
  if (!verified) throw ExitStatus{1};
}

const Registration registration("bench", [](CLI::App& app) {
  auto b = std::make_shared<BenchKlCommand>();
  CLI::App* bench = bench_command(app).add_subcommand(
      "kl",
      "Time the fused indexer KL loss (forward + the three gradients) on generated data, fp32 "
      "and bf16, against the BLAS's own square sgemm rate in the same run (interleaved "
      "repetitions, medians); checks bf16 against fp32 and the first rows against the "
      "double-precision reference.");
  bench->add_option("--rows", b->rows, "Query rows: the last N rows of the document")
      ->capture_default_str();
  bench->add_option("--doc-length", b->doc_length, "Tokens of the document")->capture_default_str();
  bench->add_option("--ratio", b->ratio, "Compression ratio (keys = doc length / ratio)")
      ->capture_default_str();
  bench->add_option("--heads", b->heads, "Index heads H")->capture_default_str();
  bench->add_option("--head-dim", b->head_dim, "Index head dim D")->capture_default_str();
  bench->add_option("--att-heads", b->att_heads, "Attention heads Hm")->capture_default_str();
  bench->add_option("--att-dim", b->att_dim, "Attention head dim Dm")->capture_default_str();
  bench->add_option("--topk", b->topk, "Selected keys per row")->capture_default_str();
  bench->add_option("--isa", b->isa, kBenchIsaHelp)->capture_default_str();
  b->add_to(*bench);
  bench->add_option("--verify-rows", b->verify_rows, "Rows checked against the reference")
      ->capture_default_str();
  bench->add_flag("--json", b->json,
                  "Print one JSON object: seconds, gflops, sgemm_gflops, fraction_of_sgemm, "
                  "bf16_seconds, bf16_speedup, scratch_bytes, verified, ... of the (last) ISA, "
                  "and per_isa: the same fields for each ISA run");
  bench->footer(
      "Examples:\n"
      "  sparsecp bench kl               # DeepSeek-V4 shapes, last 2048 rows of an 8192-token "
      "document\n"
      "  sparsecp bench kl --rows 4096 --repeats 5 --json\n"
      "  sparsecp bench kl --isa all --rows 256   # every ISA this CPU runs, side by side\n"
      "Exit status 1 if a check fails. OpenBLAS chooses its sgemm kernel by CPU model and falls "
      "back to an old SSE3 one on CPUs it does not know (see sgemm_core); force one with e.g. "
      "OPENBLAS_CORETYPE=SkylakeX.");
  bench->callback([b] { run_bench_kl(*b); });
});

}  // namespace
}  // namespace sparsecp::cli
