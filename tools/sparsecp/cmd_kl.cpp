// `sparsecp kl`: the indexer's sparse KL loss and its three gradients on .npy tensors.
// `sparsecp bench kl`: the fused forward+backward against the same run's BLAS sgemm.
#include <cblas.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "command.hpp"
#include "sparsecp/error.hpp"
#include "sparsecp/io/npy.hpp"
#include "sparsecp/kernels/bf16.hpp"
#include "sparsecp/kernels/indexer_kl.hpp"
#include "sparsecp/planning/workload.hpp"

namespace sparsecp::cli {
namespace {

KernelIsa parse_kl_isa(const std::string& name) {
  for (const KernelIsa isa : {KernelIsa::kAuto, KernelIsa::kPortable, KernelIsa::kAvx512}) {
    if (name == kernel_isa_name(isa)) return isa;
  }
  SPARSECP_FAIL("--isa must be auto, portable or avx512, got '", name, "'");
}

// ---------------------------------------------------------------------------------------
// kl

struct KlCommand {
  std::string index_query, index_key, weights, attention_query, attention_key, indices, sinks;
  std::string out_dir;
  double attention_scale = 0.0;
  double loss_coeff = 0.0;
  int64_t main_key_offset = 0;
  int threads = 0;
  std::string isa = "auto";
  bool reference = false;
  bool json = false;
};

// A float .npy as a view (shape as stored; the library checks ranks and extents).
struct FloatInput {
  NpyArray array;
  TensorView view() const {
    return {array.bytes.data(),
            array.dtype == NpyDType::kFloat32 ? DType::kFloat32 : DType::kBFloat16, array.shape};
  }
};

FloatInput load_float(const std::string& path, const char* flag) {
  FloatInput input{read_npy(path)};
  SPARSECP_CHECK(
      input.array.dtype == NpyDType::kFloat32 || input.array.dtype == NpyDType::kBFloat16, flag,
      " ", path, ": dtype ", npy_dtype_name(input.array.dtype),
      " is not float32 or bfloat16 (convert with .astype(np.float32))");
  return input;
}

void run_kl(const KlCommand& c) {
  SPARSECP_CHECK(!c.out_dir.empty() || c.json, "kl needs --out-dir, --json or both");
  const FloatInput q = load_float(c.index_query, "--index-query");
  const FloatInput kidx = load_float(c.index_key, "--index-key");
  const FloatInput w = load_float(c.weights, "--weights");
  const FloatInput qatt = load_float(c.attention_query, "--attention-query");
  const FloatInput katt = load_float(c.attention_key, "--attention-key");
  const FloatInput sinks = load_float(c.sinks, "--sinks");
  const NpyArray ids = read_npy(c.indices);
  SPARSECP_CHECK(ids.dtype == NpyDType::kInt32 || ids.dtype == NpyDType::kInt64, "--indices ",
                 c.indices, ": dtype ", npy_dtype_name(ids.dtype), " is not int32 or int64");

  IndexerKlInputs in;
  in.index_query = q.view();
  in.index_key = kidx.view();
  in.merge_weight = w.view();
  in.attention_query = qatt.view();
  in.compressed_key = katt.view();
  in.topk_indices = {ids.bytes.data(),
                     ids.dtype == NpyDType::kInt32 ? IndexDType::kInt32 : IndexDType::kInt64,
                     ids.shape};
  in.sinks = sinks.view();
  IndexerKlOptions options;
  options.attention_scale = c.attention_scale;
  options.loss_coeff = c.loss_coeff;
  options.main_key_offset = c.main_key_offset;
  options.threads = c.threads;
  options.isa = parse_kl_isa(c.isa);

  std::vector<float> grad_q(static_cast<size_t>(q.array.elements()));
  std::vector<float> grad_k(static_cast<size_t>(kidx.array.elements()));
  std::vector<float> grad_w(static_cast<size_t>(w.array.elements()));
  const IndexerKlGradients gradients{grad_q, grad_k, grad_w};
  const double loss = c.reference ? indexer_kl_loss_reference(in, options, gradients)
                                  : indexer_kl_loss(in, options, gradients);

  if (!c.out_dir.empty()) {
    std::error_code error;
    std::filesystem::create_directories(c.out_dir, error);
    SPARSECP_CHECK(!error, "--out-dir ", c.out_dir, ": cannot create the directory (",
                   error.message(), ")");
    const auto path = [&](const char* name) {
      return (std::filesystem::path(c.out_dir) / name).string();
    };
    write_npy(path("loss.npy"), NpyDType::kFloat64, std::vector<int64_t>{}, &loss);
    write_npy(path("grad_index_query.npy"), NpyDType::kFloat32, q.array.shape, grad_q.data());
    write_npy(path("grad_index_key.npy"), NpyDType::kFloat32, kidx.array.shape, grad_k.data());
    write_npy(path("grad_weights.npy"), NpyDType::kFloat32, w.array.shape, grad_w.data());
  }
  if (c.json) {
    nlohmann::ordered_json out;
    out["loss"] = loss;
    std::cout << out.dump() << "\n";
  } else {
    std::printf("loss %.17g\n", loss);
    std::printf("wrote %s/{loss,grad_index_query,grad_index_key,grad_weights}.npy\n",
                c.out_dir.c_str());
  }
}

// ---------------------------------------------------------------------------------------
// bench kl

struct BenchKlCommand {
  int64_t rows = 2048;
  int64_t doc_length = 8192;
  int64_t heads = 64;
  int64_t head_dim = 128;
  int64_t att_heads = 64;
  int64_t att_dim = 512;
  int64_t topk = 512;
  int64_t ratio = 4;
  std::string isa = "auto";
  int threads = 0;
  int64_t repeat = 3;
  int64_t sgemm_size = 2048;
  int64_t verify_rows = 4;
  bool json = false;
  uint64_t seed = 1;
};

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

double seconds_of(const std::function<void()>& work) {
  const auto start = std::chrono::steady_clock::now();
  work();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

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

void run_bench_kl(const BenchKlCommand& c) {
  SPARSECP_CHECK(c.ratio >= 1 && c.doc_length >= 1 && c.rows >= 1 && c.rows <= c.doc_length,
                 "bench kl needs --ratio >= 1 and 1 <= --rows <= --doc-length, got ratio ", c.ratio,
                 ", rows ", c.rows, ", doc length ", c.doc_length);
  SPARSECP_CHECK(c.repeat >= 1 && c.repeat <= 1000, "--repeat must be within [1, 1000], got ",
                 c.repeat);
  SPARSECP_CHECK(c.sgemm_size >= 1 && c.sgemm_size <= 16384,
                 "--sgemm-size must be within [1, 16384], got ", c.sgemm_size);
  SPARSECP_CHECK(c.verify_rows >= 0 && c.verify_rows <= c.rows,
                 "--verify-rows must be within [0, --rows], got ", c.verify_rows);
  {
    // Sizes first: an int64 overflow is undefined behaviour below, and a problem larger
    // than memory would only fail after minutes of paging.
    const auto product = [](std::initializer_list<int64_t> factors) {
      int64_t result = 1;
      for (const int64_t factor : factors) {
        SPARSECP_CHECK(factor >= 0 && !__builtin_mul_overflow(result, factor, &result),
                       "bench kl: problem size overflows 64 bits or is negative (--rows, "
                       "--doc-length, --heads, --head-dim, --att-heads, --att-dim, --topk)");
      }
      return result;
    };
    const int64_t keys = c.doc_length / c.ratio;
    const int64_t elements[] = {product({c.rows, c.heads, c.head_dim, 3}),
                                product({keys, c.head_dim, 3}),
                                product({c.rows, c.heads, 3}),
                                product({c.att_heads, c.rows, c.att_dim, 2}),
                                product({keys, c.att_dim, 2}),
                                product({c.rows, c.topk}),
                                product({c.sgemm_size, c.sgemm_size, 3})};
    int64_t total = 0;
    for (const int64_t count : elements) {
      SPARSECP_CHECK(!__builtin_add_overflow(total, count, &total),
                     "bench kl: problem size overflows 64 bits");
    }
    const double need = 4.0 * static_cast<double>(total);
    const double have =
        static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
    SPARSECP_CHECK(need <= have, "bench kl needs about ", need / (1 << 30),
                   " GiB of buffers, more than this machine's ", have / (1 << 30),
                   " GiB of memory");
  }
  const BenchData data = make_bench_data(c);
  IndexerKlOptions options;
  options.attention_scale = 1.0 / std::sqrt(static_cast<double>(c.att_dim));
  options.loss_coeff = 1.0;
  options.threads = c.threads;
  options.isa = parse_kl_isa(c.isa);
  const IndexerKlInputs in32 = data.inputs(c, DType::kFloat32);
  const IndexerKlInputs in16 = data.inputs(c, DType::kBFloat16);
  const double flops = indexer_kl_flops(in32, options);

  const int64_t n = c.sgemm_size;
  std::vector<float> ga(static_cast<size_t>(n * n), 0.5f), gb(ga.size(), 0.25f), gc(ga.size());
  Run fp32(data, c), bf16(data, c);
  std::vector<double> t32, t16, tsgemm;
  for (int64_t i = 0; i < c.repeat; ++i) {  // interleaved, so drifts in machine load hit all
    tsgemm.push_back(seconds_of([&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(n),
                  static_cast<int>(n), static_cast<int>(n), 1.0f, ga.data(), static_cast<int>(n),
                  gb.data(), static_cast<int>(n), 0.0f, gc.data(), static_cast<int>(n));
    }));
    t32.push_back(seconds_of([&] { fp32.loss = indexer_kl_loss(in32, options, fp32.spans()); }));
    t16.push_back(seconds_of([&] { bf16.loss = indexer_kl_loss(in16, options, bf16.spans()); }));
  }

  // Checks: fp32 against bf16 (the same values), and the first rows against the double
  // reference (bounds as in tests/kernels/indexer_kl_test.cpp, looser for real-valued q).
  const double bf16_difference = run_difference(bf16, fp32);
  double reference_difference = 0.0;
  if (c.verify_rows > 0) {
    const BenchData sub = first_rows(c, data, c.verify_rows);
    Run fast(sub, c), reference(sub, c);
    const IndexerKlInputs in = sub.inputs(c, DType::kFloat32);
    fast.loss = indexer_kl_loss(in, options, fast.spans());
    reference.loss = indexer_kl_loss_reference(in, options, reference.spans());
    reference_difference = run_difference(fast, reference);
  }
  const bool verified =
      std::isfinite(fp32.loss) && bf16_difference <= 1e-4 && reference_difference <= 1e-4;

  const double sgemm_gflops = 2.0 * static_cast<double>(n) * static_cast<double>(n) *
                              static_cast<double>(n) / median(tsgemm) / 1e9;
  const int threads = c.threads > 0 ? c.threads : omp_get_max_threads();
  const KernelIsa isa = options.isa != KernelIsa::kAuto            ? options.isa
                        : kernel_isa_supported(KernelIsa::kAvx512) ? KernelIsa::kAvx512
                                                                   : KernelIsa::kPortable;
  IndexerKlOptions sized = options;
  sized.threads = threads;
  nlohmann::ordered_json out;
  out["rows"] = c.rows;
  out["doc_length"] = c.doc_length;
  out["keys"] = data.keys;
  out["heads"] = c.heads;
  out["head_dim"] = c.head_dim;
  out["att_heads"] = c.att_heads;
  out["att_dim"] = c.att_dim;
  out["topk"] = c.topk;
  out["threads"] = threads;
  out["isa"] = kernel_isa_name(isa);
  out["repeat"] = c.repeat;
  out["gflop"] = flops / 1e9;
  out["seconds"] = median(t32);
  out["gflops"] = flops / median(t32) / 1e9;
  out["sgemm_gflops"] = sgemm_gflops;
  // OpenBLAS picks its kernel by CPU model; on CPUs it does not know it falls back to
  // an old one (e.g. Prescott SSE3), which makes the sgemm rate meaningless. Force a
  // kernel with OPENBLAS_CORETYPE (e.g. SkylakeX) then.
  out["sgemm_core"] = openblas_get_corename();
  out["fraction_of_sgemm"] = flops / median(t32) / 1e9 / sgemm_gflops;
  out["bf16_seconds"] = median(t16);
  out["bf16_gflops"] = flops / median(t16) / 1e9;
  out["bf16_speedup"] = median(t32) / median(t16);
  out["scratch_bytes"] = indexer_kl_scratch_bytes(in32, sized);
  out["bf16_scratch_bytes"] = indexer_kl_scratch_bytes(in16, sized);
  out["loss"] = fp32.loss;
  out["bf16_max_relative_difference"] = bf16_difference;
  out["reference_max_relative_difference"] = reference_difference;
  out["verified"] = verified;
  if (c.json) {
    std::cout << out.dump() << "\n";
  } else {
    std::printf(
        "bench kl: %lld rows (last of a %lld-token document), %lld keys, index heads %lld x %lld, "
        "attention heads %lld x %lld, topk %lld, %d threads, %s kernel, median of %lld\n",
        static_cast<long long>(c.rows), static_cast<long long>(c.doc_length),
        static_cast<long long>(data.keys), static_cast<long long>(c.heads),
        static_cast<long long>(c.head_dim), static_cast<long long>(c.att_heads),
        static_cast<long long>(c.att_dim), static_cast<long long>(c.topk), threads,
        kernel_isa_name(isa), static_cast<long long>(c.repeat));
    std::printf(
        "  counted work          %10.1f GFLOP (per selected pair 2*Hm*Dm + 2*H*D + 4*H*D)\n",
        flops / 1e9);
    std::printf("  BLAS sgemm %5lld^3     %10.1f GFLOP/s  (OpenBLAS kernel %s)\n",
                static_cast<long long>(n), sgemm_gflops, openblas_get_corename());
    std::printf("  fused fp32            %10.3f s  %8.1f GFLOP/s  (%.0f%% of sgemm)\n", median(t32),
                flops / median(t32) / 1e9, 100.0 * out["fraction_of_sgemm"].get<double>());
    std::printf("  fused bf16            %10.3f s  %8.1f GFLOP/s  (%.2fx fp32)\n", median(t16),
                flops / median(t16) / 1e9, median(t32) / median(t16));
    std::printf("  scratch memory        %10.2f MiB fp32, %.2f MiB bf16 (independent of rows)\n",
                static_cast<double>(out["scratch_bytes"].get<size_t>()) / (1 << 20),
                static_cast<double>(out["bf16_scratch_bytes"].get<size_t>()) / (1 << 20));
    std::printf("  loss %.9g; bf16 vs fp32 %.1e, first %lld rows vs reference %.1e: %s\n",
                fp32.loss, bf16_difference, static_cast<long long>(c.verify_rows),
                reference_difference, verified ? "verified" : "NOT VERIFIED");
  }
  if (!verified) throw ExitStatus{1};
}

const Registration registration("kl", [](CLI::App& app) {
  auto c = std::make_shared<KlCommand>();
  CLI::App* sub = app.add_subcommand(
      "kl",
      "The Lightning Indexer's training loss on .npy tensors: the sparse KL divergence between "
      "main attention over each row's selected keys (teacher: per-head softmax with the "
      "attention-sink logit appended, sink dropped, summed over heads, L1-normalised) and "
      "log_softmax of the indexer scores I[s] = sum_h w[h] * ReLU(q[h] . k[s]) (student), "
      "times loss_coeff / (B * S); with its gradients for index query, index keys and merge "
      "weights (seed: shared_compressed_indexer_kl_loss; include/sparsecp/kernels/indexer_kl.hpp "
      "has the math). Float inputs are float32 or bfloat16 ('bfloat16' / '|V2' descriptors); "
      "gradients are float32 and the loss float64.");
  sub->add_option("--index-query", c->index_query, "Index Q [B, S, H, D] (.npy)")->required();
  sub->add_option(
         "--index-key", c->index_key,
         "Index K bank [B, Ki, D] (.npy); rows [offset, offset + K) are the student's keys")
      ->required();
  sub->add_option("--weights", c->weights, "Merge weights [B, S, H] (.npy), already scaled")
      ->required();
  sub->add_option("--attention-query", c->attention_query,
                  "Main attention queries [B, Hm, S, Dm] (.npy), head-major")
      ->required();
  sub->add_option("--attention-key", c->attention_key,
                  "Compressed attention key bank [B, K, Dm] (.npy): the teacher's keys")
      ->required();
  sub->add_option("--indices", c->indices,
                  "Selected ids [B, S, TopK] (.npy, int32 or int64), -1 padded; index_key rows, "
                  "min(512, K) <= TopK <= 512")
      ->required();
  sub->add_option("--sinks", c->sinks, "Attention-sink logits [Hm] (.npy)")->required();
  sub->add_option("--attention-scale", c->attention_scale,
                  "Softmax scale of the teacher's logits (e.g. Dm^-0.5)")
      ->required();
  sub->add_option("--loss-coeff", c->loss_coeff, "Loss coefficient (0: zero loss and gradients)")
      ->required();
  sub->add_option("--main-key-offset", c->main_key_offset,
                  "Compact bank: --attention-key holds index_key rows [N, N + K); ids are shifted "
                  "down by N and the key gradient lands at the global rows")
      ->capture_default_str();
  sub->add_option("--out-dir", c->out_dir,
                  "Writes loss.npy (float64, shape []), grad_index_query.npy, grad_index_key.npy "
                  "and grad_weights.npy (float32, the inputs' shapes)");
  sub->add_option("--threads", c->threads, "Threads (0 = OpenMP default); never changes results")
      ->capture_default_str();
  sub->add_option("--isa", c->isa, "Kernel: auto, portable or avx512")->capture_default_str();
  sub->add_flag("--reference", c->reference, "Use the plain double-precision reference (slow)");
  sub->add_flag("--json", c->json, "Print {\"loss\": ...} as JSON");
  sub->footer(
      "Example (DeepSeek-V4 shapes: H = 64 x D = 128 index heads, Hm = 64 x Dm = 512 attention "
      "heads, TopK 512):\n"
      "  sparsecp kl --index-query q.npy --index-key k.npy --weights w.npy \\\n"
      "      --attention-query qa.npy --attention-key ka.npy --indices idx.npy --sinks sinks.npy "
      "\\\n"
      "      --attention-scale 0.0441941738 --loss-coeff 1.0 --out-dir grads/ --json\n"
      "Bad files or shapes print one 'error:' line and exit with status 2.");
  sub->callback([c] { run_kl(*c); });
});

const Registration bench_registration("bench", [](CLI::App& app) {
  auto b = std::make_shared<BenchKlCommand>();
  CLI::App* bench = bench_command(app)->add_subcommand(
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
  bench->add_option("--isa", b->isa, "Kernel: auto, portable or avx512")->capture_default_str();
  bench->add_option("--threads", b->threads, "Threads (0 = OpenMP default)")->capture_default_str();
  bench->add_option("--repeat", b->repeat, "Repetitions (interleaved); medians are reported")
      ->capture_default_str();
  bench->add_option("--sgemm-size", b->sgemm_size, "N of the reference N x N x N sgemm")
      ->capture_default_str();
  bench->add_option("--verify-rows", b->verify_rows, "Rows checked against the reference")
      ->capture_default_str();
  bench->add_option("--seed", b->seed, "Seed of the generated data")->capture_default_str();
  bench->add_flag("--json", b->json,
                  "Print one JSON object: seconds, gflops, sgemm_gflops, fraction_of_sgemm, "
                  "bf16_seconds, bf16_speedup, scratch_bytes, verified, ...");
  bench->footer(
      "Examples:\n"
      "  sparsecp bench kl               # DeepSeek-V4 shapes, last 2048 rows of an 8192-token "
      "document\n"
      "  sparsecp bench kl --rows 4096 --repeat 5 --json\n"
      "Exit status 1 if a check fails. OpenBLAS chooses its sgemm kernel by CPU model and falls "
      "back to an old SSE3 one on CPUs it does not know (see sgemm_core); force one with e.g. "
      "OPENBLAS_CORETYPE=SkylakeX.");
  bench->callback([b] { run_bench_kl(*b); });
});

}  // namespace
}  // namespace sparsecp::cli
