// `sparsecp select`: Lightning Indexer top-k on .npy tensors.
// `sparsecp bench select`: the fused kernel against BLAS and a materialising baseline.
#include <cblas.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "command.hpp"
#include "problem_size.hpp"
#include "sparsecp/error.hpp"
#include "sparsecp/io/npy.hpp"
#include "sparsecp/kernels/bf16.hpp"
#include "sparsecp/kernels/select.hpp"
#include "sparsecp/planning/workload.hpp"

namespace sparsecp::cli {
namespace {

// ---------------------------------------------------------------------------------------
// select

struct SelectCommand {
  std::string keys, weights, q, q_residual, wq, cos, sin, segments, out;
  std::string wq_layout = "in-out";
  std::string isa = "auto";
  int64_t ratio = 4;
  int64_t topk = 512;
  int threads = 0;
  bool reference = false;
};

KernelIsa parse_isa(const std::string& name) {
  for (const KernelIsa isa :
       {KernelIsa::kAuto, KernelIsa::kPortable, KernelIsa::kAvx2, KernelIsa::kAvx512}) {
    if (name == kernel_isa_name(isa)) return isa;
  }
  SPARSECP_FAIL("--isa must be auto, portable, avx2 or avx512, got '", name, "'");
}

// A float tensor of rank `rank` (or rank + 1 with a leading batch dim of 1).
struct Tensor {
  NpyArray array;
  std::vector<int64_t> shape;  // without the batch dim
  MatrixView view(int64_t rows, int64_t cols) const {
    return {array.bytes.data(),
            array.dtype == NpyDType::kFloat32 ? DType::kFloat32 : DType::kBFloat16, rows, cols};
  }
};

Tensor load_tensor(const std::string& path, const char* flag, size_t rank, const char* layout) {
  Tensor t{read_npy(path), {}};
  SPARSECP_CHECK(t.array.dtype == NpyDType::kFloat32 || t.array.dtype == NpyDType::kBFloat16, flag,
                 " ", path, ": dtype ", npy_dtype_name(t.array.dtype),
                 " is not float32 or bfloat16");
  t.shape = t.array.shape;
  if (t.shape.size() == rank + 1) {
    SPARSECP_CHECK(t.shape[0] == 1, "Packed Lightning Indexer requires batch size one");
    t.shape.erase(t.shape.begin());
  }
  SPARSECP_CHECK(t.shape.size() == rank, flag, " ", path, ": expected shape ", layout,
                 " (optionally with a leading batch dim of 1), got ", t.shape.size(),
                 " dimensions");
  return t;
}

// A value for an error message. dump() recurses once per nesting level, so a deeply
// nested (hostile) value is named by its type instead of printed.
std::string brief_json(const nlohmann::json& value) {
  const bool flat = !value.is_structured() ||
                    std::none_of(value.begin(), value.end(),
                                 [](const nlohmann::json& v) { return v.is_structured(); });
  if (!flat) return std::string("a nested ") + value.type_name();
  std::string text = value.dump();
  return text.size() > 200 ? text.substr(0, 200) + "..." : text;
}

std::vector<Segment> load_segments(const std::string& path) {
  std::ifstream file(path);
  SPARSECP_CHECK(file.good(), "--segments ", path, ": cannot open");
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(file);
  } catch (const nlohmann::json::exception& e) {
    SPARSECP_FAIL("--segments ", path, ": invalid JSON: ", e.what());
  }
  if (json.is_object() && json.contains("segments")) json = json["segments"];
  SPARSECP_CHECK(json.is_array(), "--segments ", path,
                 ": expected a list of [q_begin, q_end, key_begin, key_end, residual] lists");
  std::vector<Segment> segments;
  for (const auto& item : json) {
    SPARSECP_CHECK(item.is_array() && item.size() == 5 &&
                       std::all_of(item.begin(), item.end(),
                                   [](const auto& v) { return v.is_number_integer(); }),
                   "--segments ", path, ": segment ", segments.size(),
                   " is not a list of 5 integers: ", brief_json(item));
    segments.push_back({item[0].get<int64_t>(), item[1].get<int64_t>(), item[2].get<int64_t>(),
                        item[3].get<int64_t>(), item[4].get<int64_t>()});
  }
  return segments;
}

void run_select(const SelectCommand& c) {
  SPARSECP_CHECK(c.q.empty() != c.q_residual.empty(),
                 "select needs exactly one of --q and --q-residual (with --wq, --cos, --sin)");
  const Tensor keys = load_tensor(c.keys, "--keys", 2, "[keys, head_dim]");
  const Tensor weights = load_tensor(c.weights, "--weights", 2, "[rows, heads]");
  const std::vector<Segment> segments = load_segments(c.segments);
  SelectConfig config;
  config.heads = weights.shape[1];
  config.head_dim = keys.shape[1];
  config.topk = c.topk;
  config.ratio = c.ratio;
  config.threads = c.threads;
  config.isa = parse_isa(c.isa);
  const int64_t rows = weights.shape[0];
  int64_t out_size = 0;
  SPARSECP_CHECK(
      !__builtin_mul_overflow(std::max<int64_t>(rows, 0), std::max<int64_t>(c.topk, 0), &out_size),
      "--topk ", c.topk, " for ", rows, " rows: the [rows, topk] output overflows 64 bits");
  std::vector<int32_t> out(static_cast<size_t>(out_size));
  const MatrixView key_view = keys.view(keys.shape[0], keys.shape[1]);
  const MatrixView weight_view = weights.view(rows, config.heads);
  if (!c.q.empty()) {
    const Tensor q = load_tensor(c.q, "--q", 3, "[rows, heads, head_dim]");
    SPARSECP_CHECK(
        q.shape[0] == rows && q.shape[1] == config.heads && q.shape[2] == config.head_dim, "--q ",
        c.q, ": expected shape [", rows, ", ", config.heads, ", ", config.head_dim,
        "] (rows and heads from --weights, head_dim from --keys), got [", q.shape[0], ", ",
        q.shape[1], ", ", q.shape[2], "]");
    const MatrixView q_view = q.view(rows, config.heads * config.head_dim);
    config.rope_dim = 0;
    if (c.reference) {
      select_topk_reference(q_view, weight_view, key_view, segments, config, out);
    } else {
      select_topk(q_view, weight_view, key_view, segments, config, out);
    }
  } else {
    SPARSECP_CHECK(!c.wq.empty() && !c.cos.empty() && !c.sin.empty(),
                   "--q-residual needs --wq, --cos and --sin");
    const Tensor qr = load_tensor(c.q_residual, "--q-residual", 2, "[rows, q_rank]");
    const Tensor wq = load_tensor(c.wq, "--wq", 2, "[q_rank, heads * head_dim]");
    const Tensor cos = load_tensor(c.cos, "--cos", 2, "[rows, rope_dim / 2]");
    const Tensor sin = load_tensor(c.sin, "--sin", 2, "[rows, rope_dim / 2]");
    SPARSECP_CHECK(c.wq_layout == "in-out" || c.wq_layout == "out-in",
                   "--wq-layout must be in-out or out-in, got '", c.wq_layout, "'");
    SPARSECP_CHECK(qr.shape[0] == rows, "--q-residual ", c.q_residual, " has ", qr.shape[0],
                   " rows but --weights has ", rows);
    config.rope_dim = 2 * cos.shape[1];
    const WeightLayout layout =
        c.wq_layout == "in-out" ? WeightLayout::kInOut : WeightLayout::kOutIn;
    const auto run = c.reference ? select_worker_rows_reference : select_worker_rows;
    run(qr.view(rows, qr.shape[1]), weight_view, cos.view(cos.shape[0], cos.shape[1]),
        sin.view(sin.shape[0], sin.shape[1]), wq.view(wq.shape[0], wq.shape[1]), key_view, segments,
        config, out, layout);
  }
  const std::vector<int64_t> shape{rows, c.topk};
  write_npy(c.out, NpyDType::kInt32, shape, out.data());
  int64_t selected = 0;
  for (const int32_t id : out) selected += id >= 0;
  std::printf("wrote %s: int32 [%lld, %lld], %lld ids selected over %zu segments\n", c.out.c_str(),
              static_cast<long long>(rows), static_cast<long long>(c.topk),
              static_cast<long long>(selected), segments.size());
}

// ---------------------------------------------------------------------------------------
// bench select

struct BenchCommand {
  int64_t rows = 0;  // 0 = the whole document
  int64_t doc_length = 8192;
  int64_t documents = 1;
  int64_t heads = 64;
  int64_t head_dim = 128;
  int64_t q_rank = 1536;
  int64_t rope_dim = 64;
  int64_t topk = 512;
  int64_t ratio = 4;
  std::string dtype = "both";
  std::string isa = "auto";
  int threads = 0;
  int64_t repeat = 3;
  int64_t sgemm_size = 2048;
  bool baseline = true;
  bool json = false;
  uint64_t seed = 1;
};

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

double time_once(const std::function<void()>& work) {
  const auto start = std::chrono::steady_clock::now();
  work();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

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

void run_bench(const BenchCommand& c) {
  SPARSECP_CHECK(c.documents >= 1 && c.doc_length >= 1,
                 "--documents and --doc-length must be positive");
  SPARSECP_CHECK(c.rows >= 0 && c.rows <= c.doc_length, "--rows must be within [0, --doc-length ",
                 c.doc_length, "], got ", c.rows);
  SPARSECP_CHECK(c.repeat >= 1, "--repeat must be at least 1, got ", c.repeat);
  SPARSECP_CHECK(c.repeat <= kMaxRepeat, "--repeat must be at most ", kMaxRepeat, ", got ",
                 c.repeat);
  SPARSECP_CHECK(c.q_rank >= 1 && c.sgemm_size >= 1, "--q-rank and --sgemm-size must be positive");
  SPARSECP_CHECK(c.dtype == "fp32" || c.dtype == "bf16" || c.dtype == "both",
                 "--dtype must be fp32, bf16 or both, got '", c.dtype, "'");
  SelectConfig config;
  config.heads = c.heads;
  config.head_dim = c.head_dim;
  config.rope_dim = c.rope_dim;
  config.topk = c.topk;
  config.ratio = c.ratio;
  config.threads = c.threads;
  config.isa = parse_isa(c.isa);
  validate_select_config(config);
  {
    // Sizes first (problem_size.hpp).
    ProblemSize size("bench select",
                     "--documents, --doc-length, --heads, --head-dim, --q-rank, --sgemm-size");
    const int64_t rows = size.product({c.rows == 0 ? c.doc_length : c.rows, c.documents});
    const int64_t bank = size.product({c.doc_length / c.ratio, c.documents});
    const int64_t width = size.product({c.heads, c.head_dim});
    for (const auto& buffer : {std::initializer_list<int64_t>{rows, width, 3},
                               {rows, c.heads, 2},
                               {bank, c.head_dim, 2},
                               {rows, c.q_rank, 2},
                               {c.q_rank, width, 2},
                               {rows, c.rope_dim},
                               {rows, c.topk, 3},
                               {c.sgemm_size, c.sgemm_size, 3}}) {
      size.add_buffer(buffer, 4);
    }
    size.add_buffer({c.documents}, static_cast<int64_t>(sizeof(Segment)));
    size.check_memory();
  }
  const int64_t per_doc = c.rows == 0 ? c.doc_length : c.rows;
  const int64_t rows = per_doc * c.documents;
  const int64_t keys_per_doc = c.doc_length / c.ratio;
  const int64_t bank = keys_per_doc * c.documents;
  const int64_t width = c.heads * c.head_dim;
  std::vector<Segment> segments;
  for (int64_t d = 0; d < c.documents; ++d) {
    segments.push_back({d * per_doc, (d + 1) * per_doc, d * keys_per_doc, (d + 1) * keys_per_doc,
                        c.doc_length % c.ratio});
  }
  // Small-integer inputs: every score is exact, so fused, bf16 and baseline results must
  // agree bit for bit (the run checks it).
  SplitMix64 random(c.seed);
  const auto fill = [&](std::vector<float>& v, size_t n, int bound) {
    v.resize(n);
    for (float& x : v)
      x = static_cast<float>(static_cast<int>(random.next() % (2 * bound + 1)) - bound);
  };
  std::vector<float> q, weights, keys;
  fill(q, static_cast<size_t>(rows * width), 2);
  fill(weights, static_cast<size_t>(rows * c.heads), 2);
  fill(keys, static_cast<size_t>(bank * c.head_dim), 2);
  std::vector<uint16_t> q16(q.size()), keys16(keys.size());
  std::transform(q.begin(), q.end(), q16.begin(), float_to_bf16);
  std::transform(keys.begin(), keys.end(), keys16.begin(), float_to_bf16);
  const bool run_fp32 = c.dtype != "bf16", run_bf16 = c.dtype != "fp32";

  // Projection inputs (real-valued; only timed).
  std::vector<float> qr(static_cast<size_t>(rows * c.q_rank)),
      wq(static_cast<size_t>(c.q_rank * width));
  std::vector<float> cos(static_cast<size_t>(rows * c.rope_dim / 2)), sin(cos.size());
  for (float& x : qr) x = static_cast<float>(random.uniform() - 0.5);
  for (float& x : wq) x = static_cast<float>(random.uniform() - 0.5) * 0.05f;
  for (size_t i = 0; i < cos.size(); ++i) {
    cos[i] = static_cast<float>(std::cos(0.001 * static_cast<double>(i)));
    sin[i] = static_cast<float>(std::sin(0.001 * static_cast<double>(i)));
  }
  std::vector<uint16_t> qr16(qr.size()), wq16(wq.size());
  std::transform(qr.begin(), qr.end(), qr16.begin(), float_to_bf16);
  std::transform(wq.begin(), wq.end(), wq16.begin(), float_to_bf16);
  std::vector<float> projected(static_cast<size_t>(rows * width));

  // Square sgemm for the machine's BLAS rate.
  const int64_t n = c.sgemm_size;
  std::vector<float> ga(static_cast<size_t>(n * n), 0.5f), gb(ga.size(), 0.25f), gc(ga.size());

  std::vector<int32_t> fused(static_cast<size_t>(rows * c.topk)), fused16(fused.size()),
      base(fused.size());
  std::vector<double> t_fused, t_bf16, t_base, t_proj, t_proj16, t_sgemm;
  const MatrixView wv = MatrixView::f32(weights.data(), rows, c.heads);
  for (int64_t i = 0; i < c.repeat; ++i) {  // interleaved, so drifts in machine load hit all
    t_sgemm.push_back(time_once([&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(n),
                  static_cast<int>(n), static_cast<int>(n), 1.0f, ga.data(), static_cast<int>(n),
                  gb.data(), static_cast<int>(n), 0.0f, gc.data(), static_cast<int>(n));
    }));
    if (run_fp32) {
      t_fused.push_back(time_once([&] {
        select_topk(MatrixView::f32(q.data(), rows, width), wv,
                    MatrixView::f32(keys.data(), bank, c.head_dim), segments, config, fused);
      }));
      t_proj.push_back(time_once([&] {
        project_index_query(MatrixView::f32(qr.data(), rows, c.q_rank),
                            MatrixView::f32(wq.data(), c.q_rank, width),
                            MatrixView::f32(cos.data(), rows, c.rope_dim / 2),
                            MatrixView::f32(sin.data(), rows, c.rope_dim / 2), config, projected);
      }));
    }
    if (run_bf16) {
      t_bf16.push_back(time_once([&] {
        select_topk(MatrixView::bf16(q16.data(), rows, width), wv,
                    MatrixView::bf16(keys16.data(), bank, c.head_dim), segments, config, fused16);
      }));
      t_proj16.push_back(time_once([&] {
        project_index_query(MatrixView::bf16(qr16.data(), rows, c.q_rank),
                            MatrixView::bf16(wq16.data(), c.q_rank, width),
                            MatrixView::f32(cos.data(), rows, c.rope_dim / 2),
                            MatrixView::f32(sin.data(), rows, c.rope_dim / 2), config, projected);
      }));
    }
    if (c.baseline) {
      t_base.push_back(
          time_once([&] { baseline_select(q, weights, keys, segments, config, base); }));
    }
  }
  const double flops = select_score_flops(segments, config);
  const double proj_flops =
      2.0 * static_cast<double>(rows) * static_cast<double>(c.q_rank) * static_cast<double>(width);
  const double sgemm_gflops = 2.0 * static_cast<double>(n) * static_cast<double>(n) *
                              static_cast<double>(n) / median(t_sgemm) / 1e9;
  bool verified = true;
  if (run_fp32 && run_bf16) verified = verified && fused == fused16;
  if (c.baseline) verified = verified && (run_fp32 ? fused : fused16) == base;
  const int threads = c.threads > 0 ? c.threads : omp_get_max_threads();
  const KernelIsa isa = config.isa == KernelIsa::kAuto ? best_kernel_isa() : config.isa;

  nlohmann::ordered_json out;
  out["rows"] = rows;
  out["doc_length"] = c.doc_length;
  out["documents"] = c.documents;
  out["heads"] = c.heads;
  out["head_dim"] = c.head_dim;
  out["q_rank"] = c.q_rank;
  out["topk"] = c.topk;
  out["ratio"] = c.ratio;
  out["threads"] = threads;
  out["isa"] = kernel_isa_name(isa);
  out["repeat"] = c.repeat;
  out["score_gflop"] = flops / 1e9;
  out["sgemm_gflops"] = sgemm_gflops;
  if (run_fp32) {
    out["seconds"] = median(t_fused);
    out["score_gflops"] = flops / median(t_fused) / 1e9;
    out["score_fraction_of_sgemm"] = flops / median(t_fused) / 1e9 / sgemm_gflops;
    out["projection_seconds"] = median(t_proj);
    out["projection_gflops"] = proj_flops / median(t_proj) / 1e9;
  }
  if (run_bf16) {
    out["bf16_seconds"] = median(t_bf16);
    out["bf16_score_gflops"] = flops / median(t_bf16) / 1e9;
    out["bf16_projection_gflops"] = proj_flops / median(t_proj16) / 1e9;
    if (!run_fp32) {
      out["seconds"] = median(t_bf16);
      out["score_gflops"] = flops / median(t_bf16) / 1e9;
    }
  }
  if (run_fp32 && run_bf16) out["bf16_speedup"] = median(t_fused) / median(t_bf16);
  if (c.baseline) {
    out["baseline_seconds"] = median(t_base);
    out["speedup_vs_baseline"] = median(t_base) / (run_fp32 ? median(t_fused) : median(t_bf16));
  }
  out["scratch_bytes"] =
      select_scratch_bytes(config, run_bf16 ? DType::kBFloat16 : DType::kFloat32, threads);
  out["verified"] = verified;
  if (c.json) {
    std::cout << out.dump() << "\n";
  } else {
    std::printf(
        "bench select: %lld rows (%lld document(s) of %lld tokens), %lld keys, heads %lld x %lld, "
        "topk %lld, ratio %lld, %d threads, %s kernel, median of %lld\n",
        static_cast<long long>(rows), static_cast<long long>(c.documents),
        static_cast<long long>(c.doc_length), static_cast<long long>(bank),
        static_cast<long long>(c.heads), static_cast<long long>(c.head_dim),
        static_cast<long long>(c.topk), static_cast<long long>(c.ratio), threads,
        kernel_isa_name(isa), static_cast<long long>(c.repeat));
    std::printf("  score work           %10.1f GFLOP (2*heads*head_dim per visible pair)\n",
                flops / 1e9);
    std::printf("  BLAS sgemm %5lld^3    %10.1f GFLOP/s\n", static_cast<long long>(n),
                sgemm_gflops);
    if (run_fp32) {
      std::printf("  fused fp32           %10.3f s  %8.1f GFLOP/s  (%.0f%% of sgemm)\n",
                  median(t_fused), flops / median(t_fused) / 1e9,
                  100.0 * flops / median(t_fused) / 1e9 / sgemm_gflops);
      std::printf("  projection fp32      %10.3f s  %8.1f GFLOP/s\n", median(t_proj),
                  proj_flops / median(t_proj) / 1e9);
    }
    if (run_bf16) {
      std::printf("  fused bf16           %10.3f s  %8.1f GFLOP/s", median(t_bf16),
                  flops / median(t_bf16) / 1e9);
      if (run_fp32) std::printf("  (%.2fx fp32)", median(t_fused) / median(t_bf16));
      std::printf("\n  projection bf16      %10.3f s  %8.1f GFLOP/s\n", median(t_proj16),
                  proj_flops / median(t_proj16) / 1e9);
    }
    if (c.baseline) {
      std::printf("  baseline (GEMM/head) %10.3f s  fused is %.2fx faster\n", median(t_base),
                  out["speedup_vs_baseline"].get<double>());
    }
    std::printf("  scratch memory       %10.2f MiB (threads x tile, independent of rows)\n",
                static_cast<double>(out["scratch_bytes"].get<size_t>()) / (1 << 20));
    std::printf("  results %s\n", verified ? "identical across fused fp32, fused bf16 and baseline"
                                           : "DIFFER between paths");
  }
  if (!verified) throw ExitStatus{1};
}

CLI::App* bench_parent(CLI::App& app) {
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    if (sub->get_name() == "bench") return sub;
  }
  CLI::App* bench = app.add_subcommand(
      "bench", "Time sparsecp's kernels on generated data (see 'sparsecp bench <kernel> --help')");
  bench->require_subcommand(1);
  return bench;
}

const Registration registration("select", [](CLI::App& app) {
  auto c = std::make_shared<SelectCommand>();
  CLI::App* sub = app.add_subcommand(
      "select",
      "Lightning Indexer top-k over packed segments on .npy tensors: per row, the topk keys "
      "with the highest sum_h w[h] * ReLU(q[h] . k), ties to the lower key id, sorted "
      "ascending, padded with -1 (seed `_select_indices`). Float inputs may be float32 or "
      "bfloat16 ('bfloat16' / '|V2' descriptors); a leading batch dim must be 1.");
  sub->add_option("--keys", c->keys, "Index K bank [keys, head_dim] (.npy)")->required();
  sub->add_option("--weights", c->weights, "Merge weights [rows, heads] (.npy), already scaled")
      ->required();
  sub->add_option("--q", c->q, "Index Q [rows, heads, head_dim] (.npy); or use --q-residual");
  sub->add_option("--q-residual", c->q_residual,
                  "Low-rank query residual qr [rows, q_rank] (.npy): q = RoPE(qr @ Wq_b)");
  sub->add_option("--wq", c->wq, "With --q-residual: Wq_b (.npy), layout per --wq-layout");
  sub->add_option("--wq-layout", c->wq_layout,
                  "in-out: Wq_b is [q_rank, heads*head_dim]; out-in: [heads*head_dim, q_rank] "
                  "(PyTorch q_b_proj.weight)")
      ->capture_default_str();
  sub->add_option("--cos", c->cos, "With --q-residual: RoPE cos [rows, rope_dim/2] (.npy)");
  sub->add_option("--sin", c->sin, "With --q-residual: RoPE sin [rows, rope_dim/2] (.npy)");
  sub->add_option(
         "--segments", c->segments,
         "JSON list of [q_begin, q_end, key_begin, key_end, residual] (a route's segments; "
         "an object with a 'segments' key, as 'sparsecp route --json' prints, also works)")
      ->required();
  sub->add_option("--ratio", c->ratio, "Compression ratio (raw tokens per key)")
      ->capture_default_str();
  sub->add_option("--topk", c->topk, "Keys selected per row")->capture_default_str();
  sub->add_option("--out", c->out, "Output .npy: int32 [rows, topk]")->required();
  sub->add_option("--threads", c->threads,
                  "Worker threads (0 = OpenMP default); never changes results")
      ->capture_default_str();
  sub->add_option("--isa", c->isa, "Kernel: auto, portable, avx2 or avx512")->capture_default_str();
  sub->add_flag("--reference", c->reference, "Use the plain reference implementation (slow)");
  sub->footer(
      "Examples:\n"
      "  sparsecp route --lengths 5000,300,2699,1 --cp 4 --rank 1 --json > route.json\n"
      "  sparsecp select --keys k.npy --weights w.npy --q q.npy --segments route.json \\\n"
      "      --ratio 4 --topk 512 --out idx.npy\n"
      "  sparsecp select --keys k.npy --weights w.npy --q-residual qr.npy --wq wq_b.npy \\\n"
      "      --wq-layout out-in --cos cos.npy --sin sin.npy --segments route.json --out idx.npy");
  sub->callback([c] { run_select(*c); });
});

// Registered under "bench" so that the tool knows `sparsecp bench ...` as a command;
// other `bench <kernel>` commands share the parent through bench_parent().
const Registration bench_registration("bench", [](CLI::App& app) {
  auto b = std::make_shared<BenchCommand>();
  CLI::App* bench = bench_parent(app)->add_subcommand(
      "select",
      "Time worker-side selection on generated small-integer data: fused score+top-k (fp32 "
      "and bf16), Index-Q projection (BLAS + RoPE), the BLAS's own square sgemm rate and a "
      "materialising baseline (BLAS GEMM per head + ReLU + weighted sum + partial sort), all "
      "in one run; checks that every path selects the same keys.");
  bench
      ->add_option("--rows", b->rows, "Rows per document: its last N rows (0 = the whole document)")
      ->capture_default_str();
  bench->add_option("--doc-length", b->doc_length, "Tokens per document")->capture_default_str();
  bench->add_option("--documents", b->documents, "Documents (one segment each)")
      ->capture_default_str();
  bench->add_option("--heads", b->heads, "Index heads")->capture_default_str();
  bench->add_option("--head-dim", b->head_dim, "Head dim")->capture_default_str();
  bench->add_option("--q-rank", b->q_rank, "Query LoRA rank (projection input width)")
      ->capture_default_str();
  bench->add_option("--rope-dim", b->rope_dim, "Rotated channels per head")->capture_default_str();
  bench->add_option("--topk", b->topk, "Keys selected per row")->capture_default_str();
  bench->add_option("--ratio", b->ratio, "Compression ratio")->capture_default_str();
  bench->add_option("--dtype", b->dtype, "fp32, bf16 or both (bf16/fp32 ratio in one run)")
      ->capture_default_str();
  bench->add_option("--isa", b->isa, "Kernel: auto, portable, avx2 or avx512")
      ->capture_default_str();
  bench->add_option("--threads", b->threads, "Threads (0 = OpenMP default)")->capture_default_str();
  bench->add_option("--repeat", b->repeat, "Repetitions (interleaved); medians are reported")
      ->capture_default_str();
  bench->add_option("--sgemm-size", b->sgemm_size, "N of the reference N x N x N sgemm")
      ->capture_default_str();
  bench->add_option("--seed", b->seed, "Seed of the generated data")->capture_default_str();
  bench->add_flag("--no-baseline{false}", b->baseline, "Skip the materialising baseline");
  bench->add_flag("--json", b->json,
                  "Print one JSON object: score_gflops, sgemm_gflops, seconds, baseline_seconds, "
                  "bf16_score_gflops, bf16_speedup, projection_gflops, speedup_vs_baseline, "
                  "scratch_bytes, verified, ...");
  bench->footer(
      "Examples:\n"
      "  sparsecp bench select                      # DeepSeek-V4 indexer shape, 8192-token "
      "document\n"
      "  sparsecp bench select --dtype fp32 --doc-length 4096 --repeat 5 --json\n"
      "Exit status 1 if the paths disagree.");
  bench->callback([b] { run_bench(*b); });
});

}  // namespace
}  // namespace sparsecp::cli
