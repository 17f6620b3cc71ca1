#include "model_flags.hpp"

#include <unistd.h>

#include "command.hpp"
#include "sparsecp/error.hpp"

namespace sparsecp::cli {

void ModelFlags::add_to(CLI::App& command, unsigned fields) {
  if (fields & kHeads) {
    command.add_option(names("--heads", {"--index-heads"}), heads, "Index heads")
        ->capture_default_str();
  }
  if (fields & kHeadDim) {
    command.add_option("--head-dim", head_dim, "Index head dimension")->capture_default_str();
  }
  if (fields & kRopeDim) {
    command.add_option("--rope-dim", rope_dim, "Rotated trailing channels per head (even)")
        ->capture_default_str();
  }
  if (fields & kQRank) {
    command
        .add_option(names("--q-rank", {"--qr-rank", "--q-lora-rank"}), q_rank,
                    "Low-rank query residual width (q_lora_rank)")
        ->capture_default_str();
  }
  if (fields & kTopk) {
    command.add_option("--topk", topk, "Selected keys per query row")->capture_default_str();
  }
}

void ModelFlags::validate() const {
  SPARSECP_CHECK(heads >= 1, "--heads must be positive, got ", heads);
  SPARSECP_CHECK(head_dim >= 1, "--head-dim must be positive, got ", head_dim);
  SPARSECP_CHECK(q_rank >= 1, "--q-rank must be positive, got ", q_rank);
  SPARSECP_CHECK(topk >= 1, "--topk must be positive, got ", topk);
  SPARSECP_CHECK(rope_dim >= 0 && rope_dim % 2 == 0 && rope_dim <= head_dim,
                 "--rope-dim must be even and within [0, head_dim ", head_dim, "], got ", rope_dim);
  make_select_config(heads, head_dim, rope_dim, topk);  // heads x head_dim within the limit
}

SelectConfig ModelFlags::select_config(int64_t ratio, int threads) const {
  validate();
  return make_select_config(heads, head_dim, rope_dim, topk, ratio, threads);
}

RowBytes ModelFlags::row_bytes(int64_t qr_bytes, int64_t weight_bytes, int64_t rope_bytes) const {
  RowBytes bytes;
  bytes.qr_rank = q_rank;
  bytes.qr_bytes = qr_bytes;
  bytes.index_heads = heads;
  bytes.weight_bytes = weight_bytes;
  bytes.rope_pairs = rope_dim / 2;
  bytes.rope_bytes = rope_bytes;
  bytes.topk = topk;
  return bytes;
}

std::string ModelFlags::describe() const {
  return std::to_string(heads) + " index heads x head_dim " + std::to_string(head_dim) + " (rope " +
         std::to_string(rope_dim) + "), q_rank " + std::to_string(q_rank) + ", top-k " +
         std::to_string(topk);
}

int64_t BufferBudget::elements(std::initializer_list<int64_t> factors) const {
  int64_t result = 1;
  for (const int64_t factor : factors) {
    SPARSECP_CHECK(factor >= 0 && !__builtin_mul_overflow(result, factor, &result), what_,
                   ": buffer size overflows 64 bits (a product of the sizes given)");
  }
  return result;
}

int64_t BufferBudget::add(int64_t item_bytes, std::initializer_list<int64_t> factors) {
  const int64_t count = elements(factors);
  int64_t bytes = 0;
  SPARSECP_CHECK(!__builtin_mul_overflow(count, item_bytes, &bytes) &&
                     !__builtin_add_overflow(bytes_, bytes, &bytes_),
                 what_, ": buffer size overflows 64 bits (a product of the sizes given)");
  return count;
}

void BufferBudget::check_fits_memory() const {
  const double have =
      static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  const double need = static_cast<double>(bytes_);
  SPARSECP_CHECK_AS(ErrorKind::kResource, need <= have, what_, " needs about ", need / (1 << 30),
                    " GiB of buffers, more than this machine's ", have / (1 << 30),
                    " GiB of memory");
}

}  // namespace sparsecp::cli
