// Fast worker-side selection: BLAS projection + RoPE, then a tiled, fused
// score-and-top-k over packed segments with per-row candidate buffers.
//
// Work decomposition: each TND sequence (csa_tnd_plan) is cut into blocks of
// kBlockRows consecutive rows; a block walks the key tiles its last row can see
// (kTileKeys keys each, packed once per block into 16-key panels) and every row
// scores only the panels holding keys it sees. Blocks are independent and are
// handed to OpenMP threads dynamically, largest first. Scratch is per thread.
// A row's candidates go through its buffer of 2 top-k (offer: on avx512 a vector test of
// the scores against the threshold first) and are cut to top-k by a radix partition; the
// kept keys are written in key order from a bitmap (top_candidates.hpp).
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "../attention/batched_gemm.hpp"
#include "../parallel_blocks.hpp"
#include "select_internal.hpp"
#include "sparsecp/error.hpp"
#include "sparsecp/kernels/bf16.hpp"
#include "sparsecp/kernels/blas_core.hpp"
#include "top_candidates.hpp"

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#define SPARSECP_SELECT_X86 1
#else
#define SPARSECP_SELECT_X86 0
#endif

namespace sparsecp {
namespace sd = select_detail;

// --- CPU features and kernel choice ---------------------------------------------------

namespace select_detail {
namespace {

struct CpuFeatures {
  bool avx2 = false;
  bool avx512 = false;
  bool avx512_bf16 = false;
};

CpuFeatures detect() {
  CpuFeatures f;
#if SPARSECP_SELECT_X86
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = (c >> 27) & 1u;
  const bool fma = (c >> 12) & 1u;
  if (!osxsave) return f;
  unsigned xcr0_lo = 0, xcr0_hi = 0;
  __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  const bool ymm_state = (xcr0_lo & 0x6u) == 0x6u;
  const bool zmm_state = (xcr0_lo & 0xe6u) == 0xe6u;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return f;
  f.avx2 = ymm_state && fma && ((b >> 5) & 1u);
  const bool avx512 = ((b >> 16) & 1u) && ((b >> 17) & 1u) && ((b >> 30) & 1u) && ((b >> 31) & 1u);
  f.avx512 = f.avx2 && zmm_state && avx512;
  if (f.avx512 && __get_cpuid_count(7, 1, &a, &b, &c, &d)) f.avx512_bf16 = (a >> 5) & 1u;
#endif
  return f;
}

const CpuFeatures& features() {
  static const CpuFeatures cached = detect();
  return cached;
}

}  // namespace

bool cpu_has_avx2() { return features().avx2; }
bool cpu_has_avx512() { return features().avx512; }
bool cpu_has_avx512_bf16() { return features().avx512_bf16; }

}  // namespace select_detail

const char* kernel_isa_name(KernelIsa isa) {
  switch (isa) {
    case KernelIsa::kAuto:
      return "auto";
    case KernelIsa::kPortable:
      return "portable";
    case KernelIsa::kAvx2:
      return "avx2";
    case KernelIsa::kAvx512:
      return "avx512";
  }
  return "unknown";
}

bool kernel_isa_supported(KernelIsa isa) {
  switch (isa) {
    case KernelIsa::kAuto:
    case KernelIsa::kPortable:
      return true;
    case KernelIsa::kAvx2:
      return SPARSECP_SELECT_X86 && sd::cpu_has_avx2();
    case KernelIsa::kAvx512:
      return SPARSECP_SELECT_X86 && sd::cpu_has_avx512();
  }
  return false;
}

KernelIsa best_kernel_isa() {
  if (kernel_isa_supported(KernelIsa::kAvx512)) return KernelIsa::kAvx512;
  if (kernel_isa_supported(KernelIsa::kAvx2)) return KernelIsa::kAvx2;
  return KernelIsa::kPortable;
}

bool kernel_isa_bf16_dot_products() {
  return kernel_isa_supported(KernelIsa::kAvx512) && sd::cpu_has_avx512_bf16();
}

KernelIsa parse_kernel_isa(std::string_view name, std::string_view what) {
  for (const KernelIsa isa :
       {KernelIsa::kAuto, KernelIsa::kPortable, KernelIsa::kAvx2, KernelIsa::kAvx512}) {
    if (name == kernel_isa_name(isa)) return isa;
  }
  SPARSECP_FAIL(what, " must be auto, portable, avx2 or avx512, got '", name, "'");
}

namespace {
// Names of the ISAs this CPU runs, for error messages.
std::string supported_isa_names() {
  std::string names = "portable";
  for (const KernelIsa isa : {KernelIsa::kAvx2, KernelIsa::kAvx512}) {
    if (kernel_isa_supported(isa)) names += std::string(", ") + kernel_isa_name(isa);
  }
  return names;
}
}  // namespace

KernelIsa resolve_kernel_isa(KernelIsa isa) {
  if (isa == KernelIsa::kAuto) {
    // Read on every call (not cached): a process may set it between calls.
    const char* env = std::getenv("SPARSECP_ISA");
    if (env != nullptr && *env != '\0') {
      const KernelIsa forced = parse_kernel_isa(env, "SPARSECP_ISA");
      SPARSECP_CHECK(forced == KernelIsa::kAuto || kernel_isa_supported(forced), "SPARSECP_ISA='",
                     env, "' is not supported by this CPU (it runs ", supported_isa_names(), ")");
      isa = forced;
    }
    if (isa == KernelIsa::kAuto) isa = best_kernel_isa();
  }
  SPARSECP_CHECK(kernel_isa_supported(isa), "kernel ISA '", kernel_isa_name(isa),
                 "' is not supported by this CPU (it runs ", supported_isa_names(), ")");
  return isa;
}

namespace {

// Keys per tile: 8 panels. 128 ran 1.05x (bf16 through oneDNN) and 1.1-1.4x (fp32 avx512)
// faster than 256 at the V4 indexer's shape on an AMX Xeon, AVX2 the same (bench select,
// one thread, interleaved).
constexpr int64_t kTileKeys = 128;
constexpr int64_t kBlockRows = 32;  // rows per work item
// The oneDNN path's rows per work item: a block's logits over a key tile ([16 * heads,
// 128] fp32, 512 KiB at 64 heads) stay in a core's L2 between the product and reduce_heads.
// At the V4 indexer's shape on an AMX Xeon, 16 rows x 128 keys ran 1.05x faster than 16 x
// 256, 8 x 512 and 32 x 128, and 16 x 256 1.15x faster than 32 x 256 (bench select, bf16,
// one thread).
constexpr int64_t kOnednnBlockRows = 16;

struct Kernel {
  sd::ScoreRowFn score_row = nullptr;
  bool bf16 = false;         // bf16 pair packs, VDPBF16PS
  bool avx512_pack = false;  // transpose panels with AVX-512
  // bf16 keys on the avx512 ISA in a build with oneDNN whose bf16 products run on AMX (or on a
  // CPU without AVX512_BF16): a row block's logits over a key tile are one oneDNN product
  // ([block rows * heads, head_dim] x [head_dim, tile keys]), always of the same shape (rows
  // and keys padded with zeros), so a row's scores never depend on its block or tile; then
  // ReLU and the merge weights head by head (reduce_heads). select_uses_onednn says when.
  bool onednn = false;
};

// Which bf16 products the avx512 kernel takes, chosen by measurement (bench select, bf16,
// 1,024 rows, 64 x 128, top-k 512): on an AMX Xeon oneDNN's products ran at 5-7x the
// VDPBF16PS kernel; on a Zen 4 EPYC (AVX512_BF16, no AMX) the VDPBF16PS kernel ran at
// 1.07-1.09x oneDNN's AVX512_BF16 products, whose fixed-shape tile calls cost more than they
// gain there. SPARSECP_SELECT_GEMM (read at each call) overrides: "onednn" or "native" (the
// VDPBF16PS kernel, or bf16 widened to fp32 where the CPU has no AVX512_BF16).
bool select_uses_onednn(DType key_dtype) {
  const char* env = std::getenv("SPARSECP_SELECT_GEMM");
  const std::string_view choice = env == nullptr ? std::string_view() : std::string_view(env);
  SPARSECP_CHECK(choice.empty() || choice == "onednn" || choice == "native",
                 "SPARSECP_SELECT_GEMM must be onednn or native, got '", choice, "'");
  if (key_dtype != DType::kBFloat16 || choice == "native" ||
      !attention_detail::onednn_fast(attention_detail::Element::kBFloat16)) {
    return false;  // not bf16, not built, or only oneDNN's reference loops on this CPU
  }
  return choice == "onednn" ||
         attention_detail::onednn_uses_amx(attention_detail::Element::kBFloat16) ||
         !sd::cpu_has_avx512_bf16();
}

Kernel resolve_kernel(KernelIsa requested, DType key_dtype) {
  const KernelIsa isa = resolve_kernel_isa(requested);
#if SPARSECP_SELECT_X86
  if (isa == KernelIsa::kAvx512) {
    if (select_uses_onednn(key_dtype)) return {nullptr, true, false, true};
    if (key_dtype == DType::kBFloat16 && sd::cpu_has_avx512_bf16()) {
      return {sd::score_row_bf16_avx512, true, true};
    }
    return {sd::score_row_f32_avx512, false, true};
  }
  if (isa == KernelIsa::kAvx2) return {sd::score_row_f32_avx2, false, false};
#endif
  (void)key_dtype;
  return {sd::score_row_f32_portable, false, false};
}

int resolve_threads(int threads) {
  return threads > 0 ? threads : std::max(1, omp_get_max_threads());
}

// 64-byte aligned scratch that grows but never shrinks.
class AlignedScratch {
 public:
  void* get(std::size_t bytes) {
    if (bytes > size_) {
      bytes = (bytes + 63) / 64 * 64;
      memory_.reset(static_cast<std::byte*>(std::aligned_alloc(64, bytes)));
      SPARSECP_CHECK_AS(ErrorKind::kResource, memory_ != nullptr,
                        "Indexer selection could not allocate ", bytes, " bytes of scratch");
      size_ = bytes;
    }
    return memory_.get();
  }

 private:
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::unique_ptr<std::byte, Free> memory_;
  std::size_t size_ = 0;
};

struct ThreadScratch {
  AlignedScratch keys;    // packed key tile
  AlignedScratch query;   // converted q rows of a block (when not used in place)
  AlignedScratch scores;  // one row's scores over a tile
  std::vector<uint64_t> candidates;
  std::vector<int64_t> counts;
  std::vector<uint64_t> thresholds;
  std::vector<float> weights;      // widened bf16 merge weights of a block
  AlignedScratch tile_rows;        // oneDNN path: the tile's keys, [kTileKeys, head_dim] bf16
  AlignedScratch logits;           // oneDNN path: [kOnednnBlockRows * heads, kTileKeys] fp32
  AlignedScratch block_scores;     // oneDNN path: [kOnednnBlockRows, kTileKeys] fp32
  sd::CandidateScratch top;        // keep_largest, write_keys_in_order
  std::vector<int32_t> survivors;  // offer: a tile's scores that pass the threshold's order
};

struct Block {
  const TndSequence* sequence;
  int64_t row_begin;  // original rows [row_begin, row_end) inside the sequence
  int64_t row_end;
  int64_t cost;
};

struct Call {
  MatrixView q, weights, keys;
  const SelectConfig* config;
  Kernel kernel;
  int64_t depth;        // steps per dot product: head_dim, or pairs for bf16
  int64_t panel_elems;  // elements (float or bf16) per packed panel
  bool q_in_place;      // fp32 kernel reads the caller's fp32 q directly
  std::span<int32_t> out;
  int64_t q_first = 0;  // the call's row that q's row 0 holds (a projected chunk's first row)
  // The oneDNN path reads a full block of the caller's bf16 q directly: bf16 pairs in
  // memory are the kernel's uint32 pairs (low half the even channel) when head_dim is even.
  bool q_pairs_in_place = false;
};

// Packs keys [first, first + count) of the bank into panels of kernel layout.
void pack_tile(const Call& call, int64_t first, int64_t count, void* dst) {
  const int64_t dim = call.config->head_dim;
  const int64_t panels = (count + sd::kPanelKeys - 1) / sd::kPanelKeys;
  const bool keys_bf16 = call.keys.dtype == DType::kBFloat16;
  for (int64_t p = 0; p < panels; ++p) {
    const int64_t key0 = first + p * sd::kPanelKeys;
    const int64_t rows = std::min<int64_t>(sd::kPanelKeys, first + count - key0);
#if SPARSECP_SELECT_X86
    const std::size_t elem = call.kernel.bf16 || keys_bf16 ? 2 : 4;
    const bool u32_rows = call.kernel.bf16 ? dim % 2 == 0 : !keys_bf16;
    if (call.kernel.avx512_pack && u32_rows) {
      const auto* src = static_cast<const char*>(call.keys.data) + key0 * dim * elem;
      auto* panel = reinterpret_cast<uint32_t*>(static_cast<char*>(dst) +
                                                p * call.panel_elems * (call.kernel.bf16 ? 2 : 4));
      const int64_t cols = call.kernel.bf16 ? dim / 2 : dim;
      sd::pack_panel_u32_avx512(src, cols, rows, cols, panel);
      continue;
    }
#endif
    if (call.kernel.bf16) {
      auto* panel = static_cast<uint16_t*>(dst) + p * call.panel_elems;
      const auto* src = static_cast<const uint16_t*>(call.keys.data);
      for (int64_t pair = 0; pair < call.depth; ++pair) {
        for (int64_t k = 0; k < sd::kPanelKeys; ++k) {
          for (int64_t e = 0; e < 2; ++e) {
            const int64_t d = 2 * pair + e;
            panel[(pair * sd::kPanelKeys + k) * 2 + e] =
                k < rows && d < dim ? src[(key0 + k) * dim + d] : uint16_t{0};
          }
        }
      }
    } else {
      float* panel = static_cast<float*>(dst) + p * call.panel_elems;
      for (int64_t d = 0; d < dim; ++d) {
        for (int64_t k = 0; k < sd::kPanelKeys; ++k) {
          panel[d * sd::kPanelKeys + k] = k < rows ? sd::element(call.keys, key0 + k, d) : 0.0f;
        }
      }
    }
  }
}

// Brings rows [row_begin, row_end) of q into the kernel's layout (unless used in place).
const void* prepare_query(const Call& call, int64_t row_begin, int64_t row_end,
                          ThreadScratch& scratch) {
  const int64_t width = call.config->heads * call.config->head_dim;
  const int64_t rows = row_end - row_begin;
  row_begin -= call.q_first;  // from here on, a row of q
  if (call.q_in_place) return static_cast<const float*>(call.q.data) + row_begin * width;
  if (call.q_pairs_in_place && rows == kOnednnBlockRows) {
    return static_cast<const uint16_t*>(call.q.data) + row_begin * width;
  }
  const int64_t heads = call.config->heads;
  const int64_t dim = call.config->head_dim;
  const bool round = call.keys.dtype == DType::kBFloat16;
  if (call.kernel.bf16) {
    // The oneDNN path multiplies a whole block's rows at once: rows past the block's are zero.
    const int64_t held = call.kernel.onednn ? std::max(rows, kOnednnBlockRows) : rows;
    auto* pairs = static_cast<uint32_t*>(
        scratch.query.get(static_cast<std::size_t>(held * heads * call.depth) * 4));
    std::fill(pairs + rows * heads * call.depth, pairs + held * heads * call.depth, 0u);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t h = 0; h < heads; ++h) {
        uint32_t* head = pairs + (r * heads + h) * call.depth;
        for (int64_t p = 0; p < call.depth; ++p) {
          const int64_t d = 2 * p;
          const uint32_t lo = float_to_bf16(sd::element(call.q, row_begin + r, h * dim + d));
          const uint32_t hi =
              d + 1 < dim ? float_to_bf16(sd::element(call.q, row_begin + r, h * dim + d + 1)) : 0u;
          head[p] = lo | (hi << 16);
        }
      }
    }
    return pairs;
  }
  auto* values = static_cast<float*>(scratch.query.get(static_cast<std::size_t>(rows * width) * 4));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < width; ++c) {
      const float value = sd::element(call.q, row_begin + r, c);
      values[r * width + c] = round ? round_to_bf16(value) : value;
    }
  }
  return values;
}

// Offers a row's visible keys of a tile (scores of keys key0 + i, i < count) to its
// candidate buffer.
void offer(const float* scores, int64_t count, int64_t key0, int64_t r, int64_t capacity,
           int64_t topk, bool avx512, ThreadScratch& scratch) {
  uint64_t* buffer = scratch.candidates.data() + r * capacity;
  int64_t& held = scratch.counts[static_cast<std::size_t>(r)];
  uint64_t& threshold = scratch.thresholds[static_cast<std::size_t>(r)];
  auto take = [&](int64_t i) {
    const uint64_t candidate = sd::candidate(scores[i], key0 + i);
    if (candidate <= threshold) return;
    buffer[held++] = candidate;
    if (held == capacity && capacity > topk) {
      threshold = sd::keep_largest(buffer, held, topk, scratch.top);
      held = topk;
    }
  };
#if SPARSECP_SELECT_X86
  int64_t first = 0;
  if (avx512 && threshold == 0) {
    // Filling up: every candidate enters until the buffer is full.
    first = std::min(count, capacity - held);
    sd::candidates_avx512(scores, first, key0, buffer + held);
    held += first;
    if (held == capacity && capacity > topk) {
      threshold = sd::keep_largest(buffer, held, topk, scratch.top);
      held = topk;
    }
    if (first == count) return;
  }
  if (avx512 && threshold != 0) {
    // Only scores at least the threshold's can enter; the threshold only rises, so the
    // exact test below still sees every candidate that would have entered.
    scratch.survivors.reserve(static_cast<std::size_t>(kTileKeys));  // exactly: no doubling
    scratch.survivors.resize(static_cast<std::size_t>(count - first));
    const int64_t survivors = sd::scores_at_least_avx512(scores + first, count - first,
                                                         static_cast<uint32_t>(threshold >> 32),
                                                         scratch.survivors.data());
    for (int64_t s = 0; s < survivors; ++s) {
      take(first + scratch.survivors[static_cast<std::size_t>(s)]);
    }
    return;
  }
#else
  const int64_t first = 0;
#endif
  (void)avx512;
  for (int64_t i = first; i < count; ++i) take(i);
}

// The oneDNN path (Kernel::onednn): block_scores[r][k] for the block's rows over keys
// [first, first + count), from one product of fixed shape.
void score_tile_onednn(const Call& call, int64_t first, int64_t count, int64_t rows,
                       const void* query, const float* weights, ThreadScratch& scratch) {
#if SPARSECP_SELECT_X86
  const SelectConfig& config = *call.config;
  const int64_t dim = config.head_dim;
  auto* tile =
      static_cast<uint16_t*>(scratch.tile_rows.get(static_cast<std::size_t>(kTileKeys * dim) * 2));
  const auto* keys = static_cast<const uint16_t*>(call.keys.data);
  std::memcpy(tile, keys + first * dim, static_cast<std::size_t>(count * dim) * 2);
  std::fill(tile + count * dim, tile + kTileKeys * dim, uint16_t{0});
  const int64_t m = kOnednnBlockRows * config.heads;
  auto* logits =
      static_cast<float*>(scratch.logits.get(static_cast<std::size_t>(m * kTileKeys) * 4));
  attention_detail::BatchedGemm g;
  g.in = attention_detail::Element::kBFloat16;
  g.batch = 1;
  g.m = m;
  g.n = kTileKeys;
  g.k = dim;
  g.a = {query, 0, 2 * call.depth, false};  // bf16 pairs: head rows of 2 * depth channels
  g.b = {tile, 0, dim, true};
  g.c = logits;
  g.ldc = kTileKeys;
  attention_detail::run_gemm(g, true);
  sd::ReduceHeadsArgs reduce;
  reduce.logits = logits;
  reduce.weights = weights;
  reduce.rows = rows;
  reduce.heads = config.heads;
  reduce.n = kTileKeys;
  reduce.out = static_cast<float*>(
      scratch.block_scores.get(static_cast<std::size_t>(kOnednnBlockRows * kTileKeys) * 4));
  sd::reduce_heads_avx512(reduce);
#else
  (void)call, (void)first, (void)count, (void)rows, (void)query, (void)weights, (void)scratch;
  SPARSECP_FAIL("internal: the oneDNN selection path runs on x86-64 only");
#endif
}

void run_block(const Call& call, const Block& block, ThreadScratch& scratch) {
  const SelectConfig& config = *call.config;
  const TndSequence& sequence = *block.sequence;
  const int64_t rows = block.row_end - block.row_begin;
  const int64_t first_position = sequence.first_position + (block.row_begin - sequence.row_begin);
  const int64_t last_visible = TndPlan::visible_keys(first_position + rows - 1, config.ratio);
  const int64_t topk = config.topk;
  const int64_t capacity = std::min(2 * topk, last_visible);
  const bool avx512 = call.kernel.avx512_pack || call.kernel.onednn;  // the avx512 ISA

  scratch.candidates.reserve(static_cast<std::size_t>(rows * capacity));  // exactly: no doubling
  scratch.candidates.resize(static_cast<std::size_t>(rows * capacity));
  scratch.counts.assign(static_cast<std::size_t>(rows), 0);
  scratch.thresholds.assign(static_cast<std::size_t>(rows), 0);
  const void* query = prepare_query(call, block.row_begin, block.row_end, scratch);
  const int64_t q_row_elems = config.heads * call.depth;  // floats or uint32 pairs
  const int64_t tile_panels = kTileKeys / sd::kPanelKeys;
  void* tile = scratch.keys.get(static_cast<std::size_t>(tile_panels * call.panel_elems) *
                                (call.kernel.bf16 ? 2 : 4));
  auto* scores = static_cast<float*>(scratch.scores.get(kTileKeys * sizeof(float)));
  const float* weights = nullptr;
  if (call.weights.dtype == DType::kFloat32) {
    weights = static_cast<const float*>(call.weights.data) + block.row_begin * config.heads;
  } else {
    scratch.weights.resize(static_cast<std::size_t>(rows * config.heads));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t h = 0; h < config.heads; ++h) {
        scratch.weights[static_cast<std::size_t>(r * config.heads + h)] =
            sd::element(call.weights, block.row_begin + r, h);
      }
    }
    weights = scratch.weights.data();
  }

  for (int64_t t0 = 0; t0 < last_visible; t0 += kTileKeys) {
    const int64_t tile_keys = std::min(kTileKeys, last_visible - t0);
    if (call.kernel.onednn) {
      score_tile_onednn(call, sequence.key_begin + t0, tile_keys, rows, query, weights, scratch);
    } else {
      pack_tile(call, sequence.key_begin + t0, tile_keys, tile);
    }
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t visible = TndPlan::visible_keys(first_position + r, config.ratio);
      if (visible <= t0) continue;  // this row sees nothing in the tile
      const int64_t count = std::min(tile_keys, visible - t0);
      if (call.kernel.onednn) {
        offer(static_cast<const float*>(scratch.block_scores.get(0)) + r * kTileKeys, count,
              sequence.key_begin + t0, r, capacity, topk, avx512, scratch);
        continue;
      }
      sd::ScoreRowArgs args;
      args.q_pack =
          call.kernel.bf16
              ? static_cast<const void*>(static_cast<const uint32_t*>(query) + r * q_row_elems)
              : static_cast<const void*>(static_cast<const float*>(query) + r * q_row_elems);
      args.weights = weights + r * config.heads;
      args.key_pack = tile;
      args.panels = (count + sd::kPanelKeys - 1) / sd::kPanelKeys;
      args.heads = config.heads;
      args.head_dim = config.head_dim;
      args.scores = scores;
      call.kernel.score_row(args);
      offer(scores, count, sequence.key_begin + t0, r, capacity, topk, avx512, scratch);
    }
  }

  for (int64_t r = 0; r < rows; ++r) {
    uint64_t* buffer = scratch.candidates.data() + r * capacity;
    int64_t held = scratch.counts[static_cast<std::size_t>(r)];
    if (held > topk) {
      sd::keep_largest(buffer, held, topk, scratch.top);
      held = topk;
    }
    int32_t* out = call.out.data() + (block.row_begin + r) * topk;
    sd::write_keys_in_order(buffer, held, sequence.key_begin, last_visible, out, scratch.top);
    std::fill(out + held, out + topk, -1);
  }
}

// Runs the blocks of `plan`'s rows inside [row_lo, row_hi), largest first (so the dynamic
// schedule ends with small blocks). Order never affects results: blocks write disjoint rows.
void run_rows(const Call& call, const TndPlan& plan, int64_t row_lo, int64_t row_hi,
              std::vector<ThreadScratch>& scratch, std::vector<Block>& blocks) {
  const SelectConfig& config = *call.config;
  blocks.clear();
  for (const TndSequence& sequence : plan.sequences()) {
    const int64_t begin = std::max(sequence.row_begin, row_lo);
    const int64_t stop = std::min(sequence.row_end, row_hi);
    const int64_t block_rows = call.kernel.onednn ? kOnednnBlockRows : kBlockRows;
    for (int64_t row = begin; row < stop; row += block_rows) {
      const int64_t end = std::min(row + block_rows, stop);
      const int64_t last = sequence.first_position + (end - 1 - sequence.row_begin);
      blocks.push_back(
          {&sequence, row, end, (end - row) * TndPlan::visible_keys(last, config.ratio)});
    }
  }
  if (blocks.empty()) return;
  std::stable_sort(blocks.begin(), blocks.end(),
                   [](const Block& a, const Block& b) { return a.cost > b.cost; });
  const int threads = static_cast<int>(
      std::min<int64_t>(static_cast<int64_t>(scratch.size()), static_cast<int64_t>(blocks.size())));
  // oneDNN (the bf16 path) runs single-threaded inside each worker (parallel_blocks.hpp).
  kernel_detail::parallel_blocks(static_cast<int64_t>(blocks.size()), threads, "Indexer selection",
                                 [&](int64_t i, int thread) {
                                   run_block(call, blocks[static_cast<std::size_t>(i)],
                                             scratch[static_cast<std::size_t>(thread)]);
                                 });
}

Call make_call(MatrixView q, MatrixView weights, MatrixView keys, const SelectConfig& config,
               std::span<int32_t> out) {
  Call call{q, weights, keys, &config, resolve_kernel(config.isa, keys.dtype), 0, 0, false, out};
  call.depth = call.kernel.bf16 ? (config.head_dim + 1) / 2 : config.head_dim;
  call.panel_elems = call.depth * sd::kPanelKeys * (call.kernel.bf16 ? 2 : 1);
  call.q_in_place =
      !call.kernel.bf16 && q.dtype == DType::kFloat32 && keys.dtype == DType::kFloat32;
  call.q_pairs_in_place =
      call.kernel.onednn && q.dtype == DType::kBFloat16 && config.head_dim % 2 == 0;
  return call;
}

// Whether any row of [row_lo, row_hi) sees a key.
bool selects_in(const TndPlan& plan, int64_t row_lo, int64_t row_hi) {
  return std::any_of(plan.sequences().begin(), plan.sequences().end(), [&](const TndSequence& s) {
    return s.row_begin < row_hi && s.row_end > row_lo;
  });
}

// Rows the blocks of `plan` cover (the rest of the call's rows stay -1).
int64_t covered_rows_end(const TndPlan& plan) {
  int64_t end = 0;
  for (const TndSequence& sequence : plan.sequences()) end = std::max(end, sequence.row_end);
  return end;
}

}  // namespace

void select_topk(MatrixView q, MatrixView weights, MatrixView keys,
                 std::span<const Segment> segments, const SelectConfig& config,
                 std::span<int32_t> out) {
  const auto plan = sd::validate_select(q, weights, keys, segments, config, out);
  const Call call = make_call(q, weights, keys, config, out);  // may refuse SPARSECP_SELECT_GEMM
  std::fill(out.begin(), out.end(), -1);
  if (!plan) return;
  std::vector<ThreadScratch> scratch(static_cast<std::size_t>(resolve_threads(config.threads)));
  std::vector<Block> blocks;
  run_rows(call, *plan, 0, covered_rows_end(*plan), scratch, blocks);
}

// --- projection --------------------------------------------------------------------------

// 16 MiB: below glibc's largest mmap threshold (32 MiB), so after a call the buffer is
// reused from the heap instead of mapped and faulted in afresh; and few enough chunks that
// the switches between OpenBLAS's threads (the projection) and OpenMP's (the selection)
// stay rare. On the DeepSeek-V4 example's worker calls (python/benchmarks/worker_calls.py;
// 32 x 64 channels, 4,096 rows, q_rank 64 and 1,024), against one buffer of all rows, 16 MiB
// chunks took 0.79-0.98 of the time on 2 threads and 0.81-0.90 on one; 4 MiB chunks up to
// 1.25 on 2 threads.
constexpr int64_t kProjectionChunkBytes = int64_t{16} << 20;

int64_t sd::projection_chunk_rows(const SelectConfig& config, int threads) {
  const int64_t row_bytes = config.heads * config.head_dim * 4;
  const int64_t fit = std::max<int64_t>(1, kProjectionChunkBytes / row_bytes);
  return std::max<int64_t>(fit, 4 * kBlockRows * std::max(threads, 1));
}

namespace {
std::vector<float> widen(MatrixView view) {
  std::vector<float> values;
  try {
    values.resize(static_cast<std::size_t>(view.rows * view.cols));
  } catch (const std::bad_alloc&) {
    SPARSECP_FAIL_AS(ErrorKind::kResource, "Indexer projection could not allocate ",
                     static_cast<double>(view.rows) * static_cast<double>(view.cols) * 4,
                     " bytes to widen bf16 operands");
  }
  const auto* bits = static_cast<const uint16_t*>(view.data);
  const auto count = static_cast<int64_t>(values.size());
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) values[static_cast<std::size_t>(i)] = bf16_to_float(bits[i]);
  return values;
}
}  // namespace

ProjectionWeights::ProjectionWeights(MatrixView wq_b, WeightLayout layout)
    : original_(wq_b), layout_(layout) {
  SPARSECP_CHECK(wq_b.rows >= 0 && wq_b.cols >= 0, "Indexer wq_b shape [", wq_b.rows, ", ",
                 wq_b.cols, "] has a negative extent");
  SPARSECP_CHECK(wq_b.rows == 0 || wq_b.cols <= INT64_MAX / wq_b.rows, "Indexer wq_b shape [",
                 wq_b.rows, ", ", wq_b.cols, "] overflows 64 bits");
  SPARSECP_CHECK(wq_b.rows * wq_b.cols == 0 || wq_b.data != nullptr, "Indexer wq_b has no data");
  // The distro's OpenBLAS is built without its bf16 GEMM, so bf16 weights are widened
  // (exactly) to fp32 once here and multiplied by sgemm: the same products, fp32
  // accumulation.
  if (wq_b.dtype == DType::kBFloat16) widened_ = widen(wq_b);
}

const float* ProjectionWeights::fp32_data() const {
  return original_.dtype == DType::kBFloat16 ? widened_.data()
                                             : static_cast<const float*>(original_.data);
}

void project_index_query(MatrixView qr, MatrixView wq_b, MatrixView cos, MatrixView sin,
                         const SelectConfig& config, std::span<float> q_out, WeightLayout layout) {
  project_index_query(qr, ProjectionWeights(wq_b, layout), cos, sin, config, q_out);
}

void project_index_query(MatrixView qr, const ProjectionWeights& weights, MatrixView cos,
                         MatrixView sin, const SelectConfig& config, std::span<float> q_out) {
  const MatrixView wq_b = weights.view();
  const WeightLayout layout = weights.layout();
  const int64_t width = sd::validate_projection(qr, wq_b, cos, sin, config, q_out, layout);
  const int64_t rows = qr.rows;
  const int64_t rank = qr.cols;
  if (rows == 0 || width == 0) return;
  SPARSECP_CHECK(rows <= INT_MAX && width <= INT_MAX && rank <= INT_MAX, "Indexer projection [",
                 rows, ", ", rank, "] x [", rank, ", ", width, "] exceeds the BLAS's int sizes");
  const bool bf16 = qr.dtype == DType::kBFloat16;
  if (rank == 0) {
    std::fill(q_out.begin(), q_out.end(), 0.0f);
  } else {
    const CBLAS_TRANSPOSE trans = layout == WeightLayout::kInOut ? CblasNoTrans : CblasTrans;
    const int ldb = static_cast<int>(layout == WeightLayout::kInOut ? width : rank);
    // bf16 qr is widened per call (rows x q_rank fp32); Wq_b was widened once.
    std::vector<float> widened_qr;
    const float* a = static_cast<const float*>(qr.data);
    if (bf16) {
      widened_qr = widen(qr);
      a = widened_qr.data();
    }
    const float* b = weights.fp32_data();
    // A one-thread call keeps the BLAS on this thread too: Debian's pthread OpenBLAS would fan
    // the product out over its own pool, whose idle threads then spin (sched_yield) on the
    // cores that the caller's other ranks or threads need.
    std::optional<BlasSingleThreaded> one_thread_blas;
    if (resolve_threads(config.threads) == 1) one_thread_blas.emplace();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, trans, static_cast<int>(rows), static_cast<int>(width),
                static_cast<int>(rank), 1.0f, a, static_cast<int>(rank), b, ldb, 0.0f, q_out.data(),
                static_cast<int>(width));
  }
  const int64_t first = config.head_dim - config.rope_dim;
  const int64_t pairs = config.rope_dim / 2;
  const int threads = resolve_threads(config.threads);
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t t = 0; t < rows; ++t) {
    float* row = q_out.data() + t * width;
    if (bf16) {
      for (int64_t c = 0; c < width; ++c) row[c] = round_to_bf16(row[c]);
    }
    for (int64_t h = 0; h < config.heads; ++h) {
      float* head = row + h * config.head_dim + first;
      for (int64_t i = 0; i < pairs; ++i) {
        const float c = sd::element(cos, t, i);
        const float s = sd::element(sin, t, i);
        const float x0 = head[2 * i];
        const float x1 = head[2 * i + 1];
        const float y0 = x0 * c - x1 * s;
        const float y1 = x1 * c + x0 * s;
        head[2 * i] = bf16 ? round_to_bf16(y0) : y0;
        head[2 * i + 1] = bf16 ? round_to_bf16(y1) : y1;
      }
    }
  }
}

void select_worker_rows(MatrixView qr, MatrixView weights, MatrixView cos, MatrixView sin,
                        MatrixView wq_b, MatrixView keys, std::span<const Segment> segments,
                        const SelectConfig& config, std::span<int32_t> out, WeightLayout layout) {
  select_worker_rows(qr, weights, cos, sin, ProjectionWeights(wq_b, layout), keys, segments, config,
                     out);
}

void select_worker_rows(MatrixView qr, MatrixView weights, MatrixView cos, MatrixView sin,
                        const ProjectionWeights& wq_b, MatrixView keys,
                        std::span<const Segment> segments, const SelectConfig& config,
                        std::span<int32_t> out) {
  validate_select_config(config);
  SPARSECP_CHECK(qr.rows >= 0 && qr.rows <= INT64_MAX / 4 / (config.heads * config.head_dim),
                 "Indexer query residual rows ", qr.rows, " out of range");
  const int64_t width = config.heads * config.head_dim;
  const int threads = resolve_threads(config.threads);
  // Index Q is projected a chunk of rows at a time into one buffer, each chunk selected
  // before the next is projected: memory bounded by the config and thread count, not the
  // call's rows. One buffer for all the call's rows (32 MiB at 4,096 rows of 32 x 64
  // channels) was mapped fresh and zeroed by every call, about 7% of a call's time on one
  // thread and more than its segments called one by one (smaller buffers, reused): a call's
  // time was not the sum of its rows' costs that the planners balance.
  const int64_t chunk_rows = sd::projection_chunk_rows(config, threads);
  const int64_t buffer_rows = std::min(std::max<int64_t>(qr.rows, 0), chunk_rows);
  std::unique_ptr<float[]> buffer;
  try {
    buffer.reset(new float[static_cast<std::size_t>(std::max<int64_t>(buffer_rows * width, 1))]);
  } catch (const std::bad_alloc&) {
    SPARSECP_FAIL_AS(ErrorKind::kResource, "Indexer selection could not allocate ",
                     static_cast<double>(buffer_rows * width) * 4,
                     " bytes for the projected Index Q");
  }
  // Every check of both steps, on the whole call, before any work (the query view has
  // the call's shape for the checks; only its first chunk's rows exist and none is read).
  (void)sd::validate_projection_inputs(qr, wq_b.view(), cos, sin, config, wq_b.layout());
  const auto plan = sd::validate_select(MatrixView::f32(buffer.get(), qr.rows, width), weights,
                                        keys, segments, config, out);
  (void)resolve_kernel(config.isa, keys.dtype);  // refuses a bad SPARSECP_SELECT_GEMM first
  std::fill(out.begin(), out.end(), -1);
  if (!plan) return;
  std::vector<ThreadScratch> scratch(static_cast<std::size_t>(threads));
  std::vector<Block> blocks;
  const int64_t covered = covered_rows_end(*plan);
  for (int64_t first = 0; first < covered; first += chunk_rows) {
    const int64_t rows = std::min(chunk_rows, covered - first);
    if (!selects_in(*plan, first, first + rows)) continue;
    const std::span<float> q(buffer.get(), static_cast<std::size_t>(rows * width));
    project_index_query(sd::row_slice(qr, first, rows), wq_b, sd::row_slice(cos, first, rows),
                        sd::row_slice(sin, first, rows), config, q);
    Call call = make_call(MatrixView::f32(q.data(), rows, width), weights, keys, config, out);
    call.q_first = first;
    run_rows(call, *plan, first, first + rows, scratch, blocks);
  }
}

const char* select_bf16_products(KernelIsa isa) {
  const Kernel kernel = resolve_kernel(isa, DType::kBFloat16);
  if (kernel.onednn) return attention_detail::gemm_library_name(true);
  return kernel.bf16 ? "vdpbf16ps" : "widened";
}

std::size_t select_scratch_bytes(const SelectConfig& config, DType key_dtype, int threads) {
  validate_select_config(config);
  const Kernel kernel = resolve_kernel(config.isa, key_dtype);
  const int64_t depth = kernel.bf16 ? (config.head_dim + 1) / 2 : config.head_dim;
  const int64_t tile = kTileKeys * depth * 4;  // fp32 floats or bf16 pairs
  const int64_t block_rows = kernel.onednn ? kOnednnBlockRows : kBlockRows;
  const int64_t query = block_rows * config.heads * config.head_dim * 4;  // worst case
  const int64_t scores = kTileKeys * 4 * 2;  // one row's scores, and offer's survivors
  // Per row: the candidate buffer (2 top-k), its count and threshold, widened weights; per
  // block, the ties of a radix pass (at most one row's buffer) and the fixed histogram.
  const int64_t candidates = block_rows * (2 * config.topk * 8 + 16 + config.heads * 4) +
                             2 * config.topk * 8 + sd::kCandidateScratchBytes;
  // The oneDNN path's key rows, logits and reduced scores of a tile.
  const int64_t onednn = kernel.onednn ? kTileKeys * config.head_dim * 2 +
                                             block_rows * config.heads * kTileKeys * 4 +
                                             block_rows * kTileKeys * 4
                                       : 0;
  return static_cast<std::size_t>(resolve_threads(threads)) *
         static_cast<std::size_t>(tile + query + scores + candidates + onednn);
}

double select_score_flops(std::span<const Segment> segments, const SelectConfig& config) {
  validate_select_config(config);
  const auto plan = csa_tnd_plan(segments, config.ratio);
  if (!plan) return 0.0;
  double pairs = 0.0;
  for (const TndSequence& s : plan->sequences()) {
    for (int64_t p = s.first_position; p < s.first_position + (s.row_end - s.row_begin); ++p) {
      pairs += static_cast<double>(TndPlan::visible_keys(p, config.ratio));
    }
  }
  return pairs * 2.0 * static_cast<double>(config.heads * config.head_dim);
}

}  // namespace sparsecp
