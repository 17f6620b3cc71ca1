// `sparsecp kl`: the indexer's sparse KL loss and its three gradients on .npy tensors.

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "batch_input.hpp"
#include "bench_driver.hpp"
#include "command.hpp"
#include "sparsecp/error.hpp"
#include "sparsecp/io/npy.hpp"
#include "sparsecp/io/output_set.hpp"
#include "sparsecp/kernels/indexer_kl.hpp"

namespace sparsecp::cli {
namespace {

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
  check_input_file(path, flag);
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
  check_input_file(c.indices, "--indices");
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
  options.isa = parse_isa(c.isa);

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
    // All four files appear together or none does (io/output_set.hpp).
    OutputSet outputs;
    outputs.add(path("loss.npy"), format_npy(NpyDType::kFloat64, std::vector<int64_t>{}, &loss),
                "--out-dir");
    outputs.add(path("grad_index_query.npy"),
                format_npy(NpyDType::kFloat32, q.array.shape, grad_q.data()), "--out-dir");
    outputs.add(path("grad_index_key.npy"),
                format_npy(NpyDType::kFloat32, kidx.array.shape, grad_k.data()), "--out-dir");
    outputs.add(path("grad_weights.npy"),
                format_npy(NpyDType::kFloat32, w.array.shape, grad_w.data()), "--out-dir");
    outputs.commit();
  }
  if (c.json) {
    nlohmann::ordered_json out;
    out["loss"] = loss;
    std::cout << out.dump() << "\n";
  } else {
    std::printf("loss %.17g\n", loss);
    if (!c.out_dir.empty()) {
      std::printf("wrote %s/{loss,grad_index_query,grad_index_key,grad_weights}.npy\n",
                  c.out_dir.c_str());
    }
  }
}

const Registration registration("kl", [](CLI::App& app) {
  auto c = std::make_shared<KlCommand>();
  CLI::App* sub = app.add_subcommand(
      "kl",
      "The Lightning Indexer's training loss on .npy tensors: the sparse KL divergence between\n"
      "main attention over each row's selected keys (teacher: per-head softmax with the\n"
      "attention-sink logit appended, sink dropped, summed over heads, L1-normalised) and\n"
      "log_softmax of the indexer scores I[s] = sum_h w[h] * ReLU(q[h] . k[s]) (student), times\n"
      "loss_coeff / (B * S); with its gradients for index query, index keys and merge weights\n"
      "(seed: shared_compressed_indexer_kl_loss; include/sparsecp/kernels/indexer_kl.hpp has the\n"
      "math). Float inputs are float32 or bfloat16 ('bfloat16' / '|V2' descriptors); gradients\n"
      "are float32 and the loss float64.");
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
  sub->add_option(
         "--isa", c->isa,
         "Kernel: auto (SPARSECP_ISA, else the best this CPU runs), portable, avx2 or avx512")
      ->capture_default_str();
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

}  // namespace
}  // namespace sparsecp::cli
