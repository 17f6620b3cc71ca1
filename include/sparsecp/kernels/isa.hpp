// sparsecp: which SIMD code the kernels run — one choice for the selection (select.hpp)
// and the indexer KL loss (indexer_kl.hpp) alike, forced by SPARSECP_ISA or an option.
#pragma once

#include <string_view>

namespace sparsecp {

// Which SIMD kernels run, for the selection and the indexer KL loss alike. kAuto is
// the environment variable SPARSECP_ISA (portable, avx2, avx512 or auto) where it is
// set and not empty, else the best the CPU supports (AVX-512, with AVX512_BF16 dot
// products for bf16 where the CPU has them > AVX2+FMA > portable). Forcing an ISA the
// CPU lacks, by option or by SPARSECP_ISA, throws Error naming it; so does an unknown
// SPARSECP_ISA value. Results may differ between ISAs in the last bits of real-valued
// results (different but fixed summation orders); selections never differ on exact
// (small-integer) inputs.
enum class KernelIsa { kAuto, kPortable, kAvx2, kAvx512 };

// Name of an ISA: "auto", "portable", "avx2", "avx512".
const char* kernel_isa_name(KernelIsa isa);

// The ISA named `name` ("auto", "portable", "avx2", "avx512"); throws Error naming
// `what` (e.g. "--isa", "SPARSECP_ISA") and the value otherwise.
KernelIsa parse_kernel_isa(std::string_view name, std::string_view what);

// The best ISA this CPU supports (ignores SPARSECP_ISA), and whether it can run `isa`.
KernelIsa best_kernel_isa();
bool kernel_isa_supported(KernelIsa isa);

// What a call with `isa` runs: kAuto resolved (SPARSECP_ISA, else best_kernel_isa());
// throws Error if the result is not supported by this CPU. Never returns kAuto.
KernelIsa resolve_kernel_isa(KernelIsa isa);

// Whether the avx512 kernels multiply bf16 pairs with AVX512_BF16 (VDPBF16PS) on this CPU;
// otherwise bf16 inputs are widened to fp32 exactly (the avx2 and portable kernels always
// widen: bf16 is a storage format there).
bool kernel_isa_bf16_dot_products();

}  // namespace sparsecp
