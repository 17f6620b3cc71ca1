// sparsecp: bfloat16 <-> float conversions.
//
// A bf16 value is the upper 16 bits of an IEEE fp32 value, stored as uint16_t.
// Widening is exact. Narrowing rounds to nearest, ties to even (as PyTorch's
// `.to(torch.bfloat16)` and AVX512_BF16's VCVTNEPS2BF16 do); NaN stays NaN (quiet).
#pragma once

#include <bit>
#include <cstdint>

namespace sparsecp {

inline float bf16_to_float(uint16_t value) {
  return std::bit_cast<float>(static_cast<uint32_t>(value) << 16);
}

inline uint16_t float_to_bf16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep sign, force a quiet payload
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  }
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

// Rounds an fp32 value to the nearest bf16 value, returned as fp32.
inline float round_to_bf16(float value) { return bf16_to_float(float_to_bf16(value)); }

}  // namespace sparsecp
