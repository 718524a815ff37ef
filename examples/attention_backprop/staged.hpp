// Multi-head attention recomputed in float64 as a chain of stages built from tapegrad's public
// ops, following the steps of ops/multihead_attention.cpp. Any named intermediate can be
// replaced by a given tensor, so that it becomes a leaf: the tape then gives dL/dX for it, and
// central differences of L as a function of X alone estimate the same quantity independently.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <tapegrad/tapegrad.hpp>

namespace attention_backprop {

using tapegrad::Shape;
using tapegrad::Tensor;

// The named tensors of the forward, in the order it computes them.
enum class Var {
  query, context, bias, w_q, b_q, w_k, b_k, w_v, b_v, w_o, b_o,  // given
  query_sel, context_sel,  // step 0: rows of inactive queries / unused keys set to 0
  q_h, k_h, v_h,           // steps 1-2: projected and split into heads, [B, H, L, D or Dv]
  raw,                     // q k^T per head, [B, H, Q, K]
  S,                       // raw / sqrt(D) + bias
  A,                       // masked_softmax(S, allowed)
  O_h,                     // A v, [B, H, Q, Dv]
  merged,                  // heads concatenated, [B, Q, H*Dv]
  y,                       // merged w_o + b_o
  out,                     // where(active, y, 0)
  count
};
constexpr std::size_t kVars = static_cast<std::size_t>(Var::count);
using Vars = std::array<Tensor, kVars>;
inline Tensor& at(Vars& v, Var x) { return v[static_cast<std::size_t>(x)]; }
inline const Tensor& at(const Vars& v, Var x) { return v[static_cast<std::size_t>(x)]; }

struct Sizes {
  std::int64_t b, q, k, h, d, dv, cq, cctx, cout;
};

// Everything the forward needs besides the overridden tensor. Tensors are float64.
struct Problem {
  Sizes n{};
  Vars given;          // the given entries of Var (query ... b_o); bias may be undefined
  Tensor R;            // [B, Q, Cout]: L = sum(out * R)
  Tensor key_mask, query_mask, attention_mask;  // as passed to multihead_attention (optional)
  bool causal = false;
  std::int64_t causal_offset = 0;
  // Derived from the masks, as ops/multihead_attention.cpp's allowed_pairs does.
  Tensor allowed;                  // bool [B, H, Q, K]
  Tensor active, used;             // bool [B, Q, 1] and [B, K, 1]
  std::vector<bool> allowed_host;  // [B, H, Q, K]
  std::vector<bool> active_host;   // [B, Q]
  std::vector<bool> used_host;     // [B, K]
};

// Fills allowed, active and used from the masks.
void derive_masks(Problem& p);

// The forward with `replaced` (if not Var::count) taken from `value` instead of computed.
Vars forward(const Problem& p, Var replaced = Var::count, const Tensor& value = Tensor());
Tensor loss(const Problem& p, const Vars& v);  // sum(out * R), rank 0

// dL/dX by the tape, with X a fresh leaf holding base's value of X.
Tensor tape_gradient(const Problem& p, const Vars& base, Var x);
// dL/dX by central differences (L(X + h e) - L(X - h e)) / 2h, one element at a time, in float64.
Tensor numeric_gradient(const Problem& p, const Vars& base, Var x, double h);

// [B, L, H*W] -> [B, H, L, W], and back.
Tensor split_heads(const Tensor& x, std::int64_t heads);
Tensor merge_heads(const Tensor& x);

}  // namespace attention_backprop
