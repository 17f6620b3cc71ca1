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

#include "batch_input.hpp"
#include "bench_driver.hpp"
#include "command.hpp"
#include "sparsecp/error.hpp"
#include "sparsecp/io/npy.hpp"
#include "sparsecp/io/output_set.hpp"
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
  check_input_file(path, flag);
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
  check_input_file(path, "--segments");
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
  // "Indexer topk ... is too large" before allocating.
  SelectConfig config = make_select_config(weights.shape[1], keys.shape[1], SelectConfig{}.rope_dim,
                                           c.topk, c.ratio, c.threads, parse_isa(c.isa));
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
    const MatrixView qr_view = qr.view(rows, qr.shape[1]);
    const MatrixView cos_view = cos.view(cos.shape[0], cos.shape[1]);
    const MatrixView sin_view = sin.view(sin.shape[0], sin.shape[1]);
    const MatrixView wq_view = wq.view(wq.shape[0], wq.shape[1]);
    if (c.reference) {
      select_worker_rows_reference(qr_view, weight_view, cos_view, sin_view, wq_view, key_view,
                                   segments, config, out, layout);
    } else {
      select_worker_rows(qr_view, weight_view, cos_view, sin_view, wq_view, key_view, segments,
                         config, out, layout);
    }
  }
  const std::vector<int64_t> shape{rows, c.topk};
  OutputSet output;  // whole or absent; "wrote" only after the rename
  output.add(c.out, format_npy(NpyDType::kInt32, shape, out.data()), "--out");
  output.commit();
  int64_t selected = 0;
  for (const int32_t id : out) selected += id >= 0;
  std::printf("wrote %s: int32 [%lld, %lld], %lld ids selected over %zu segments\n", c.out.c_str(),
              static_cast<long long>(rows), static_cast<long long>(c.topk),
              static_cast<long long>(selected), segments.size());
}

const Registration registration("select", [](CLI::App& app) {
  auto c = std::make_shared<SelectCommand>();
  CLI::App* sub = app.add_subcommand(
      "select",
      "Lightning Indexer top-k over packed segments on .npy tensors: per row, the topk keys with\n"
      "the highest sum_h w[h] * ReLU(q[h] . k), ties to the lower key id, sorted ascending,\n"
      "padded with -1 (hyper_parallel's `_select_indices`). Float inputs may be float32 or\n"
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

}  // namespace
}  // namespace sparsecp::cli
