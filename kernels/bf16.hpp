// Internal: float32 to bfloat16, the one rounding every bfloat16 path uses.
#pragma once

#include <bit>
#include <cstdint>

namespace tapegrad::detail {

// The bfloat16 bits of f, rounded to nearest even; a NaN stays a (quiet) NaN, an infinity one.
// Saturate: a finite f past bfloat16's largest finite (3.39e38) becomes that value rather than an
// infinity (the attention products' rule: a finite operand stays finite). Selects, no branches,
// so that the loops over it vectorise.
template <bool Saturate> inline std::uint16_t to_bf16(float f) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f), mag = u & 0x7fffffffu;
  std::uint32_t out = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  if constexpr (Saturate) out = mag < 0x7f800000u && (out & 0x7fffu) == 0x7f80u ? ((u >> 16) & 0x8000u) | 0x7f7fu : out;
  return static_cast<std::uint16_t>(mag > 0x7f800000u ? (u >> 16) | 0x40u : out);
}

}  // namespace tapegrad::detail
